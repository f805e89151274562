"""The kernel object ``ProviderSpec.load`` names: the op's contract mapped onto AITER's FlyDSL entry.

``aiter.ops.flydsl.flydsl_fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends,
clean_logits=True, stream=None, variant=None)`` takes the contract's arguments almost as they are
(ROCm/aiter ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py``). What this module adds:

- kv is a tuple here; AITER takes k and its per-token scale [N] separately (k_scale may be [N, 1]).
- e4m3fn goes in untouched: on gfx942 AITER passes the bytes to the FNUZ MFMA itself, patching -0
  and folding the exact 2x into kv_scales, so converting here as well would scale twice.
- windows are int32 and clamped to [0, N]; the kernel clamps too, this keeps every AITER version
  from indexing past a row.
- gfx950's variants tile heads by 32; H=16 is zero-padded (zero q rows and weights add nothing).
- AITER allocates rows 256-aligned and returns a view; anything wider than [M, N] is sliced.
- M=0 or N=0 returns at once: there is nothing to compute and HIP rejects an empty grid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import probe

#: gfx950's auto-selected FlyDSL variants use the 32x32x64 atom: heads in tiles of 32.
GFX950_HEAD_TILE = 32


def _pad_heads(q: torch.Tensor, weights: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, h, d = q.shape
    full = -(-h // tile) * tile
    # Through uint8: zero-filling and copying fp8 is not implemented for every dtype/device pair.
    qp = torch.zeros((m, full, d), dtype=torch.uint8, device=q.device)
    qp[:, :h].copy_(q.view(torch.uint8))
    wp = torch.zeros((m, full), dtype=torch.float32, device=weights.device)
    wp[:, :h].copy_(weights)
    return qp.view(q.dtype), wp


def call_flydsl(fn: probe.KernelFn, arch: str, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                clean_logits: bool = True) -> torch.Tensor:
    """Run AITER's entry ``fn`` for ``arch`` on already-checked tensors; the contract's [M, N]."""
    k, k_scale = kv
    m, h, _ = q.shape
    n = k.shape[0]
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=torch.float32, device=q.device)
    q, k = q.contiguous(), k.contiguous()
    k_scale = k_scale.reshape(n).to(torch.float32).contiguous()
    weights = weights.to(torch.float32).contiguous()
    ks = cu_seqlen_ks.to(torch.int32).clamp(0, n).contiguous()
    ke = cu_seqlen_ke.to(torch.int32).clamp(0, n).contiguous()
    if arch == "gfx950" and h % GFX950_HEAD_TILE:
        q, weights = _pad_heads(q, weights, GFX950_HEAD_TILE)
    logits = fn(q, k, k_scale, weights, ks, ke, clean_logits=bool(clean_logits))
    if tuple(logits.shape) != (m, n):
        logits = logits[:m, :n]
    return logits


def _arch_of_device(device: Any) -> str:
    from mqa_core.arch import arch_of_device

    return arch_of_device(device)


class FlyDSLKernel:
    """AITER's FlyDSL fp8 MQA-logits kernel behind the ``fp8_mqa_logits`` contract.

    :param arch_of_device: how the tensors' device maps to an arch; the default asks the device.
        Tests substitute it to run the argument handling against a stand-in AITER on the CPU.
    """

    def __init__(self, arch_of_device: Callable[[Any], str] | None = None) -> None:
        self._arch_of_device = arch_of_device or _arch_of_device

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                       weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                       *, clean_logits: bool = True) -> torch.Tensor:
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in the window."""
        arch = self._arch_of_device(q.device)
        if arch not in probe.ARCHS:
            raise RuntimeError(f"flydsl: AITER's FlyDSL MQA-logits kernel runs on "
                               f"{' and '.join(probe.ARCHS)} GPUs; the tensors are on {q.device} ({arch})")
        reason = probe.check(arch)
        if reason:
            raise RuntimeError(f"flydsl cannot run on {arch}: {reason}")
        fn, why = probe.load_entry()
        if fn is None:  # unreachable after a passing check, kept for a clear message
            raise RuntimeError(f"flydsl cannot run on {arch}: {why}")
        return call_flydsl(fn, arch, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke,
                           clean_logits=clean_logits)


#: What ``load="mqa_provider_flydsl.kernel:KERNEL"`` imports.
KERNEL = FlyDSLKernel()
