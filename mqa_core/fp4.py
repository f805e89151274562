"""FP4 as DeepGEMM's ``fp8_fp4_*`` entries take it (:data:`mqa_core.spec.FP4`): e2m1 values packed two
to a byte, with UE8M0 scales of 32 values packed four to an int32.

- values: int8 (DeepGEMM's ``kPackedFP4``) or uint8 ``[..., D / 2]``; element ``2i`` in the low nibble
  of byte ``i``, element ``2i + 1`` in the high one. A nibble is ``s eem``: sign, then the magnitudes
  0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0-7; ``-0`` is 0).
- scales: int32 ``[...]`` per (token, head): byte ``g`` (little-endian) is group ``g``'s UE8M0
  exponent ``e``, the scale ``2 ** (e - 127)``; D / 32 groups, at most 4 (D <= 128), unused bytes
  ignored.
- the paged cache: per block, ``block_size * D / 2`` packed bytes (token after token), then
  ``block_size`` int32 scale words: ``[num_blocks, block_size, 1, D / 2 + 4]`` uint8.

There is no separate key scale: a value is its e2m1 magnitude times its group's scale, so
``logits[m, n] = sum_h w[m, h] * relu(sum_d q[m, h, d] * k[n, d])`` over the dequantized values.
Every dequantized value and every product of two is exact in float32 (2 significant bits each).

Helpers to read (``dequantize``), write (``quantize``, for tests and benchmarks) and lay out
(``paged_cache``, ``split_paged_cache``) the format. Imported on use only (it imports torch).
"""

from __future__ import annotations

import torch

from .spec import FP4_GROUP, FP4_MAX_GROUPS

__all__ = ["E2M1", "dequantize", "paged_cache", "quantize", "scales", "split_paged_cache", "unpack"]

#: The magnitude of each 3-bit e2m1 code.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_PACKED = (torch.int8, torch.uint8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., 2 * W]``: the e2m1 values of int8/uint8 ``[..., W]`` (unscaled)."""
    if packed.dtype not in _PACKED:
        raise TypeError(f"packed FP4 values are int8 or uint8; got {packed.dtype}")
    b = packed.view(torch.uint8).to(torch.int32)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)
    table = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    mag = table[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def scales(sf: torch.Tensor, groups: int) -> torch.Tensor:
    """float32 ``[..., groups]``: the UE8M0 scales packed in int32 ``sf [...]`` (byte g: group g)."""
    if sf.dtype != torch.int32:
        raise TypeError(f"packed UE8M0 scales are int32; got {sf.dtype}")
    if not 1 <= groups <= FP4_MAX_GROUPS:
        raise ValueError(f"an int32 holds 1 to {FP4_MAX_GROUPS} UE8M0 scales; asked for {groups}")
    exps = sf.contiguous().view(torch.uint8).reshape(*sf.shape, 4)[..., :groups].to(torch.int32)
    return torch.ldexp(torch.ones_like(exps, dtype=torch.float32), exps - 127)  # exact, 2**-127 included


def dequantize(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., D]`` values of packed ``[..., D / 2]`` with int32 scales ``[...]`` (exact)."""
    values = unpack(packed)
    d = values.shape[-1]
    if d % FP4_GROUP:
        raise ValueError(f"FP4 head dim must be a multiple of {FP4_GROUP}; got D = {d}")
    s = scales(sf, d // FP4_GROUP)
    return (values.view(*values.shape[:-1], d // FP4_GROUP, FP4_GROUP) * s[..., None]).view(values.shape)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``[..., D / 2]``, int32 ``[...]``): ``x [..., D]`` in FP4 with per-32 UE8M0 scales, each
    the smallest power of two that brings the group's largest magnitude to at most 6, every value then
    rounded to the nearest e2m1 magnitude (ties to the smaller one). For tests and benchmarks."""
    d = x.shape[-1]
    if d % FP4_GROUP or d // FP4_GROUP > FP4_MAX_GROUPS:
        raise ValueError(f"FP4 needs D a multiple of {FP4_GROUP}, at most {FP4_GROUP * FP4_MAX_GROUPS}; got {d}")
    g = x.float().reshape(*x.shape[:-1], d // FP4_GROUP, FP4_GROUP)
    amax = g.abs().amax(dim=-1).clamp_min(2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.exp2(exp)[..., None]
    table = torch.tensor(E2M1, dtype=torch.float32, device=x.device)
    code = (scaled.abs()[..., None] - table).abs().argmin(dim=-1)  # first of two equal distances: smaller
    code = code | ((scaled < 0) & (code > 0)).to(code.dtype) << 3
    code = code.reshape(*x.shape[:-1], d).to(torch.uint8)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).view(torch.int8)
    e = (exp + 127).to(torch.uint8)
    pad = torch.full((*e.shape[:-1], FP4_MAX_GROUPS - e.shape[-1]), 127, dtype=torch.uint8, device=x.device)
    sf = torch.cat((e, pad), dim=-1).contiguous().view(torch.int32).squeeze(-1)
    return packed.contiguous(), sf


def paged_cache(values: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """``[blocks, block_size, 1, D / 2 + 4]`` uint8 from packed ``[blocks, block_size, D / 2]`` values and
    int32 ``[blocks, block_size]`` scale words: per block the values, then the scale words."""
    blocks, bs, w = values.shape
    if sf.shape != (blocks, bs) or sf.dtype != torch.int32:
        raise ValueError(f"scales must be int32 [{blocks}, {bs}]; got {sf.dtype} {list(sf.shape)}")
    flat = torch.cat((values.reshape(blocks, bs * w).view(torch.uint8),
                      sf.contiguous().view(torch.uint8).reshape(blocks, bs * 4)), dim=1)
    return flat.view(blocks, bs, 1, w + 4)


def split_paged_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (possibly strided) FP4 page pool -> (packed values uint8 [blocks, block_size, D / 2], scale
    words int32 [blocks, block_size]), views of its memory."""
    blocks, bs, _, w4 = kv_cache.shape
    w = w4 - 4
    stride = kv_cache.stride(0) if blocks > 1 else bs * w4
    start = kv_cache.storage_offset()
    values = kv_cache.as_strided((blocks, bs, w), (stride, w, 1), start)
    raw = kv_cache.as_strided((blocks, bs * 4), (stride, 1), start + bs * w)
    return values, raw.view(torch.int32)
