"""STAND-IN for AMD AITER's ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py``, for CPU tests only.

The tests install this file as ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py`` of a stand-in
``amd-aiter`` distribution. It has the real entry's signature and argument conventions (ROCm/aiter,
read from its source) and computes the kernel's documented arithmetic in torch, so the provider's
argument handling is checked numerically without ROCm:

- ``Q`` [M, H, D] and ``KV`` [N, D] fp8; ``kv_scales`` reshaped to [N]; ``weights`` [M, H] float32;
  ``cu_starts``/``cu_ends`` [M] int32, window ``[max(start, 0), min(end, N))``;
- gfx942 takes e4m3fn bytes as e4m3fnuz (0x80 patched to +0) and doubles ``kv_scales`` per fn
  operand; gfx950 requires e4m3fn; H must be a multiple of the MFMA tile (16 on gfx942, 32 on
  gfx950), D a multiple of its K step;
- the output is allocated with rows padded to 256 and returned as a ``[:, :N]`` view; cells the
  kernel does not write hold whatever was there (NaN here, to make them visible).

The arch the stand-in pretends to run on comes from ``MQA_TEST_AITER_GFX`` (default gfx942).
``CALLS`` records the arguments of each call so tests can check what the adapter passed.
"""

from __future__ import annotations

import os
from typing import Any

import torch

CALLS: list[dict[str, Any]] = []


def _gfx() -> str:
    return os.environ.get("MQA_TEST_AITER_GFX", "gfx942")


def _as_fnuz(x: torch.Tensor) -> torch.Tensor:
    """What gfx942's fp8 MFMA reads from e4m3fn bytes: the same bytes as e4m3fnuz, -0 patched."""
    raw = x.view(torch.uint8).clone()
    raw[raw == 0x80] = 0
    return raw.view(torch.float8_e4m3fnuz)


def flydsl_fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True,
                          stream=None, variant=None):
    seq_len, num_heads, head_size = Q.shape
    seq_len_kv = KV.shape[0]
    assert num_heads & (num_heads - 1) == 0, "num q. heads should be power of 2."
    assert head_size & (head_size - 1) == 0, "head size should be power of 2."
    fn, fnuz = torch.float8_e4m3fn, torch.float8_e4m3fnuz
    arch = _gfx()
    CALLS.append({"arch": arch, "q": (Q.dtype, tuple(Q.shape)), "kv": (KV.dtype, tuple(KV.shape)),
                  "kv_scales": (kv_scales.dtype, tuple(kv_scales.shape)),
                  "weights": (weights.dtype, tuple(weights.shape)),
                  "windows": (cu_starts.dtype, cu_ends.dtype), "clean_logits": clean_logits})
    # The kernel reads flat buffers of these types; a wrong one would be misread, not converted.
    assert kv_scales.dtype == torch.float32 and weights.dtype == torch.float32
    assert cu_starts.dtype == torch.int32 and cu_ends.dtype == torch.int32
    assert weights.is_contiguous() and cu_starts.is_contiguous() and cu_ends.is_contiguous()
    Q, KV = Q.contiguous(), KV.contiguous()
    kv_scales = kv_scales.reshape(seq_len_kv)
    weights = weights.reshape(seq_len, num_heads)
    if arch == "gfx950":
        assert Q.dtype == fn and KV.dtype == fn, "gfx950 fp8_mqa_logits requires native e4m3fn Q/KV"
        mfma_m, mfma_k = 32, 64
    else:
        assert Q.dtype in (fn, fnuz) and KV.dtype in (fn, fnuz), "Q/KV must be e4m3 fp8"
        mfma_m, mfma_k = 16, 32
    if num_heads % mfma_m:
        raise NotImplementedError(f"num_heads={num_heads} is not a multiple of MFMA_M={mfma_m} on {arch}")
    assert head_size % mfma_k == 0, f"head_size={head_size} must be a multiple of MFMA_K={mfma_k}"

    scale = kv_scales.to(torch.float32)
    if arch == "gfx942":
        if Q.dtype == fn:
            Q, scale = _as_fnuz(Q), scale * 2.0
        if KV.dtype == fn:
            KV, scale = _as_fnuz(KV), scale * 2.0

    # logits[m, n] = sum_h ReLU(<Q[m, h], K[n]> * kv_scale[n]) * weights[m, h], fp32 accumulation.
    dots = torch.einsum("mhd,nd->mhn", Q.to(torch.float32), KV.to(torch.float32))
    values = torch.einsum("mhn,mh->mn", dots.clamp_min(0), weights.to(torch.float32)) * scale[None, :]

    aligned = (seq_len_kv + 255) // 256 * 256
    logits = torch.full((seq_len, aligned), float("nan"), dtype=torch.float32, device=Q.device)
    logits = logits[:, :seq_len_kv]
    cols = torch.arange(seq_len_kv, device=Q.device)[None, :]
    start = cu_starts.reshape(seq_len).long().clamp(min=0)[:, None]
    end = cu_ends.reshape(seq_len).long().clamp(max=seq_len_kv)[:, None]
    inside = (cols >= start) & (cols < end)
    logits[inside] = values[inside]
    if clean_logits:
        logits[~inside] = float("-inf")
    return logits[:seq_len, :]
