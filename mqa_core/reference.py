"""Float64 oracles for the ops: slow, obvious, unchunked; for tests and the conformance kit only.

They are written independently of the torch_ref provider so that the provider is checked against
something it does not share code with. Sizes are meant to be small (the [M, H, N] product is formed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _windowed(scores: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
    n = scores.shape[1]
    cols = torch.arange(n, device=scores.device)[None, :]
    inside = (cols >= ks.long()[:, None].clamp(min=0)) & (cols < ke.long()[:, None].clamp(max=n))
    return torch.where(inside, scores, torch.full_like(scores, float("-inf")))


def fp8_mqa_logits_ref(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                       ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
    """[M, N] float64: k_scale[n] * sum_h w[m, h] * relu(q[m, h] . k[n]) in window, -inf outside."""
    s = torch.einsum("mhd,nd->mhn", q.double(), k.double()).clamp_min_(0)
    logits = torch.einsum("mhn,mh->mn", s, weights.double()) * k_scale.double().reshape(1, -1)
    return _windowed(logits, ks, ke)


def split_paged_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's block layout -> (values [blocks, block_size, D] uint8, scales [blocks, block_size]
    float32), both views of ``kv_cache``'s memory (no copy).

    Block ``i`` starts ``kv_cache.stride(0)`` bytes after block ``i - 1``: a strided page pool when
    that exceeds ``block_size * (D + 4)`` (the bytes in between belong to someone else). The block
    holds ``block_size * D`` fp8 bytes, token after token, then ``block_size`` float32 scales; the
    scales need a 4-byte aligned start, ``stride(0) % 4 == 0`` and ``block_size * D % 4 == 0``
    (``mqa_core.validate`` rejects other layouts).
    """
    blocks, block_size, _, d4 = kv_cache.shape
    d = d4 - 4
    stride = kv_cache.stride(0) if blocks > 1 else block_size * d4  # a size-1 dim's stride is free
    start = kv_cache.storage_offset()
    values = kv_cache.as_strided((blocks, block_size, d), (stride, d, 1), start)
    raw = kv_cache.as_strided((blocks, block_size * 4), (stride, 1), start + block_size * d)
    return values, raw.view(torch.float32)


def pad_paged_cache(kv_cache: torch.Tensor, gap: int, fill: int = 0x7F) -> torch.Tensor:
    """The same blocks in a strided page pool: ``gap`` foreign bytes between blocks (set to ``fill``;
    0x7F is an fp8 NaN and, four at a time, a float32 NaN), so a reader that assumes contiguous
    blocks reads garbage. Returns ``[blocks, block_size, 1, D + 4]`` with
    ``stride(0) = block_size * (D + 4) + gap``; for tests and benchmarks."""
    blocks, block_size, _, d4 = kv_cache.shape
    row = block_size * d4
    pool = torch.full((blocks, row + gap), fill, dtype=torch.uint8, device=kv_cache.device)
    pool[:, :row] = kv_cache.reshape(blocks, row)
    return pool.as_strided((blocks, block_size, 1, d4), (row + gap, d4, d4, 1))


