"""The indexer step's selection rule in PyTorch, exact, within a memory bound.

Row ``m`` keeps the ``topk`` largest cells of its window ``[max(ks[m], 0), min(ke[m], C))``; ties go
to the smaller position; -0.0 ties +0.0; NaN ranks below -inf; positions come out ascending, -1
(value -inf) past the window's size (DESIGN.md, the indexer step).

Each cell becomes one unique int64 key: the order-preserving int32 of its value (NaN, then the cells
outside the window, below every number) in the high half, the complement of its column in the low
half. One ``torch.topk`` over the keys is then exact and tie-broken whatever algorithm it runs, and
so is a merge: the best ``topk`` keys of a row are the best of (the best so far, the next block's
cells). A row can therefore be taken in column blocks, which bounds the temporaries by a block, not
by the row: the composed indexer step hands its selection half a workspace, and a 1M-key row's keys
alone would be 8 MiB. The result depends on nothing but the row: deterministic and batch-invariant.
"""

from __future__ import annotations

import torch

__all__ = ["CELL_BYTES", "select_topk"]

_INT32_MIN = -(2**31)
_NAN_KEY = _INT32_MIN + 1  # NaN ranks below every number, -inf included
_PAD_KEY = _INT32_MIN  # outside the window: below NaN
_LOW32 = 2**32 - 1
#: Bytes per cell of a block the selection may have allocated at once: the int64 key (8), then
#: either its sign mask, masks and a bf16 input's float32 copy (8 + 4 + 4) or the merge's
#: concatenation (8) and torch.topk's buffers (on CUDA, sort-based for slices of 100k and more: its
#: values, indices and the sort's double buffers, 48), with the caching allocator's rounding on top.
CELL_BYTES = 80
#: Bytes per kept position and row: the best keys so far, their merge copy and the final sort.
_KEPT_BYTES = 40


def _keys(block: torch.Tensor, c0: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """int64 keys of ``block`` (columns ``c0 ..`` of the rows, float32 or bfloat16)."""
    x = block.float() if block.dtype != torch.float32 else block
    key = x.view(torch.int32).to(torch.int64)
    t = key >> 31  # -1 for negative floats: flip their magnitude bits so the order is numeric
    t &= 0x7FFFFFFF
    key ^= t
    del t
    key.masked_fill_(key == -1, 0)  # -0.0 (bits 0x80000000 -> -1) ties +0.0
    key.masked_fill_(torch.isnan(x), _NAN_KEY)
    cols = torch.arange(c0, c0 + block.shape[1], device=block.device)
    key.masked_fill_((cols[None, :] < lo[:, None]) | (cols[None, :] >= hi[:, None]), _PAD_KEY)
    key <<= 32
    key += _LOW32 - cols  # smaller column, larger key: ties to the smaller position
    return key


def _block_shape(r: int, c: int, take: int, budget_bytes: int | None) -> tuple[int, int]:
    """(rows, columns) of a step whose temporaries fit ``budget_bytes`` (None: the whole matrix);
    at least one row and one column."""
    if budget_bytes is None:
        return max(r, 1), max(c, 1)
    rows = max(1, min(r, budget_bytes // (CELL_BYTES * c + _KEPT_BYTES * take)))
    cols = max(1, min(c, (budget_bytes // rows - _KEPT_BYTES * take) // CELL_BYTES))
    return rows, cols


def select_topk(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                positions: str = "relative", out: torch.Tensor | None = None, values: torch.Tensor | None = None,
                budget_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The exact top-k of each row's window of ``logits`` [R, C] (float32 or bfloat16, any strides).

    Returns int32 [R, topk] positions (``"relative"``: c - lo; ``"absolute"``: c), written into
    ``out`` when given, and the float32 values (-inf padding) into ``values`` when given (else None).
    ``budget_bytes`` bounds the temporaries (rows, then column blocks, per step; None: one step).
    """
    if positions not in ("relative", "absolute"):
        raise ValueError(f"positions must be 'relative' or 'absolute', got {positions!r}")
    r, c = logits.shape
    dev = logits.device
    if out is None:
        out = torch.empty((r, topk), dtype=torch.int32, device=dev)
    take = min(topk, c)
    out[:, take:] = -1
    if values is not None:
        values[:, take:] = float("-inf")
    if take == 0 or r == 0:
        return out, values
    lo = ks.to(device=dev, dtype=torch.int64).clamp(min=0)
    hi = torch.maximum(ke.to(device=dev, dtype=torch.int64).clamp(max=c), lo)
    rows, cols = _block_shape(r, c, take, budget_bytes)
    for r0 in range(0, r, rows):
        rs = slice(r0, min(r, r0 + rows))
        best: torch.Tensor | None = None
        for c0 in range(0, c, cols):
            key = _keys(logits[rs, c0:c0 + cols], c0, lo[rs], hi[rs])
            if best is not None:
                key = torch.cat([best, key], dim=1)
            best = torch.topk(key, min(take, key.shape[1]), dim=1, sorted=False).values
            del key
        assert best is not None and best.shape[1] == take
        valid = (best >> 32) != _PAD_KEY
        col = torch.where(valid, _LOW32 - (best & _LOW32), c).sort(dim=1).values
        del best
        valid = col < c
        out[rs, :take] = torch.where(valid, col - (lo[rs, None] if positions == "relative" else 0), -1)
        if values is not None:
            got = logits[rs].gather(1, col.clamp(max=c - 1)).float()
            values[rs, :take] = got.masked_fill_(~valid, float("-inf"))
    return out, values
