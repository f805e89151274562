"""The kernel objects behind the ``gluon`` and ``triton`` specs: pick a kernel per device, then launch.

Loading this module is cheap (no triton import); the kernel modules load on the first call. e4m3fn
inputs are converted exactly for gfx942 inside the Triton launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MqaKernels:
    #: Try the Gluon sm_90 kernel first (the ``gluon`` provider); False: always Triton (``triton``).
    use_gluon: bool

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                       clean_logits: bool = True) -> torch.Tensor:
        k, k_scale = kv
        k_scale = k_scale.reshape(-1)
        if self.use_gluon and q.is_cuda:
            from .ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon, gluon_supported

            if gluon_supported(q.device) is None:
                return fp8_mqa_logits_gluon(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
        from .ops.mqa_logits_triton import fp8_mqa_logits_triton

        return fp8_mqa_logits_triton(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)

    def fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int, *,
                             clean_logits: bool = True) -> torch.Tensor:
        # Decode is memory-bound: the Triton kernel serves both providers.
        from .ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton

        return fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                           clean_logits)


GLUON = MqaKernels(use_gluon=True)
TRITON = MqaKernels(use_gluon=False)
