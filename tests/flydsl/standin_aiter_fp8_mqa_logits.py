"""STAND-IN for the module of AMD AITER that defines ``flydsl_fp8_mqa_logits``, for CPU tests only.

AITER cannot import without ROCm, so the tests install this file inside a stand-in ``amd-aiter``
distribution (``conftest.py``), in one of two layouts read from ROCm/aiter's source:

- released (v0.1.18 to v0.1.20.post1): ``aiter/ops/flydsl/kernels/mqa_logits/fp8_mqa_logits.py``,
  gfx942-only. conftest sets ``CDNA4`` to None there, so this source, like theirs, never names the
  gfx950 arch in code.
- later (with the gfx950 path of ROCm/aiter#4538): ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py``.

It has the real entry's signature and behaves like it for what the adapter depends on, computing
the kernel's arithmetic in torch so the provider is checked numerically:

- dtypes: gfx942 takes each of Q and KV as e4m3fnuz or e4m3fn and reads the bytes as e4m3fnuz, with
  each e4m3fn operand's 0x80 patched to +0 and ``kv_scales`` doubled once per e4m3fn operand. The
  gfx950 path asserts e4m3fn for both; a released build on gfx950 converts nothing and its OCP MFMA
  reads whatever bytes it is given as e4m3fn (fnuz inputs come out wrong, silently, as on hardware).
- limits: H and D powers of two (asserted); H a multiple of the MFMA rows and D of its K step
  (16x16x32 on gfx942; every auto-selected gfx950 variant is 32x32x64 and refuses other H with
  NotImplementedError, as ``_resolve_variant`` does).
- the kernel reads Q, KV, kv_scales, weights and the windows as flat buffers: a strided operand
  would be misread, so here it fails. The later entry makes Q and KV contiguous itself.
- ``stream=None`` resolves to the current stream of the *current* device, not Q's (recorded as such).
- the output rows are 256-aligned and returned as a ``[:M, :N]`` view; cells the kernel does not
  write hold NaN here, to make them visible.

The arch it pretends to run on comes from ``MQA_TEST_AITER_GFX`` (default gfx942). ``CALLS`` records
each call's arguments so tests can check what the adapter passed.
"""

from __future__ import annotations

import os
from typing import Any

import flydsl  # noqa: F401  (the real module imports the flydsl compiler at the top, so does this)
import torch

#: The arch of the CDNA4 path; None in the released layout.
CDNA4 = "gfx950"
#: Current-stream placeholder: what ``torch.cuda.current_stream()`` names when no stream is given.
CURRENT_DEVICE_STREAM = "current stream of the current device"

CALLS: list[dict[str, Any]] = []


def _gfx() -> str:
    return os.environ.get("MQA_TEST_AITER_GFX", "gfx942")


def _as_read_by_mfma(x: torch.Tensor, arch: str, patch_negative_zero: bool) -> torch.Tensor:
    """The values an fp8 MFMA of ``arch`` reads from ``x``'s bytes, as float32."""
    raw = x.view(torch.uint8)
    if arch == "gfx942":  # CDNA3 reads e4m3fnuz
        if patch_negative_zero:
            raw = torch.where(raw == 0x80, torch.zeros_like(raw), raw)
        return raw.view(torch.float8_e4m3fnuz).to(torch.float32)
    return raw.view(torch.float8_e4m3fn).to(torch.float32)  # gfx950's MFMAs read OCP e4m3fn