def visible_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B * next_n] positions row b*next_n+j sees: lens[b]-next_n+j+1, or lens[b, j] when 2-D."""
    if context_lens.dim() == 2:
        return context_lens.reshape(-1).long()
    j = torch.arange(next_n, device=context_lens.device)
    return (context_lens.long()[:, None] - next_n + j[None, :] + 1).reshape(-1)


def _paged_logits(q: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                  block_tables: torch.Tensor, max_context_len: int, blocks: int, block_size: int,
                  keys: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
                  ) -> torch.Tensor:
    """The loop of both paged oracles, over decoded values, by :func:`fp8_paged_mqa_logits_ref`'s rules:
    ``q`` float64 ``[B, next_n, H, D]``; ``keys(blk, slot)`` the float64 ``[n, D]`` keys of the tokens
    at (block id, slot) and their ``[n]`` scales, or None where the scales are in the values."""
    b, next_n = q.shape[:2]
    pos = torch.arange(max_context_len, device=q.device)
    out = torch.full((b * next_n, max_context_len), float("-inf"), dtype=torch.float64, device=q.device)
    lens = visible_lengths(context_lens, next_n)
    covered = min(max_context_len, block_tables.shape[1] * block_size)
    for bi in range(b):
        used = max(0, min(int(lens[bi * next_n: (bi + 1) * next_n].max()), covered))
        if used == 0 or blocks == 0:  # nothing visible, or every block id is outside the pool: all -inf
            continue
        blk = block_tables[bi, pos[:used] // block_size].long()  # only blocks holding visible positions
        ok = (blk >= 0) & (blk < blocks)
        k, sc = keys(torch.where(ok, blk, 0), pos[:used] % block_size)
        for j in range(next_n):
            row = bi * next_n + j
            n = int(min(int(lens[row]), used))
            if n <= 0:
                continue
            res = weights[row].double() @ (q[bi, j] @ k[:n].T).clamp_min_(0)
            if sc is not None:
                res = res * sc[:n]
            out[row, :n] = torch.where(ok[:n], res, float("-inf"))
    return out


def fp8_paged_mqa_logits_ref(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor,
                             max_context_len: int, fp8_dtype: torch.dtype = torch.float8_e4m3fn
                             ) -> torch.Tensor:
    """[B * next_n, max_context_len] float64 over the paged cache, -inf outside each row's context.

    Row ``b * next_n + j`` sees ``p < visible_lengths(...)[row]`` (any 2-D lengths), capped by what
    the block table covers. A position whose block id is outside ``[0, num_blocks)`` is -inf: the
    documented answer of every provider, which never reads such a block.
    """
    values, scales = split_paged_cache(kv_cache)
    return _paged_logits(q.double(), weights, context_lens, block_tables, max_context_len,
                         values.shape[0], values.shape[1],
                         lambda blk, slot: (values[blk, slot].view(fp8_dtype).double(), scales[blk, slot].double()))


# -- FP4 (mqa_core.spec.FP4: DeepGEMM's packed e2m1 with UE8M0 scales of 32) ------------------------

def fp4_values(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """float64 ``[..., D]``: the FP4 values, decoded from the bits by the formula (not a table): for
    a nibble ``s e1 e0 m``, ``(-1)**s * 2**(e - 1) * (1 + m / 2)`` when ``e > 0``, ``m / 2`` when
    ``e == 0``; times ``2**(byte_g - 127)`` for the scale byte ``g = d // 32`` of ``sf``."""
    b = packed.view(torch.uint8).long()
    nib = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)
    sign = 1.0 - 2.0 * ((nib >> 3) & 1).double()
    e, m = ((nib >> 1) & 3).double(), (nib & 1).double()
    mag = torch.where(e > 0, torch.exp2(e - 1) * (1 + m / 2), m / 2)
    d = nib.shape[-1]
    exps = torch.stack([(sf.long() >> (8 * g)) & 255 for g in range(4)], dim=-1)  # little-endian bytes
    group = torch.arange(d, device=packed.device) // 32
    return sign * mag * torch.exp2(exps[..., group].double() - 127)


def fp4_mqa_logits_ref(q: torch.Tensor, q_sf: torch.Tensor, k: torch.Tensor, k_sf: torch.Tensor,
                       weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
    """[M, N] float64 for FP4 inputs: ``sum_h w[m, h] * relu(q[m, h] . k[n])`` over the decoded values
    (no key scale: the UE8M0 scales are in the values), -inf outside each window."""
    ones = torch.ones(k.shape[0], dtype=torch.float64, device=k.device)
    return fp8_mqa_logits_ref(fp4_values(q, q_sf), fp4_values(k, k_sf), ones, weights, ks, ke)


def fp4_paged_mqa_logits_ref(q: torch.Tensor, q_sf: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor,
                             max_context_len: int) -> torch.Tensor:
    """[B * next_n, max_context_len] float64 over an FP4 page pool (per block ``block_size * D / 2``
    packed bytes, then one int32 of scales per token), with :func:`fp8_paged_mqa_logits_ref`'s rules."""
    w = q.shape[-1]
    blocks, block_size, _, w4 = kv_cache.shape
    stride = kv_cache.stride(0) if blocks > 1 else block_size * w4
    start = kv_cache.storage_offset()
    values = kv_cache.as_strided((blocks, block_size, w), (stride, w, 1), start)
    words = kv_cache.as_strided((blocks, block_size * 4), (stride, 1), start + block_size * w).view(torch.int32)
    return _paged_logits(fp4_values(q, q_sf), weights, context_lens, block_tables, max_context_len, blocks,
                         block_size, lambda blk, slot: (fp4_values(values[blk, slot], words[blk, slot]), None))
