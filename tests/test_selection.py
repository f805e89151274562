"""mqa_core.selection: the exact selection, in one step and in the column blocks a small budget forces
(what keeps torch_ref's indexer step within its workspace on long rows)."""

from __future__ import annotations

import pytest
import torch

from mqa_core.selection import CELL_BYTES, _block_shape, select_topk
from mqa_core.testing.topk import oracle_select


def _rows(m: int, n: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g)
    x[0] = torch.randint(-2, 3, (n,), generator=g).float()  # ties everywhere, -0.0 below
    x[0, ::7] = -0.0
    x[1, ::3] = float("nan")
    x[1, 5::11] = float("-inf")
    return x.to(dtype)


def _want(x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, positions: str) -> torch.Tensor:
    n = x.shape[1]
    out = torch.full((x.shape[0], topk), -1, dtype=torch.int32)
    for r in range(x.shape[0]):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), n)
        if lo < hi:
            pos = oracle_select(x[r, lo:hi].double(), topk) + (lo if positions == "absolute" else 0)
            out[r, :len(pos)] = pos.int()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positions", ["relative", "absolute"])
@pytest.mark.parametrize("budget", [None, 1, 3 * CELL_BYTES * 100, 1 << 20])
def test_blocks_give_the_oracle(dtype, positions, budget):
    """Any budget (one column a step, some hundred, the whole matrix): the oracle's positions, and
    values that are the logits at them (-inf past the window), written in full."""
    m, n, topk = 6, 1000, 37
    x = _rows(m, n, 3, dtype)
    ks = torch.tensor([0, 10, -5, 400, 990, 500], dtype=torch.int32)
    ke = torch.tensor([n, 900, 20, 400, n + 7, 530], dtype=torch.int32)  # ragged, short, empty, clamped
    out = torch.full((m, topk), 12345, dtype=torch.int32)
    values = torch.full((m, topk), 12345.0)
    select_topk(x, ks, ke, topk, positions=positions, out=out, values=values, budget_bytes=budget)
    want = _want(x, ks, ke, topk, positions)
    assert torch.equal(out, want)
    shift = torch.zeros(m, 1, dtype=torch.int64) if positions == "absolute" else ks.clamp(min=0).long()[:, None]
    at = x.float().gather(1, (want.long() + shift).clamp(0, n - 1))
    assert torch.equal(values.isinf() & (values < 0), (want < 0) | (at.isinf() & (at < 0)))
    ok = want >= 0
    assert torch.equal(values[ok].nan_to_num(7.0), at[ok].nan_to_num(7.0))


def test_topk_past_the_row_and_empty_inputs():
    x = _rows(3, 50, 4, torch.float32)
    ks, ke = torch.zeros(3, dtype=torch.int32), torch.full((3,), 50, dtype=torch.int32)
    out, values = select_topk(x, ks, ke, 80, values=torch.empty(3, 80), budget_bytes=CELL_BYTES * 8)
    assert torch.equal(out, _want(x, ks, ke, 80, "relative")) and bool((out[:, 50:] == -1).all())
    assert bool((values[:, 50:] == float("-inf")).all())
    empty, _ = select_topk(x[:0], ks[:0], ke[:0], 4)
    assert empty.shape == (0, 4)
    with pytest.raises(ValueError, match="positions"):
        select_topk(x, ks, ke, 4, positions="sideways")


def test_the_block_shape_follows_the_budget():
    """Rows while whole rows fit, then column blocks of one row; never below one of each."""
    assert _block_shape(8, 1000, 10, None) == (8, 1000)
    rows, cols = _block_shape(64, 131072, 2048, 8 << 20)
    assert rows == 1 and cols * CELL_BYTES + 40 * 2048 <= 8 << 20 and cols < 131072
    assert _block_shape(64, 1000, 10, 10 * (CELL_BYTES * 1000 + 400)) == (10, 1000)
    assert _block_shape(4, 1000, 10, 1) == (1, 1)