def flydsl_fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True,
                          stream=None, variant=None):
    seq_len, num_heads, head_size = Q.shape
    seq_len_kv = KV.shape[0]
    assert num_heads & (num_heads - 1) == 0, "num q. heads should be power of 2."
    assert head_size & (head_size - 1) == 0, "head size should be power of 2."
    arch = _gfx()
    CALLS.append({"arch": arch, "q": (Q.dtype, tuple(Q.shape)), "kv": (KV.dtype, tuple(KV.shape)),
                  "q_ptr": Q.data_ptr(), "kv_ptr": KV.data_ptr(),
                  "kv_scales": (kv_scales.dtype, tuple(kv_scales.shape)),
                  "weights": (weights.dtype, tuple(weights.shape)),
                  "windows": (cu_starts.dtype, cu_ends.dtype), "clean_logits": clean_logits,
                  "stream": CURRENT_DEVICE_STREAM if stream is None else stream, "variant": variant})
    if CDNA4 is not None:
        Q, KV = Q.contiguous(), KV.contiguous()
    kv_scales = kv_scales.reshape(seq_len_kv)
    weights = weights.reshape(seq_len, num_heads)
    cu_starts, cu_ends = cu_starts.reshape(seq_len), cu_ends.reshape(seq_len)
    for name, t, dtype in (("Q", Q, None), ("KV", KV, None), ("kv_scales", kv_scales, torch.float32),
                           ("weights", weights, torch.float32), ("cu_starts", cu_starts, torch.int32),
                           ("cu_ends", cu_ends, torch.int32)):
        # Flat buffers of these types: a strided or differently typed one would be misread.
        assert t.is_contiguous(), f"stand-in: {name} is read as a flat buffer but is strided"
        assert dtype is None or t.dtype == dtype, f"stand-in: {name} is read as {dtype}, got {t.dtype}"

    fn, fnuz = torch.float8_e4m3fn, torch.float8_e4m3fnuz
    if CDNA4 is not None and arch == CDNA4:
        assert Q.dtype == fn and KV.dtype == fn, (
            f"{arch} fp8_mqa_logits requires native e4m3fn Q/KV; got {Q.dtype}, {KV.dtype}")
        mfma_m, mfma_k = 32, 64
        if num_heads % mfma_m:
            raise NotImplementedError(f"fp8_mqa_logits: num_heads={num_heads} is not a multiple of "
                                      f"MFMA_M={mfma_m} required by every auto-selected variant on {arch}")
    else:
        assert Q.dtype in (fnuz, fn) and KV.dtype in (fnuz, fn), (
            f"Q/KV must be e4m3 fp8 (fnuz or fn); got {Q.dtype}, {KV.dtype}")
        mfma_m, mfma_k = 16, 32
        assert num_heads % mfma_m == 0, f"num_heads={num_heads} must be a multiple of MFMA_M={mfma_m}"
    assert head_size % mfma_k == 0, f"head_size={head_size} must be a multiple of MFMA_K={mfma_k}"

    convert_q = arch == "gfx942" and Q.dtype != fnuz
    convert_kv = arch == "gfx942" and KV.dtype != fnuz
    scale = kv_scales * ((2.0 if convert_q else 1.0) * (2.0 if convert_kv else 1.0))
    q = _as_read_by_mfma(Q, arch, convert_q)
    k = _as_read_by_mfma(KV, arch, convert_kv)

    # logits[m, n] = sum_h ReLU(<Q[m, h], K[n]> * kv_scale[n]) * weights[m, h], fp32 accumulation.
    dots = torch.einsum("mhd,nd->mhn", q, k)
    values = torch.einsum("mhn,mh->mn", dots.clamp_min(0), weights) * scale[None, :]

    rows = seq_len if CDNA4 is not None else -(-seq_len // 2) * 2  # released builds pad rows to RPB=2
    aligned = (seq_len_kv + 255) // 256 * 256
    logits = torch.full((rows, aligned), float("nan"), dtype=torch.float32, device=Q.device)
    logits = logits[:, :seq_len_kv]
    cols = torch.arange(seq_len_kv, device=Q.device)[None, :]
    start = cu_starts.long().clamp(min=0)[:, None]
    end = cu_ends.long().clamp(max=seq_len_kv)[:, None]
    inside = (cols >= start) & (cols < end)
    out = logits[:seq_len]
    out[inside] = values[inside]
    if clean_logits:
        out[~inside] = float("-inf")
    return logits[:seq_len, :]
