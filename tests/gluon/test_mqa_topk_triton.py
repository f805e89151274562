"""The fused fp8 MQA top-k (logits + exact top-k per row, no [M, N] matrix) against an oracle.

Interpreter on small shapes: exact inputs (small-integer fp8, power-of-two scales: every fp32 logit
is exact, so the selection must equal the oracle's, tie rule included), random inputs (a selection
is accepted when no unselected logit beats a selected one beyond rounding), every path forced
(dense, sampled, under-count and overflow rescoring, rescoring in pieces, row chunks), determinism
and batch invariance; the default ``select`` on its own; the workspace accounting; AOT builds of the
filter kernel; and a CUDA test at size that skips here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from mqa_core.reference import fp8_mqa_logits_ref
from mqa_core.spec import Problem
from mqa_core.testing import make_inputs

triton = pytest.importorskip("triton")

from aot_targets import skip_unless_buildable  # noqa: E402
from mqa_provider_gluon.ops import mqa_topk_triton as op  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_triton import TritonConfig  # noqa: E402
from mqa_provider_gluon.ops.mqa_topk_triton import (  # noqa: E402
    fp8_mqa_topk_triton,
    select_topk_torch,
    tuning,
)

SMALL = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2)
pytestmark = pytest.mark.usefixtures("fresh_plans")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# ---- the oracle: written from the contract, independently of the module's select ---------------

def oracle(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, positions: str = "relative"
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, python sorting of (value, position) pairs: larger value first (NaN last, -0 == +0),
    then smaller position; the first topk, re-sorted by position."""
    m, n = logits.shape
    pos = torch.full((m, topk), -1, dtype=torch.int32)
    val = torch.full((m, topk), float("-inf"), dtype=torch.float64)
    for i in range(m):
        lo, hi = max(int(ks[i]), 0), min(int(ke[i]), n)
        cells = [(float(logits[i, j]), j) for j in range(lo, hi)]
        cells.sort(key=lambda c: (math.isnan(c[0]), -c[0] if not math.isnan(c[0]) else 0.0, c[1]))
        best = sorted(cells[:topk], key=lambda c: c[1])
        for t, (v, j) in enumerate(best):
            pos[i, t] = j - lo if positions == "relative" else j
            val[i, t] = v
    return pos, val


def exact_inputs(m: int, n: int, h: int, d: int, seed: int, window: str = "ragged") -> Any:
    """Small integers in fp8, power-of-two weights and scales: the fp32 logits are exact, and tie often."""
    g = torch.Generator().manual_seed(seed)
    inp = make_inputs(Problem(m, n, h, d), window=window, seed=seed)
    q = torch.randint(-2, 3, (m, h, d), generator=g).float().to(torch.float8_e4m3fn)
    k = torch.randint(-2, 3, (n, d), generator=g).float().to(torch.float8_e4m3fn)
    w = (2.0 ** torch.randint(-3, 1, (m, h), generator=g).float()) * torch.where(
        torch.rand(m, h, generator=g) < 0.3, -1.0, 1.0)
    k_scale = 2.0 ** torch.randint(-2, 2, (n,), generator=g).float()
    return type(inp)(q, k, k_scale, w, inp.ks, inp.ke)


