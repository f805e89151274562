"""The kernel object ``ProviderSpec.load`` names: the op's contract mapped onto AITER's FlyDSL entry.

``aiter.ops.flydsl.flydsl_fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends,
clean_logits=True, stream=None, variant=None)`` takes the contract's arguments almost as they are
(same signature in every ROCm/aiter version that has it). What this module adds:

- kv is a tuple here; AITER takes k and its per-token scale [N] separately (k_scale may be [N, 1]).
- q and k go in with the dtypes they came with, each pair in :data:`pairs.DECLARED`: on gfx942 AITER
  converts every e4m3fn operand itself (0x80 patched in registers, ``kv_scales`` doubled once per
  e4m3fn operand), so converting here as well would convert twice; gfx950 takes e4m3fn only.
- the stream is passed explicitly: AITER resolves ``stream=None`` with ``torch.cuda.current_stream()``
  *before* entering ``torch.cuda.device(Q.device.index)`` (v0.1.20.post1
  ``kernels/mqa_logits/fp8_mqa_logits.py`` lines 558-561; v0.1.18 lines 669-672), i.e. the current
  stream of the *current* device, which is not q's device when the caller's current device differs.
- q, k, k_scale and weights are read by the kernel as flat buffers with no strides; AITER's released
  entries do not make them contiguous, so this does (a no-op for contiguous tensors).
- windows are int32 and clamped to [0, N]: every AITER version clamps too, this keeps any build whose
  fused -inf fill trusts an in-range ``cu_starts`` from writing past a row.
- gfx950's variants tile heads by 32; H=16 is zero-padded (zero q rows and weights add nothing).
- AITER allocates rows 256-aligned and returns a view; anything wider than [M, N] is sliced.
- M=0 or N=0 returns at once: AITER would index ``kv_scales[-1]`` for N=0, and HIP rejects an empty
  grid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mqa_core.arch import arch_of_device as _arch_of_device

from . import pairs, probe

#: What the provider declares, for the refusal on another arch.
_CLAIM = f"AITER's FlyDSL MQA-logits kernel runs on {' and '.join(probe.ARCHS)} GPUs"

#: gfx950's auto-selected FlyDSL variants use the 32x32x64 atom: heads in tiles of 32.
GFX950_HEAD_TILE = 32

_TORCH_PAIRS = {arch: frozenset((getattr(torch, q), getattr(torch, k)) for q, k in declared)
                for arch, declared in pairs.DECLARED.items()}


def _pad_heads(q: torch.Tensor, weights: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, h, d = q.shape
    full = -(-h // tile) * tile
    # Through uint8: zero-filling and copying fp8 is not implemented for every dtype/device pair.
    qp = torch.zeros((m, full, d), dtype=torch.uint8, device=q.device)
    qp[:, :h].copy_(q.view(torch.uint8))
    wp = torch.zeros((m, full), dtype=torch.float32, device=weights.device)
    wp[:, :h].copy_(weights)
    return qp.view(q.dtype), wp


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def call_flydsl(fn: probe.KernelFn, arch: str, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                clean_logits: bool = True, stream: Any = None) -> torch.Tensor:
    """Run AITER's entry ``fn`` for ``arch`` on already-checked tensors; the contract's [M, N].

    ``stream`` is handed to AITER as it is; :class:`FlyDSLKernel` passes q's device's current stream.
    """
    k, k_scale = kv
    if (q.dtype, k.dtype) not in _TORCH_PAIRS.get(arch, ()):
        raise TypeError("flydsl: " + (pairs.refusal(arch, _name(q.dtype), _name(k.dtype)) or ""))
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
    logits = fn(q, k, k_scale, weights, ks, ke, clean_logits=bool(clean_logits), stream=stream)
    if tuple(logits.shape) != (m, n):
        logits = logits[:m, :n]
    return logits


def _current_stream(device: torch.device) -> Any:
    return torch.cuda.current_stream(device)


class FlyDSLKernel:
    """AITER's FlyDSL fp8 MQA-logits kernel behind the ``fp8_mqa_logits`` contract.

    :param arch_of_device: how the tensors' device maps to an arch; the default asks the device.
    :param stream_of: the stream to launch on for a device; the default is its current stream.
        Tests substitute both to run the argument handling against a stand-in AITER on the CPU.
    """

    def __init__(self, arch_of_device: Callable[[Any], str] | None = None,
                 stream_of: Callable[[torch.device], Any] | None = None) -> None:
        self._arch_of_device = arch_of_device or _arch_of_device
        self._stream_of = stream_of or _current_stream

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                       weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                       *, clean_logits: bool = True) -> torch.Tensor:
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in the window."""
        arch = self._arch_of_device(q.device)
        fn = probe.ready("flydsl", arch, q.device, _CLAIM, probe.ARCHS, probe.check, probe.load_entry)
        return call_flydsl(fn, arch, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke,
                           clean_logits=clean_logits, stream=self._stream_of(q.device))


#: What ``load="mqa_provider_flydsl.kernel:KERNEL"`` imports.
KERNEL = FlyDSLKernel()
