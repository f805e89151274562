"""The methods a provider's kernel object (``ProviderSpec.load``) implements, one per op.

The core validates every argument before calling these, so an implementation may assume the
contract's dtypes, shapes and devices (see DESIGN.md); it must still accept ``k_scale`` as [N] or
[N, 1] and clamp windows itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class MqaLogitsKernel(Protocol):
    def fp8_mqa_logits(self, q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]",
                       weights: "torch.Tensor", cu_seqlen_ks: "torch.Tensor",
                       cu_seqlen_ke: "torch.Tensor", *, clean_logits: bool = True) -> "torch.Tensor":
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in the window."""
        ...


class PagedMqaLogitsKernel(Protocol):
    def fp8_paged_mqa_logits(self, q: "torch.Tensor", kv_cache: "torch.Tensor",
                             weights: "torch.Tensor", context_lens: "torch.Tensor",
                             block_tables: "torch.Tensor", max_context_len: int, *,
                             clean_logits: bool = True) -> "torch.Tensor":
        """The decode variant over DeepGEMM's paged fp8 cache layout."""
        ...
