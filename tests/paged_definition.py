"""The paged op computed one cell at a time straight from its definition, for the oracle's tests."""

from __future__ import annotations

import torch


def brute_force(q, values, scales, weights, lens, tables, max_len):  # type: ignore[no-untyped-def]
    """[B * next_n, max_len] float64; -inf outside each row's context and at out-of-range block ids.

    ``values`` [blocks, block_size, D] and ``scales`` [blocks, block_size] as ``split_paged_cache``
    returns them (values already as numbers); ``lens`` 1-D (``lens[b] - next_n + j + 1``) or 2-D."""
    b, next_n, h, _ = q.shape
    blocks, block_size = values.shape[0], values.shape[1]
    out = torch.full((b * next_n, max_len), float("-inf"), dtype=torch.float64)
    for bi in range(b):
        for j in range(next_n):
            row = bi * next_n + j
            seen = int(lens[bi, j]) if lens.dim() == 2 else int(lens[bi]) - next_n + j + 1
            for p in range(min(seen, max_len, tables.shape[1] * block_size)):
                blk, off = int(tables[bi, p // block_size]), p % block_size
                if not 0 <= blk < blocks:
                    continue
                k = values[blk, off].double()
                s = sum(float(weights[row, hh]) * max(float(q[bi, j, hh].double() @ k), 0.0)
                        for hh in range(h))
                out[row, p] = float(scales[blk, off]) * s
    return out