def run(inp: Any, topk: int, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return fp8_mqa_topk_triton(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, topk, **kw)


def edge_windows(inp: Any, n: int) -> None:
    """An empty row, ks < 0 with ke > N (the whole row), a one-key window."""
    inp.ks[0], inp.ke[0] = 5, 5
    inp.ks[-1], inp.ke[-1] = -7, n + 9
    if inp.ks.numel() > 2:
        inp.ks[1], inp.ke[1] = n - 1, n + 3


class Paths:
    """What the calls under a ``tuning(report=...)`` did."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.peaks: list[int] = []

    def __call__(self, ws: op.Workspace, ctx: dict[str, Any]) -> None:
        self.calls.append(ctx)
        self.peaks.append(ws.peak)
        assert ws.live == 0 or ws.live < 1024, "temporaries outlived the call"

    def total(self, key: str) -> int:
        return sum(c[key] for c in self.calls)

    @property
    def fallback(self) -> int:
        return self.total("fallback_rows")


#: (name, tuning): each forces a path on the exact cases below (N ~ 150, topk <= 12).
PATHS = {
    "default": {},
    "sampled": {"stride": 4, "rank": 6, "capacity": 48},
    "undercount": {"stride": 4, "rank": 1, "capacity": 40},
    "overflow": {"stride": 4, "rank": 8, "capacity": 13},
    "pieces": {"stride": 4, "rank": 1, "capacity": 40, "piece": 9},
}

EXACT_CASES = [  # (M, N, H, D, window, topk)
    (11, 150, 16, 64, "ragged", 12),
    (7, 97, 20, 96, "causal", 5),  # H and D not powers of two
    (5, 130, 16, 64, "full", 1),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("m,n,h,d,window,topk", EXACT_CASES)
def test_exact_inputs_equal_the_oracle(interpret, path, m, n, h, d, window, topk):
    inp = exact_inputs(m, n, h, d, seed=m * 100 + n, window=window)
    if window == "ragged":
        edge_windows(inp, n)
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    assert torch.equal(ref, ref.float().double()), "inputs meant to be exact are not"
    paths = Paths()
    for positions in ("relative", "absolute"):
        want_pos, want_val = oracle(ref, inp.ks, inp.ke, topk, positions)
        with tuning(config=SMALL, poison=True, report=paths, **PATHS[path]):
            pos, val = run(inp, topk, positions=positions, return_values=True)
        assert pos.dtype == torch.int32 and pos.shape == (m, topk)
        assert torch.equal(pos, want_pos), (positions, pos, want_pos)
        assert val is not None and torch.equal(val.double(), want_val)
    if path in ("undercount", "overflow", "pieces") and topk > 1:  # top-1: the sample's max never under-counts
        assert paths.fallback > 0, "the rescoring path did not run"
        assert paths.total("overflow_rows" if path == "overflow" else "undercount_rows") > 0
    if path == "sampled":
        assert paths.fallback == 0 and paths.total("sampled_rows") > 0 and paths.calls[0]["plan"]["stride"] == 4
    if path == "default":
        assert paths.total("sampled_rows") == 0 and paths.total("dense_rows") > 0  # W < 4 topk: no sample


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """``filter="slices"`` at test sizes: slice filter programs of 32 columns in steps of 16, so a
    40-key slice has two programs a row and windows start and end inside steps."""
    monkeypatch.setattr(op, "SLICE_SEG", 32)
    monkeypatch.setattr(op, "SLICE_BLOCK", 16)


@pytest.mark.parametrize("case,path", [(EXACT_CASES[0], p) for p in ("default", "sampled", "undercount", "overflow")]
                         + [(EXACT_CASES[1], p) for p in ("default", "pieces")],
                         ids=["ragged-default", "ragged-sampled", "ragged-undercount", "ragged-overflow",
                              "causal-default", "causal-pieces"])  # pieces: 17 rescoring pieces, the slow case
def test_slices_equal_the_oracle(interpret, small_slices, path, case):
    """``filter="slices"``: the logits kernel over 40-key slices, each slice's candidates appended by
    the slice filter kernel; exact inputs must give the oracle's positions and values on every path
    (dense rows write their slots directly, sampled rows count through the atomic, rescoring pieces
    go through the same slices), with every buffer poisoned."""
    m, n, h, d, window, topk = case
    inp = exact_inputs(m, n, h, d, seed=m * 100 + n, window=window)
    if window == "ragged":
        edge_windows(inp, n)
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    paths = Paths()
    for positions in ("relative", "absolute"):
        want_pos, want_val = oracle(ref, inp.ks, inp.ke, topk, positions)
        with tuning(config=SMALL, poison=True, report=paths, slice=40, **PATHS[path]):
            pos, val = run(inp, topk, positions=positions, return_values=True, filter="slices")
        assert torch.equal(pos, want_pos), (positions, pos, want_pos)
        assert val is not None and torch.equal(val.double(), want_val)
    if path in ("undercount", "overflow", "pieces"):
        assert paths.fallback > 0, "the rescoring path did not run"
    if path == "sampled":
        assert paths.fallback == 0 and paths.total("sampled_rows") > 0


@pytest.mark.parametrize("block", [16, 64])
def test_slice_filter_counts_every_passing_cell(interpret, block):
    """The slice filter kernel alone, on a poisoned logits slice: a sampled row's count is every
    in-window cell >= tau (beyond the capacity too), its first ``cap`` slots hold exactly such cells
    (any order), a dense row (tau = -inf) writes each window cell, NaN and -inf included, to slot
    ``col - ks``, and no slot past a row's cells is written; in steps of 16 keys and of 64 (whole
    steps, partial first and last ones, and windows inside one step)."""
    from mqa_provider_gluon.ops.mqa_logits_triton import _interpreting

    g = torch.Generator().manual_seed(11)
    rows, ncols, c0, cap = 5, 200, 1000, 30
    x = torch.randn(rows, ncols, generator=g)
    x[3, 10], x[3, 11] = float("nan"), float("-inf")
    ks = torch.tensor([-5, 17, 0, 3, 150], dtype=torch.int32)
    ke = torch.tensor([300, 170, 0, 30, 160], dtype=torch.int32)
    tau = torch.tensor([1.0, 0.5, 0.0, float("-inf"), -10.0])
    cnt = torch.zeros(rows, dtype=torch.int32)
    pos = torch.full((rows, cap), -7, dtype=torch.int32)
    val = torch.full((rows, cap), float("nan"))
    with _interpreting():
        op.slice_filter_kernel(True)[(rows, -(-ncols // 64))](x, x.stride(0), ks, ke, tau, cnt, pos, val, cap, cap,
                                                              c0, ncols, SEG=64, BLOCK=block, AHEAD=2, num_warps=1)
    for r in range(rows):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), ncols)
        cells = {(c0 + c, float(x[r, c])) for c in range(lo, hi) if x[r, c] >= tau[r]}
        if r == 3:  # dense: every window cell at col - ks
            assert int(cnt[r]) == 0
            assert pos[r, :hi - lo].tolist() == [c0 + c for c in range(lo, hi)]
            assert torch.equal(val[r, :hi - lo].view(torch.int32), x[r, lo:hi].view(torch.int32))
            assert (pos[r, hi - lo:] == -7).all()
            continue
        assert int(cnt[r]) == len(cells), (r, int(cnt[r]), len(cells))
        got = min(len(cells), cap)
        assert {(int(p), float(v)) for p, v in zip(pos[r, :got], val[r, :got])} <= cells
        assert len(set(pos[r, :got].tolist())) == got
        assert (pos[r, got:] == -7).all() and torch.isnan(val[r, got:]).all()


def test_ties_go_to_the_smaller_position(interpret):
    """All-equal logits (q, k constant): the first topk positions of each window, in every path."""
    m, n, h, d, topk = 6, 90, 16, 64, 7
    inp = exact_inputs(m, n, h, d, seed=1, window="ragged")
    inp.q.fill_(1.0)
    inp.k.fill_(1.0)
    inp.k_scale.fill_(1.0)
    inp.weights.fill_(0.5)
    edge_windows(inp, n)
    lo = inp.ks.clamp(min=0, max=n)
    width = (inp.ke.clamp(max=n) - lo).clamp(min=0)
    want = torch.arange(topk)[None, :].expand(m, topk)
    want = torch.where(want < width[:, None], want, -1).to(torch.int32)
    for path in PATHS.values():
        with tuning(config=SMALL, **path):
            assert torch.equal(run(inp, topk)[0], want)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_inputs_select_a_valid_top_k(interpret, seed):
    m, n, h, d, topk = 13, 220, 32, 128, 16
    inp = make_inputs(Problem(m, n, h, d), window="ragged", seed=seed)
    edge_windows(inp, n)
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    for path in ("default", "sampled", "undercount"):
        paths = Paths()
        with tuning(config=SMALL, report=paths, **PATHS[path]):
            pos, val = run(inp, topk, positions="absolute", return_values=True)
        assert val is not None
        if path == "sampled":  # no ties in random logits: every sampled row keeps its candidates
            assert paths.total("sampled_rows") > 0 and paths.total("tie_rows") == 0
        for i in range(m):
            lo, hi = max(int(inp.ks[i]), 0), min(int(inp.ke[i]), n)
            chosen = pos[i][pos[i] >= 0].long()
            assert chosen.numel() == min(topk, max(hi - lo, 0))
            assert torch.all(chosen[1:] > chosen[:-1])
            assert chosen.numel() == 0 or (chosen[0] >= lo and chosen[-1] < hi)
            assert torch.all(pos[i][chosen.numel():] == -1) and torch.all(val[i][chosen.numel():] == float("-inf"))
            if chosen.numel() == 0:
                continue
            row = ref[i]
            rest = torch.ones(n, dtype=torch.bool)
            rest[:lo] = False
            rest[hi:] = False
            rest[chosen] = False
            tol = 1e-5 * row[lo:hi].abs().max().item() + 1e-6
            if rest.any():
                assert row[chosen].min() >= row[rest].max() - tol
            assert torch.allclose(val[i][: chosen.numel()].double(), row[chosen], rtol=1e-5, atol=1e-6)


def test_w_at_most_topk_and_empty_rows(interpret):
    """Windows narrower than topk: all of the window, -1 padding; without values nothing is scored
    (no chunk at all: one fill), with values every row is."""
    m, n, topk = 5, 40, 16
    inp = exact_inputs(m, n, 16, 64, seed=3)
    inp.ks.copy_(torch.tensor([3, -4, 10, 39, 20], dtype=torch.int32))
    inp.ke.copy_(torch.tensor([3, 6, 26, 50, 12], dtype=torch.int32))
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    for positions in ("relative", "absolute"):
        want, want_val = oracle(ref, inp.ks, inp.ke, topk, positions)
        paths = Paths()
        with tuning(config=SMALL, poison=True, report=paths):
            assert torch.equal(run(inp, topk, positions=positions)[0], want)
            pos, val = run(inp, topk, positions=positions, return_values=True)
        assert torch.equal(pos, want) and val is not None and torch.equal(val.double(), want_val)
        assert [c["chunks"] for c in paths.calls] == [0, 1], paths.calls


def test_nan_ranks_below_everything(interpret):
    """A NaN weight makes its row all NaN (relu(s) * NaN): selected only where nothing else is left."""
    m, n, topk = 4, 60, 8
    inp = exact_inputs(m, n, 16, 64, seed=4, window="full")
    inp.weights[1, 3] = float("nan")
    inp.k_scale[7] = float("nan")  # one NaN key in every row
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    want, _ = oracle(ref, inp.ks, inp.ke, topk)
    for path in ("default", "sampled", "undercount"):
        with tuning(config=SMALL, **PATHS[path]):
            assert torch.equal(run(inp, topk)[0], want), path
    assert torch.equal(want[1], torch.arange(topk, dtype=torch.int32))  # all NaN: ties to smaller


def test_repeat_is_bitwise_equal_and_poison_does_not_show(interpret):
    inp = make_inputs(Problem(9, 160, 16, 64), window="ragged", seed=5)
    edge_windows(inp, 160)
    outs = []
    for poison in (False, True, True):
        with tuning(config=SMALL, stride=4, rank=5, capacity=36, poison=poison):
            outs.append(run(inp, 10, return_values=True))
    for pos, val in outs[1:]:
        assert torch.equal(pos, outs[0][0]) and torch.equal(val.view(torch.int32), outs[0][1].view(torch.int32))


def test_batch_invariance(interpret):
    """Row alone, inside a batch, in another chunking, and with keys appended past its window: same
    indices and the same value bits, whichever path each call takes."""
    m, n, h, d, topk = 10, 140, 16, 64, 9
    inp = make_inputs(Problem(m, n, h, d), window="ragged", seed=6)
    edge_windows(inp, n)
    inp.ks[4], inp.ke[4] = 10, 120
    with tuning(config=SMALL):
        pos, val = run(inp, topk, positions="absolute", return_values=True)
    extra = torch.randn(37, d).to(torch.float8_e4m3fn)
    k2 = torch.cat([inp.k, extra])
    s2 = torch.cat([inp.k_scale, torch.rand(37) + 0.5])
    for row in (4, m - 1, 2):
        sl = slice(row, row + 1)
        for tun in ({}, {"stride": 4, "rank": 3, "capacity": 30}, {"stride": 8, "rank": 1, "capacity": 20}):
            with tuning(config=SMALL, **tun):
                alone = fp8_mqa_topk_triton(inp.q[sl], inp.k, inp.k_scale, inp.weights[sl], inp.ks[sl],
                                            inp.ke[sl], topk, positions="absolute", return_values=True)
                longer = fp8_mqa_topk_triton(inp.q[sl], k2, s2, inp.weights[sl], inp.ks[sl],
                                             inp.ke[sl].clamp(max=n), topk, positions="absolute",
                                             return_values=True)
            for p, v in (alone, longer):
                assert torch.equal(p[0], pos[row]), (row, tun)
                assert v is not None and val is not None
                assert torch.equal(v[0].view(torch.int32), val[row].view(torch.int32))
    with tuning(config=SMALL):  # a workspace that holds two rows at a time: many chunks
        chunked = run(inp, topk, positions="absolute", return_values=True,
                      workspace_bytes=2 * op.plan(m, n, h, d, topk, n, 1 << 30)["row_bytes"])
    assert torch.equal(chunked[0], pos)


@pytest.mark.orchestration
@pytest.mark.parametrize("filter", ["epilogue", "slices"])
def test_workspace_is_respected_on_a_run(interpret, filter):
    """A tight workspace: many chunks and rescoring in pieces, and the counted peak stays inside
    (with ``filter="slices"``, the logits slices included: they take what is left)."""
    m, n, h, d, topk = 12, 300, 16, 64, 8
    inp = make_inputs(Problem(m, n, h, d), window="causal", seed=7)
    with tuning(config=SMALL):
        want = run(inp, topk)[0]
    for tun in ({}, PATHS["sampled"], PATHS["undercount"], PATHS["overflow"]):
        per_row = op.plan(m, n, h, d, topk, n, 1 << 30, op.Tuning(**tun))["row_bytes"]
        budget = 3 * per_row
        paths = Paths()
        with tuning(config=SMALL, report=paths, **tun):
            got = run(inp, topk, workspace_bytes=budget, filter=filter)[0]
        assert torch.equal(got, want), tun
        assert paths.calls[0]["chunks"] >= 4
        # misjudged rows of every chunk are rescored together, after the last chunk
        assert (paths.fallback > 0) == (tun in (PATHS["undercount"], PATHS["overflow"])), (tun, paths.calls)
        assert max(paths.peaks) <= budget * (1 - op.HEADROOM), (paths.peaks, budget)  # the rest: torch's


def test_workspace_too_small_says_so(interpret):
    inp = make_inputs(Problem(2, 50, 16, 64), window="full", seed=8)
    with pytest.raises(ValueError, match="workspace_bytes"), tuning(config=SMALL):
        run(inp, 8, workspace_bytes=1000)


@pytest.mark.parametrize("m,n,topk,h", [(1024, 2**20, 2048, 64), (4096, 131072, 2048, 64), (64, 2**30, 2048, 64),
                                        (8, 2**20, 512, 32), (1, 5000, 2048, 64), (4096, 4096, 2048, 64)])
def test_plan_fits_the_workspace_for_any_n(m, n, topk, h):
    budget = 256 << 20
    p = op.plan(m, n, h, 128, topk, n, budget)
    assert p["rows"] >= 1 and p["rows"] * p["row_bytes"] <= budget, p
    s, r, cap = p["stride"], p["rank"], p["capacity"]
    if s:
        assert r - 4 * math.sqrt(r) >= topk / s - 1e-9 and cap >= r * s + 6 * s * math.sqrt(r) - 16
    piece, per = op._rescore_plan(m, n, topk, h, 128, budget)
    assert per * (h * 128 + 4 * h + 64 + 32 * topk + (8 + op.SELECT_BYTES_PER_CELL) * (topk + piece)) <= budget


def test_sample_plan_rule():
    assert op.sample_plan(2048, 131072, op.Tuning()) == (32, 105, 5328)
    assert op.sample_plan(2048, 6000, op.Tuning())[0] == 0  # W < 4 topk: no sample, dense
    s, r, cap = op.sample_plan(2048, 2**20, op.Tuning())
    assert s == 64 and cap < 10000


def test_bad_arguments(interpret):
    inp = make_inputs(Problem(3, 30, 16, 64), seed=9)
    with pytest.raises(ValueError, match="topk"):
        run(inp, 0)
    with pytest.raises(ValueError, match="positions"):
        run(inp, 4, positions="global")


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inp = make_inputs(Problem(2, 16, 16, 64), seed=1)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        run(inp, 4)


def test_select_plugs_in(interpret):
    """A plugged ``select`` sees fp32 candidate matrices and its answer is used."""
    seen = []

    def spy(logits, ks, ke, topk, *, positions="relative", out=None, values=None):
        seen.append((logits.dtype, logits.shape, positions))
        return select_topk_torch(logits, ks, ke, topk, positions=positions, out=out, values=values)

    inp = make_inputs(Problem(5, 120, 16, 64), window="causal", seed=10)
    with tuning(config=SMALL, stride=4, rank=4, capacity=30):
        a = run(inp, 6)[0]
        b = run(inp, 6, select=spy)[0]
    assert torch.equal(a, b) and seen and all(dt == torch.float32 for dt, _, _ in seen)


# ---- the default select on its own ----------------------------------------------------------------

def test_select_contract():
    x = torch.tensor([[1.0, -0.0, 0.0, float("nan"), float("-inf"), 3.0, 3.0, -2.0]])
    ks, ke = torch.tensor([0]), torch.tensor([8])
    pos, val = select_topk_torch(x, ks, ke, 8, values=torch.empty(1, 8))
    # 3 (5), 3 (6), 1 (0), -0 (1) == +0 (2), -2 (7), -inf (4), NaN (3); ascending positions
    assert pos.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    pos, _ = select_topk_torch(x, ks, ke, 4)
    assert pos.tolist() == [[0, 1, 5, 6]]  # -0.0 (1) beats +0.0 (2) only by position
    pos, _ = select_topk_torch(x, ks, ke, 6)
    assert pos.tolist() == [[0, 1, 2, 5, 6, 7]]  # -2 above -inf and NaN
    pos, _ = select_topk_torch(x, ks, ke, 7)
    assert pos.tolist() == [[0, 1, 2, 4, 5, 6, 7]]
    pos, val = select_topk_torch(x, torch.tensor([2]), torch.tensor([5]), 4, positions="absolute",
                                 values=torch.empty(1, 4))
    assert pos.tolist() == [[2, 3, 4, -1]] and val is not None and val[0, 3] == float("-inf")


def test_select_matches_the_oracle_on_strided_rows():
    g = torch.Generator().manual_seed(0)
    base = torch.randint(-3, 4, (9, 50), generator=g).float()  # many ties
    x = base[:, 3:43]  # row stride 50, width 40
    ks = torch.randint(-5, 30, (9,), generator=g)
    ke = ks + torch.randint(-3, 30, (9,), generator=g)
    for positions in ("relative", "absolute"):
        for topk in (1, 6, 40, 45):
            want, want_val = oracle(x.double(), ks, ke, topk, positions)
            out = torch.full((9, topk), 99, dtype=torch.int32)
            vals = torch.full((9, topk), 99.0)
            pos, val = select_topk_torch(x, ks, ke, topk, positions=positions, out=out, values=vals)
            assert pos is out and torch.equal(out, want) and torch.equal(vals.double(), want_val)


# ---- ahead-of-time builds --------------------------------------------------------------------------

def _build(target: str, h: int = 64) -> dict[str, Any]:
    skip_unless_buildable(target)
    return op.compile_filter_for(target, h=h)


def test_aot_sm90_qgmma_no_spills():
    from mqa_provider_gluon import aot

    facts = aot.sass_facts(_build("sm_90"))
    print(f"filter kernel sm_90: {facts}")
    assert facts.qgmma > 0 and facts.hgmma == 0 and facts.mma_other == 0, facts
    assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    assert facts.registers <= 168, facts  # three 128-thread programs per SM


@pytest.mark.parametrize("target,op_re", [("gfx942", r"v_mfma_f32_(32x32x16|16x16x32)_fp8_fp8$"),
                                          ("gfx950", r"v_mfma_f32_32x32x64_f8f6f4$")])
def test_aot_amd_fp8_mfma_no_spills(target, op_re):
    import re

    from mqa_provider_gluon import aot

    asm = _build(target)
    formats = aot.mfma_formats(asm)
    assert formats and all(re.match(op_re, o) for o, _, _ in formats), formats
    if target == "gfx950":
        assert set(formats) == {("v_mfma_f32_32x32x64_f8f6f4", "fp8 e4m3", "fp8 e4m3")}, formats
    facts = aot.amd_facts(asm)
    print(f"filter kernel {target}: {facts}")
    assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts


@pytest.mark.parametrize("target,block", [("sm_90", None), ("sm_90", 128), ("gfx942", None), ("gfx950", None)])
def test_aot_slice_filter_streams_without_barriers(target, block):
    """The slice filter kernel (``filter="slices"``) builds for each target as the launcher calls it:
    one warp, a lane holding rows of 4 consecutive keys a step (two rows, 256 keys, on sm_90, one
    with ``Tuning.slice_block`` 128; one, 256 keys, on AMD's 64-lane waves), the loop's loads 16 bytes
    wide (a load a row for the step and the two ahead, the partial first and last steps masked), one
    atomic a step kind, no spills. On sm_90: at most 96 registers (64 at 128 and 72 at 256 with
    triton 3.6), the loop over whole steps at most 1.3 instructions a key (0.92 and 0.86 with triton
    3.6, the device's), and one atomic a step whose result is the only thing that goes through
    shared memory: the scans are shuffles.
    An early version (a 256-key step, 8 keys a lane in two 4-key pieces) took 2.3 instructions a
    key: its scan went through shared memory with six barriers a step, and an H100 run put its
    stream near 0.5 TB/s, where one read of the logits at HBM speed was the plan."""
    import re

    from mqa_provider_gluon import aot

    skip_unless_buildable(target)
    with tuning(slice_block=block):
        asm = op.compile_small_kernel_for(target, "slices")
    if target == "sm_90":
        facts = aot.sass_facts(asm)
        sass = aot.sass(asm)
        print(f"slice filter sm_90: {facts}")
        assert facts.spill_stores == 0 and facts.spill_loads == 0 and facts.registers <= 96, facts
        step = block or op.SLICE_BLOCK
        rows = step // 128  # 16-byte loads a lane a step
        assert sass.count("LDG.E.128") == 3 * rows and sass.count("ATOMG.E.ADD") == 3, sass.count("ATOMG")
        loops = [(int(m.group(2), 16), int(m.group(1), 16)) for m in
                 re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?P\d\s+)?BRA\s+0x([0-9a-f]+)", sass)
                 if int(m.group(2), 16) < int(m.group(1), 16)]  # backward branches: the loop
        assert len(loops) == 1, loops
        body = sass[sass.index(f"/*{loops[0][0]:04x}*/"):sass.index(f"/*{loops[0][1]:04x}*/")]
        assert body.count("ATOMG.E.ADD") == 1 and body.count("LDG.E.128") == rows, body.count("LDG")
        shared = len(re.findall(r"\bSTS\b", body)), len(re.findall(r"\bLDS\b", body))
        print(f"slice filter sm_90: shared-memory stores and loads a step {shared}")
        if triton.__version__.startswith("3.6."):  # the device's; 3.9 scans through shared memory (13 STS)
            assert shared[0] <= 1 and shared[1] <= 1, shared
        per_key = (loops[0][1] - loops[0][0]) / 16 / step
        print(f"slice filter sm_90: {per_key:.2f} instructions a key")
        assert per_key <= 1.3, per_key
    else:
        facts = aot.amd_facts(asm)
        print(f"slice filter {target}: {facts}")
        assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts
        gcn = asm["amdgcn"]
        assert len(re.findall(r"(global|buffer)_load_dwordx4", gcn)) == 3 and "s_barrier" not in gcn
        assert len(re.findall(r"global_atomic_add", gcn)) == 3


# ---- real sizes on an NVIDIA GPU --------------------------------------------------------------------

def cuda_inputs(m: int, n: int, h: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random fp8 q [M, H, D] and k [N, D], scales in [0.1, 1), weights ~ H^-1/2, on the GPU; and the
    generator, for the windows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(m, h, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k = (torch.randn(n, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, device="cuda", generator=g) * 0.9 + 0.1
    w = torch.randn(m, h, device="cuda", generator=g) * h**-0.5
    return q, k, k_scale, w, g


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the interpreter tests above cover "
                    "the same code paths on the CPU")
@pytest.mark.parametrize("path", ["default", "undercount"])
def test_gpu_matches_dense_logits_and_topk(path):
    from mqa_provider_gluon.ops.mqa_logits_triton import fp8_mqa_logits_triton

    m, n, h, d, topk = 512, 16384, 64, 128, 2048
    q, k, k_scale, w, _ = cuda_inputs(m, n, h, d, seed=0)
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = (torch.arange(m, device="cuda") * 31 + 100).to(torch.int32)
    tun = {"stride": 32, "rank": 2} if path == "undercount" else {}
    paths = Paths()
    with tuning(report=paths, **tun):
        pos, val = fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, topk, return_values=True)
        again = fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, topk, return_values=True)
    assert torch.equal(pos, again[0]) and val is not None and again[1] is not None
    assert torch.equal(val.view(torch.int32), again[1].view(torch.int32))
    logits = fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke)
    want, want_val = select_topk_torch(logits, ks, ke, topk, values=torch.empty(m, topk, device="cuda"))
    # The same cell arithmetic in both kernels: identical selections and value bits.
    assert torch.equal(pos, want)
    assert want_val is not None and torch.equal(val.view(torch.int32), want_val.view(torch.int32))
    if path == "undercount":
        assert paths.fallback > 0


def fake_gluon_filter(q, k, k_scale, w, ks, ke, tau, cnt, pos, val, cap, *, config=None):
    """``fp8_mqa_filter_gluon``'s contract, executed in Python (the Gluon kernel runs on sm_90 only):
    reference values; a thresholded row's candidates appended in a shuffled order, as the kernel's
    atomics may hand out slots; a dense row's cell n at slot n - ks; the count may pass ``cap``."""
    logits = fp8_mqa_logits_ref(q, k, k_scale, w, ks, ke).float()
    g = torch.Generator().manual_seed(int(ks.sum()) + 1)
    for m in range(q.shape[0]):
        lo, hi = int(ks[m]), int(ke[m])
        if float(tau[m]) == float("-inf"):
            slots = [(n - lo, n) for n in range(lo, hi)]
        else:
            cells = [n for n in range(lo, hi) if bool(logits[m, n] >= tau[m])]
            cells = [cells[i] for i in torch.randperm(len(cells), generator=g).tolist()]
            base = int(cnt[m])
            cnt[m] = base + len(cells)
            slots = [(base + i, n) for i, n in enumerate(cells)]
        for slot, n in slots:
            if slot < cap:
                pos[m, slot] = n
                val[m, slot] = logits[m, n]


@pytest.mark.parametrize("path", list(PATHS))
def test_gluon_scorer_orchestration_takes_candidates_in_any_order(interpret, monkeypatch, path):
    """``scorer="gluon"`` runs the same orchestration on the Gluon kernels' contract. With that
    contract faked on the CPU (candidates in a shuffled order, as atomics give them), exact inputs
    (many ties) must still give the oracle's selection on every path, in both position modes."""
    from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g

    monkeypatch.setattr(g, "fp8_mqa_filter_gluon", fake_gluon_filter)
    monkeypatch.setattr(g, "fp8_mqa_logits_gluon", lambda q, k, k_scale, w, ks, ke, clean=True:
                        fp8_mqa_logits_ref(q, k, k_scale, w, ks, ke).float())
    m, n, h, d, window, topk = EXACT_CASES[0]
    inp = exact_inputs(m, n, h, d, seed=7, window=window)
    edge_windows(inp, n)
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    paths = Paths()
    for positions in ("relative", "absolute"):
        want_pos, want_val = oracle(ref, inp.ks, inp.ke, topk, positions)
        with tuning(poison=True, report=paths, **PATHS[path]):
            pos, val = run(inp, topk, positions=positions, return_values=True, scorer="gluon")
        assert torch.equal(pos, want_pos), (positions, pos, want_pos)
        assert val is not None and torch.equal(val.double(), want_val)
    if path in ("undercount", "overflow", "pieces"):
        assert paths.fallback > 0
    if path == "sampled":
        assert paths.total("sampled_rows") > 0 and paths.fallback == 0


@pytest.mark.parametrize("scorer", ["triton", "gluon", "slices"])
def test_ties_at_the_kth_value_go_to_the_smaller_positions(interpret, monkeypatch, small_slices, scorer):
    """Logits in five levels (k_scale = 1 + n % 5), so a row's k-th value is shared by many more
    candidates than are taken. The selection over the candidates breaks those ties by slot, and the
    Gluon filter's slots come in any order (faked here, shuffled): the ties kernel must swap the taken
    ties for the smallest positions on the device (no row rescored), in both position modes."""
    if scorer == "gluon":
        from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g

        monkeypatch.setattr(g, "fp8_mqa_filter_gluon", fake_gluon_filter)
        monkeypatch.setattr(g, "fp8_mqa_logits_gluon", lambda q, k, k_scale, w, ks, ke, clean=True:
                            fp8_mqa_logits_ref(q, k, k_scale, w, ks, ke).float())
    m, n, h, d, topk = 4, 150, 16, 64, 7
    inp = exact_inputs(m, n, h, d, seed=2, window="full")
    inp.q.fill_(1.0)
    inp.k.fill_(1.0)
    inp.weights.fill_(1 / (h * d))
    inp.k_scale.copy_(1.0 + torch.arange(n) % 5)
    inp.ks.copy_(torch.tensor([0, 3, 17, 40], dtype=torch.int32))
    inp.ke.copy_(torch.tensor([150, 140, 150, 149], dtype=torch.int32))
    ref = fp8_mqa_logits_ref(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    for positions in ("relative", "absolute"):
        paths = Paths()
        want_pos, want_val = oracle(ref, inp.ks, inp.ke, topk, positions)
        kw = {"filter": "slices"} if scorer == "slices" else {"scorer": scorer}
        with tuning(config=SMALL, report=paths, slice=40, **PATHS["sampled"]):
            pos, val = run(inp, topk, positions=positions, return_values=True, **kw)
        assert torch.equal(pos, want_pos), (positions, pos, want_pos)
        assert val is not None and torch.equal(val.double(), want_val)
        assert paths.total("tie_rows") == m and paths.fallback == 0, paths.calls


@pytest.mark.parametrize("seed", [0, 1])
def test_ties_kernel_takes_the_smallest_positions_among_ties(seed):
    """The ties kernel alone, against python sorting: candidates in shuffled slots with values in a
    few levels (every row tied at its k-th value, many times over), more winners than one step of
    the kernel (so the compaction carries across steps), rows not flagged left alone, and the
    winners as the selection over the slots left them (ties by slot) as its input."""
    gen = torch.Generator().manual_seed(seed)
    rows, cap, topk, n = 5, 3000, op.TIES_BLOCK + 300, 50_000
    pos = torch.stack([torch.randperm(n, generator=gen)[:cap] for _ in range(rows)]).int()
    val = torch.randint(0, 4, (rows, cap), generator=gen).float() * 0.5 - 1.0
    val[1] = torch.where(val[1] == -1.0, -0.0, 0.0)  # two levels only, -0.0 == +0.0: one tie class
    val[3] = torch.where(val[3] >= -0.5, float("inf"), 1.0)  # the k-th value +inf: padding (+inf) must not count
    nvalid = torch.tensor([cap, cap - 7, topk, cap - 1000, cap], dtype=torch.int32)
    flag = torch.tensor([1, 1, 1, 1, 0], dtype=torch.int32)
    idx = torch.empty(rows, topk, dtype=torch.int32)
    v = torch.empty(rows, topk)
    select_topk_torch(val, torch.zeros_like(nvalid), nvalid, topk, out=idx, values=v)
    got = pos.gather(1, idx.long())
    before, fixed = got.clone(), torch.full((rows,), -7, dtype=torch.int32)
    with op._interpreting():
        op.ties_kernel(True)[(rows,)](pos, val, nvalid, flag, got, v, fixed, pos.stride(0), v.stride(0), topk, n,
                                      CBLOCK=op.TIES_BLOCK, TBLOCK=op.TIES_BLOCK)
    for i in range(rows):
        cells = sorted(((float(val[i, j]), int(pos[i, j])) for j in range(int(nvalid[i]))), key=lambda c: (-c[0], c[1]))
        want = sorted(c[1] for c in cells[:topk])
        if flag[i] == 0:
            assert torch.equal(got[i], before[i]) and fixed[i] == 0
            continue
        assert sorted(got[i].tolist()) == want, i
        kept = dict(zip(pos[i].tolist(), val[i].tolist()))
        assert all(kept[p] == x for p, x in zip(got[i].tolist(), v[i].tolist())), i  # values travel with positions
        tied = sum(c[0] == cells[topk - 1][0] for c in cells) > sum(c[0] == cells[topk - 1][0] for c in cells[:topk])
        assert fixed[i] == int(tied), i
    assert fixed[:4].sum() >= 3  # the case is the tied one: the test would pass vacuously otherwise


def test_scorer_is_checked():
    inp = exact_inputs(3, 20, 16, 64, seed=1)
    with pytest.raises(ValueError, match="scorer"):
        run(inp, 4, scorer="cuda")
    with pytest.raises(ValueError, match="filter"):
        run(inp, 4, filter="fused")


def _gluon_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import gluon_supported

    return gluon_supported()


#: (tuning, whether rows must fall back): each forces a path of the orchestration with the Gluon scorer.
GLUON_PATHS = {
    "default": ({}, False),
    "undercount": ({"stride": 32, "rank": 2}, True),
    "overflow": ({"stride": 16, "rank": 64, "capacity": 600}, True),
    "pieces": ({"stride": 32, "rank": 2, "piece": 4096}, True),
}


@pytest.mark.cuda
@pytest.mark.skipif(_gluon_reason() is not None, reason=f"the Gluon scorer runs on sm_90 only: {_gluon_reason()}")
@pytest.mark.parametrize("filter", ["epilogue", "slices"])
@pytest.mark.parametrize("positions", ["relative", "absolute"])
@pytest.mark.parametrize("path", list(GLUON_PATHS))
def test_gpu_gluon_scorer_matches_dense_gluon_logits(path, positions, filter):
    """The candidates come from the Gluon kernel's filter epilogue, or from its logits in key slices
    (atomics: any order); the result must still be the exact selection over the Gluon logits kernel's
    values, bit for bit, on ragged windows (an empty row, windows shorter than topk, ks < 0 and
    ke > N), on every path, twice. Slices of 3000 keys: seven of them, windows crossing each."""
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon

    m, n, h, d, topk = 300, 20000, 64, 128, 512
    q, k, k_scale, w, g = cuda_inputs(m, n, h, d, seed=3)
    ks = torch.randint(-50, n // 2, (m,), device="cuda", generator=g).int()
    ke = (ks + torch.randint(0, n, (m,), device="cuda", generator=g)).clamp(max=n + 30).int()
    ks[0], ke[0] = 7, 7
    ks[1], ke[1] = 100, 100 + topk // 3
    ks[2], ke[2] = -9, n + 9
    tun, falls_back = GLUON_PATHS[path]
    paths = Paths()
    with tuning(report=paths, poison=True, slice=3000, **tun):
        pos, val = fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, topk, positions=positions, return_values=True,
                                       scorer="gluon", filter=filter)
        again, again_val = fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, topk, positions=positions,
                                               return_values=True, scorer="gluon", filter=filter)
    assert torch.equal(pos, again) and val is not None and again_val is not None
    assert torch.equal(val.view(torch.int32), again_val.view(torch.int32))
    logits = fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke)
    want, want_val = select_topk_torch(logits, ks, ke, topk, positions=positions,
                                       values=torch.empty(m, topk, device="cuda"))
    assert torch.equal(pos, want)
    assert want_val is not None and torch.equal(val.view(torch.int32), want_val.view(torch.int32))
    assert (paths.fallback > 0) == falls_back
    assert paths.total("sampled_rows") > 0


@pytest.mark.cuda
@pytest.mark.skipif(_gluon_reason() is not None, reason=f"the Gluon scorer runs on sm_90 only: {_gluon_reason()}")
@pytest.mark.parametrize("filter", ["epilogue", "slices"])
def test_gpu_gluon_scorer_exact_inputs_tie_rule(filter):
    """Small-integer inputs: exact fp32 logits with many ties across tiles and candidate slots. The
    atomics hand out slots in any order; ties must still go to the smaller position."""
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon

    m, n, h, d, topk = 64, 6000, 64, 128, 64
    inp = exact_inputs(m, n, h, d, seed=5)
    cu = [t.cuda() for t in (inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)]
    with tuning(stride=8, rank=16, slice=1024):
        pos, _ = fp8_mqa_topk_triton(*cu, topk, scorer="gluon", filter=filter)
    logits = fp8_mqa_logits_gluon(*cu)
    want, _ = oracle(logits.cpu(), inp.ks, inp.ke, topk)
    assert torch.equal(pos.cpu(), want)


def test_auto_path_takes_slices_where_two_stage_chunks_are_thin():
    """The gluon provider's default picks by the keys and the workspace, not the rows: at the default
    256 MiB, 1M keys leave a two-stage chunk 31 rows and 128k keys 252 (both sliced), 64k keys 504
    (two-stage); a smaller workspace moves the border down, and the batch never moves it."""
    from mqa_provider_gluon import kernels

    mib = 1 << 20
    assert kernels.GLUON_PREFILL_TOPK == "auto"
    assert kernels.prefill_topk_path(1 << 20, 2048, 256 * mib) == "sliced"
    assert kernels.prefill_topk_path(128 << 10, 2048, 256 * mib) == "sliced"
    assert kernels.prefill_topk_path(128 << 10, 512, 256 * mib) == "sliced"
    assert kernels.prefill_topk_path(64 << 10, 2048, 256 * mib) == "two-stage"
    assert kernels.prefill_topk_path(64 << 10, 2048, 32 * mib) == "sliced"
    border = 128 * mib // 4 // kernels.SLICED_BELOW_ROWS - 2048  # keys at which a chunk holds exactly the border
    assert kernels.prefill_topk_path(border, 2048, 256 * mib) == "two-stage"
    assert kernels.prefill_topk_path(border + 1, 2048, 256 * mib) == "sliced"


def test_aot_sm90_gluon_filter_epilogue():
    """The Gluon filter kernel builds for sm_90 with the logits kernel's wgmma (16 QGMMA, as the logits
    kernel) and one atomic per row and tile in each math warpgroup (banks of 2 rows: 4 in all)."""
    from mqa_provider_gluon import aot
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import _triton_version_reason, compile_sm90

    skip_unless_buildable("sm_90")
    if _triton_version_reason():
        pytest.skip(str(_triton_version_reason()))
    c = compile_sm90(64, 128, clean_logits=False, divisible=("out_stride", "N"), candidates=True)
    asm = dict(c.asm)
    asm["metadata"] = c.metadata
    facts = aot.sass_facts(asm)
    assert facts.qgmma == 16, facts
    assert aot.sass(asm).count("ATOMG.E.ADD") == 4
