"""topk_per_row_triton against an exact reference: interpreter on small rows (both the sampled-candidate
path and the whole-window fallback), ahead-of-time builds for sm_90 / gfx942 / gfx950, GPU at size."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from aot_targets import skip_unless_buildable  # noqa: E402
from mqa_provider_gluon.ops import topk_triton as op  # noqa: E402
from mqa_provider_gluon.ops.topk_triton import TopkConfig, topk_per_row_triton, workspace_bytes  # noqa: E402

POISON_POS, POISON_VAL = 12345, float("nan")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def reference(x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int,
              absolute: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, values) by a stable sort in float64: non-NaN first, value descending (so -0.0 == +0.0
    and -inf is an ordinary value), position ascending; the first topk, then sorted by position."""
    m, n = x.shape
    pos = torch.full((m, topk), -1, dtype=torch.int32)
    val = torch.full((m, topk), float("-inf"), dtype=torch.float32)
    for r in range(m):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), n)
        if lo >= hi:
            continue
        v = x[r, lo:hi].double().numpy()
        nan = np.isnan(v)
        order = np.lexsort((np.arange(hi - lo), -np.where(nan, 0.0, v), nan))[:topk]
        sel = np.sort(order)
        pos[r, :len(sel)] = torch.from_numpy(sel + (lo if absolute else 0)).to(torch.int32)
        val[r, :len(sel)] = x[r, lo:hi][torch.from_numpy(sel)].float()
    return pos, val


def run(x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, absolute: bool = False,
        config: TopkConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (positions, values), into buffers poisoned so that unwritten cells show."""
    out = torch.full((x.shape[0], topk), POISON_POS, dtype=torch.int32)
    val = torch.full((x.shape[0], topk), POISON_VAL, dtype=torch.float32)
    ret = topk_per_row_triton(x, ks, ke, topk, positions="absolute" if absolute else "relative", out=out,
                              values=val, config=config)
    assert ret is out
    return out, val


def check(x, ks, ke, topk, absolute=False, config=None):
    out, val = run(x, ks, ke, topk, absolute, config)
    ref_pos, ref_val = reference(x, ks, ke, topk, absolute)
    bad = (out != ref_pos).any(1).nonzero().flatten().tolist()
    assert not bad, (f"rows {bad[:5]} differ; first: got {out[bad[0]].tolist()[:16]} "
                     f"want {ref_pos[bad[0]].tolist()[:16]}")
    # values: bitwise the logits as fp32 (NaN where a NaN was selected), -inf in the tail
    assert torch.equal(val.view(torch.int32), ref_val.view(torch.int32)) or torch.equal(
        torch.nan_to_num(val, nan=7.0), torch.nan_to_num(ref_val, nan=7.0))
    return out, val


def windows(m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged windows with the edge cases in: empty (lo == hi and lo > hi), ks < 0, ke > N, short, full."""
    g = torch.Generator().manual_seed(seed)
    ks = torch.randint(-20, n // 2, (m,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(0, n, (m,), generator=g, dtype=torch.int32)
    fixed = [(0, n), (5, 5), (9, 3), (-7, n + 9), (n - 4, n + 100), (0, 1)]
    for i, (a, b) in enumerate(fixed[:m]):
        ks[i], ke[i] = a, b
    return ks, ke


TINY = dict(block=256, num_warps=4, filter_block=256)  # small blocks: several a row
SMALL = TopkConfig(**TINY, max_programs=3)  # several blocks per row, programs striding rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("absolute", [False, True])
@pytest.mark.parametrize("n,topk", [(700, 37), (700, 1), (300, 512)])
def test_random_rows(interpret, dtype, absolute, n, topk):
    g = torch.Generator().manual_seed(n + topk)
    x = torch.randn(9, n, generator=g).to(dtype)
    ks, ke = windows(9, n, seed=topk)
    check(x, ks, ke, topk, absolute, SMALL)


@pytest.mark.parametrize("absolute", [False, True])
def test_windows_no_longer_than_topk_are_taken_whole(interpret, absolute):
    """A window of at most topk keys skips the radix passes (every key is selected): positions in
    order, NaN, -inf, -0.0 and ties kept as they are; one key longer still selects."""
    n, topk = 700, 300
    g = torch.Generator().manual_seed(13)
    x = torch.randn(7, n, generator=g)
    x[:, 10:40] = 1.5  # ties
    x[:, 50] = float("nan")
    x[:, 60:70] = float("-inf")
    x[:, 80] = -0.0
    ks = torch.tensor([0, 3, 100, 0, 5, 400, 699], dtype=torch.int32)
    ke = torch.tensor([topk, 3 + topk - 1, 100 + topk + 1, 1, 5 + topk, n, n], dtype=torch.int32)
    out, _ = check(x, ks, ke, topk, absolute, SMALL)
    whole = (ke - ks).clamp(max=topk)
    for r in range(7):
        first = int(ks[r]) if absolute else 0
        if int(ke[r] - ks[r]) <= topk:
            assert out[r, :whole[r]].tolist() == list(range(first, first + int(whole[r])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [1, 64, 700])
def test_long_rows_take_the_candidate_path(interpret, dtype, topk):
    """Windows longer than CAP (2048 for topk <= 512): the sampled threshold and the filter run."""
    n = 6000
    assert n > op.plan(4, n, topk).cap or topk == 700
    g = torch.Generator().manual_seed(topk)
    x = torch.randn(4, n, generator=g).to(dtype)
    ks = torch.tensor([0, -3, 100, 2500], dtype=torch.int32)
    ke = torch.tensor([n, n + 5, 5900, 5000], dtype=torch.int32)
    check(x, ks, ke, topk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [TopkConfig(**TINY), TopkConfig(**TINY,
                                                                                    split_target=64)])
def test_thresholds_of_every_sign(interpret, dtype, config):
    """The filter compares floats against the threshold key's float: negative thresholds (all-negative
    rows), thresholds among zeros of both signs, at -inf, and at the NaN key 0 (a row mostly NaN,
    where every key passes); windows that start and end off the 16-byte grid."""
    n, topk = 6000, 64
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, n, generator=g)
    x[0] = -x[0].abs() - 1.0  # every logit negative
    x[1] = torch.where(torch.rand(n, generator=g) < 0.5, -0.0, 0.0)  # zeros of both signs
    x[1, ::97] = 1.0
    x[2] = float("-inf")
    x[2, ::101] = -1.0
    x[3] = float("nan")
    x[3, ::13] = torch.randn(len(range(0, n, 13)), generator=g)
    x[4, ::2] = float("nan")
    x = x.to(dtype)
    ks = torch.tensor([3, 0, 1, 0, 5, 2], dtype=torch.int32)
    ke = torch.tensor([n - 1, n, n - 3, n, 5997, 4099], dtype=torch.int32)
    check(x, ks, ke, topk, config=config)


@pytest.mark.orchestration
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_filter_gives_the_unsplit_result(interpret, dtype):
    """Few long rows (decode): each window is filtered in segments by their own programs, then
    gathered in segment order; ragged windows, a tie-heavy row that overflows (whole-window
    fallback) and an empty one in the batch. The result is the reference's, whatever the split."""
    n, topk = 9000, 100
    g = torch.Generator().manual_seed(21)
    x = torch.randn(4, n, generator=g).to(dtype)
    x[2] = torch.randint(0, 2, (n,), generator=g).to(dtype)  # ties: the guess overflows CAP
    ks = torch.tensor([0, 700, 0, 50], dtype=torch.int32)
    ke = torch.tensor([n, 8123, n, 50], dtype=torch.int32)
    cfg = TopkConfig(**TINY, split_target=64)
    assert op.plan(4, n, topk, cfg).split == 8
    full, _ = check(x, ks, ke, topk, config=cfg)
    for other in (TopkConfig(**TINY, split_target=1),  # the select kernel filters
                  TopkConfig(**TINY, split_target=1, ahead=1),  # one block in flight, not two
                  TopkConfig(block=256, num_warps=4, split_target=1, filter_block=128),
                  TopkConfig(**TINY, split_target=1, separate=True)):  # one segment
        assert op.plan(4, n, topk, other).split == (1 if other.separate else 0)
        assert torch.equal(run(x, ks, ke, topk, config=other)[0], full)


def test_negative_thresholds_keep_the_candidate_path(interpret):
    """A result cannot show a threshold that is off (candidates outside [K, CAP] fall back to the whole
    window, just as exact): the counts can. All-negative and all-positive rows land in range, and so
    does a row packed near one value (mean 1000 spread 0.05: one 16-bit key bucket holds it all)."""
    n, topk = 9000, 64
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, n, generator=g).abs() + 1.0
    x[0] = -x[0]
    x[2] = 1000.0 + 0.05 * torch.randn(n, generator=g)
    cfg = TopkConfig(**TINY, separate=True)  # the filter kernel: its counts are kept
    p = op.plan(3, n, topk, cfg)
    ws = torch.full((workspace_bytes(3, n, topk, config=cfg),), 255, dtype=torch.uint8)
    ks, ke = torch.tensor([1, 0, 7], dtype=torch.int32), torch.tensor([n, n - 3, n], dtype=torch.int32)
    out = topk_per_row_triton(x, ks, ke, topk, workspace=ws, config=cfg)
    assert torch.equal(out, reference(x, ks, ke, topk)[0])
    counts = ws[-3 * p.split * 4:].view(torch.int32).view(3, p.split).sum(1)
    assert all(topk <= c <= p.cap for c in counts.tolist()), counts


def test_the_benchs_guess_model_is_the_kernels(interpret, monkeypatch):
    """``bench/h200_indexer.py --counts`` explains slow rows with a torch model of the threshold
    guess: its candidate counts must be the filter kernel's, row for row."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "bench" / "h200_indexer.py"
    spec = importlib.util.spec_from_file_location("h200_indexer", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "h200_indexer", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    n, topk = 9000, 64
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, n, generator=g) * torch.tensor([[1.0], [30.0], [0.01]]) + torch.linspace(0, 2, n)
    ks, ke = torch.tensor([0, 123, 5], dtype=torch.int32), torch.tensor([n, n - 40, 7777], dtype=torch.int32)
    cfg = TopkConfig(**TINY, separate=True)
    p = op.plan(3, n, topk, cfg)
    ws = torch.full((workspace_bytes(3, n, topk, config=cfg),), 255, dtype=torch.uint8)
    topk_per_row_triton(x, ks, ke, topk, workspace=ws, config=cfg)
    got = ws[-3 * p.split * 4:].view(torch.int32).view(3, p.split).sum(1).tolist()
    model = []
    for r in range(3):
        w = x[r, int(ks[r]):int(ke[r])]
        model.append(int((bench._keys_int(w) >= bench.guess_model(w, p.aim, p.sample)).sum()))
    assert got == model and all(topk <= c <= p.cap for c in got), (got, model)


def test_segments_hold_the_candidates_in_position_order(interpret):
    """The split filter's segment lists, concatenated, are the candidates in ascending position order."""
    n, topk = 9000, 64
    x = torch.randn(1, n, generator=torch.Generator().manual_seed(4))
    cfg = TopkConfig(**TINY, split_target=16)
    p = op.plan(1, n, topk, cfg)
    ws = torch.full((workspace_bytes(1, n, topk, config=cfg),), 255, dtype=torch.uint8)
    topk_per_row_triton(x, torch.tensor([0], dtype=torch.int32), torch.tensor([n], dtype=torch.int32), topk,
                        workspace=ws, config=cfg)
    counts = ws[-p.split * 4:].view(torch.int32).tolist()
    segs = ws[p.cap * 4:p.cap * 4 * (1 + p.split)].view(torch.int32).view(p.split, p.cap)
    cand = torch.cat([segs[i, :c] for i, c in enumerate(counts)])
    assert p.split == 8 and all(c > 0 for c in counts) and topk <= len(cand) <= p.cap
    assert bool((cand.diff() > 0).all())
    assert torch.equal(cand, ws[:len(cand) * 4].view(torch.int32))  # gathered as they are


def test_candidates_really_fill_the_workspace(interpret):
    """Random rows fit the guess: the workspace holds candidate positions in ascending order."""
    n, topk = 6000, 64
    x = torch.randn(1, n, generator=torch.Generator().manual_seed(3))
    ws = torch.full((workspace_bytes(1, n, topk),), 255, dtype=torch.uint8)
    out = topk_per_row_triton(x, torch.tensor([0], dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
                              topk, workspace=ws)
    cap = op.plan(1, n, topk).cap
    cand = ws[:cap * 4].view(torch.int32)
    cand = cand[cand != -1]
    assert topk <= len(cand) <= cap and bool((cand.diff() > 0).all())
    assert set(out[0].tolist()) <= set(cand.tolist())


@pytest.mark.parametrize("n", [300, 6000])
@pytest.mark.parametrize("levels", [1, 3])
def test_many_ties(interpret, n, levels):
    """Small integers: long runs of equal keys at the threshold (ties to the smaller position); at
    n=6000 with one level the guess overflows the workspace and the whole-window fallback runs."""
    g = torch.Generator().manual_seed(n + levels)
    x = torch.randint(0, levels, (5, n), generator=g).float()
    ks, ke = windows(5, n, seed=levels)
    for topk in (1, 50, 2100):
        check(x, ks, ke, topk, config=SMALL if n < 1000 else None)


@pytest.mark.parametrize("n", [200, 5000])
def test_all_neg_inf_rows_yield_their_first_positions(interpret, n):
    x = torch.full((3, n), float("-inf"))
    x[1, 7] = -1e30  # one finite key wins, the rest in position order
    ks = torch.tensor([0, 0, 10], dtype=torch.int32)
    ke = torch.tensor([n, n, n], dtype=torch.int32)
    out, val = check(x, ks, ke, 40)
    assert out[0].tolist() == list(range(40))
    assert out[2].tolist() == list(range(40))  # relative to lo = 10


@pytest.mark.parametrize("n", [300, 5000])
def test_nan_ranks_below_everything(interpret, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(4, n, generator=g)
    x[0, ::3] = float("nan")
    x[1, :] = float("nan")
    x[1, 100:105] = float("-inf")  # -inf beats NaN
    x[2, ::2] = float("-inf")
    x[2, 1::2] = float("nan")
    x[3, :n // 2] = -float("nan")  # NaN with the sign bit set is still lowest
    ks = torch.zeros(4, dtype=torch.int32)
    ke = torch.full((4,), n, dtype=torch.int32)
    out, _ = check(x, ks, ke, 33)
    assert out[1].tolist() == list(range(28)) + list(range(100, 105))


@pytest.mark.parametrize("n", [300, 5000])
def test_negative_zero_ties_with_positive_zero(interpret, n):
    x = torch.full((2, n), -1.0)
    x[0, 0::2] = -0.0
    x[0, 1::2] = 0.0
    x[1, : n // 2] = 0.0
    x[1, n // 2:] = -0.0  # the +0.0 half comes first, but equal keys just go by position
    x[1, -1] = 1e-45  # the smallest denormal beats both zeros
    ks = torch.tensor([0, 3], dtype=torch.int32)
    ke = torch.tensor([n, n], dtype=torch.int32)
    out, val = check(x, ks, ke, 10)
    assert out[0].tolist() == list(range(10))
    assert out[1].tolist() == list(range(9)) + [n - 1 - 3]


def test_row_stride_and_extra_columns(interpret):
    """A row's result depends only on its window: alone, inside a batch, in a wider (strided) tensor
    with other data past the window, and for any config (block size, grid)."""
    n, topk = 5000, 100
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, n, generator=g)
    ks, ke = windows(6, n, seed=11)
    ks[2], ke[2] = 17, 4321
    full, _ = check(x, ks, ke, topk)
    wide = torch.randn(6, n + 900, generator=g)
    wide[:, :n] = x
    wide[2, 4321:] = 1e9  # beyond row 2's window: must not be picked
    strided = wide[:, :n]
    assert strided.stride(0) == n + 900
    out_s, _ = check(strided, ks, ke, topk)
    assert torch.equal(out_s, full)
    alone, _ = run(x[2:3].clone(), ks[2:3].clone(), ke[2:3].clone(), topk)
    assert torch.equal(alone[0], full[2])
    also_wide, _ = run(wide[2:3], ks[2:3].clone(), ke[2:3].clone(), topk)
    assert torch.equal(also_wide[0], full[2])
    for cfg in (SMALL, TopkConfig(block=1024, num_warps=8, max_programs=1),
                TopkConfig(separate=True, filter_block=2048)):
        assert torch.equal(run(x, ks, ke, topk, config=cfg)[0], full)


def test_repeat_is_bitwise_equal_and_inputs_untouched(interpret):
    n = 3000
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(5))
    x[0, :100] = 2.0  # ties at the threshold
    ks, ke = windows(5, n, seed=5)
    before = (x.clone(), ks.clone(), ke.clone())
    a = run(x, ks, ke, 80)
    b = run(x, ks, ke, 80)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32))
    assert all(torch.equal(p, q) for p, q in zip(before, (x, ks, ke)))


def test_allocates_out_when_not_given(interpret):
    x = torch.randn(3, 50)
    ks, ke = torch.zeros(3, dtype=torch.int32), torch.full((3,), 50, dtype=torch.int32)
    out = topk_per_row_triton(x, ks, ke, 60)
    assert out.shape == (3, 60) and out.dtype == torch.int32
    assert out[:, :50].tolist() == [list(range(50))] * 3 and (out[:, 50:] == -1).all()
    assert topk_per_row_triton(x[:0], ks[:0], ke[:0], 4).shape == (0, 4)


def test_workspace_is_a_function_of_the_shape():
    cap = op.plan(8, 131072, 2048).cap
    assert cap == 8192
    assert workspace_bytes(8, 8192, 2048) == 0  # every window fits CAP: no filter, no workspace
    assert op.plan(8, 131072, 2048).split == 16  # 256 // 8 = 32 programs a row, at most one per 4 filter blocks
    assert op.plan(1, 131072, 2048).split == 16  # 131072 // (4 * 2048)
    assert workspace_bytes(8, 131072, 2048) == 8 * cap * 8 + 8 * 16 * (cap * 8 + 4)
    assert op.plan(300, 131072, 2048).split == 0 and op.plan(8, 8192, 2048).split == 0
    assert workspace_bytes(8, 131072, 2048, config=TopkConfig(split_target=8)) == 8 * cap * 8
    assert op.plan(300, 131072, 2048, TopkConfig(separate=True)).split == 1
    assert workspace_bytes(300, 131072, 2048, config=TopkConfig(separate=True)) == 300 * cap * 8 * 2 + 300 * 4
    assert workspace_bytes(4096, 131072, 2048) == 512 * cap * 8
    assert workspace_bytes(4096, 131072, 2048, torch.bfloat16) == 512 * cap * 6
    assert workspace_bytes(0, 131072, 2048) == 0


@pytest.mark.parametrize("bad", [
    dict(topk=0), dict(positions="rel"), dict(ks_dtype=torch.int64), dict(out_dtype=torch.int64),
    dict(x_dtype=torch.float16), dict(workspace=1),
])
def test_bad_arguments_raise(interpret, bad):
    x = torch.randn(2, 3000).to(bad.get("x_dtype", torch.float32))
    ks = torch.zeros(2, dtype=bad.get("ks_dtype", torch.int32))
    ke = torch.full((2,), 3000, dtype=torch.int32)
    out = torch.empty(2, bad.get("topk", 4) or 1, dtype=bad.get("out_dtype", torch.int32))
    ws = torch.empty(bad["workspace"], dtype=torch.uint8) if "workspace" in bad else None
    with pytest.raises(ValueError):
        topk_per_row_triton(x, ks, ke, bad.get("topk", 4), positions=bad.get("positions", "relative"), out=out,
                            workspace=ws)


# ---- ahead of time: the sm_90 / gfx942 / gfx950 builds ---------------------------------------

@functools.cache
def build(target: str, dtype: torch.dtype, topk: int, name: str = "select", split: int = 0):
    skip_unless_buildable(target)
    return op.compile_for(target, dtype=dtype, topk=topk, name=name, split=split)


# the select kernel filtering itself, the one gathering 16 segments, and the segment filter
KERNELS = [("select", 0), ("select", 16), ("filter", 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [512, 2048])
@pytest.mark.parametrize("name,split", KERNELS)
def test_sm90_build_has_no_spills(dtype, topk, name, split):
    from mqa_provider_gluon import aot

    asm = build("sm_90", dtype, topk, name, split)
    facts = aot.sass_facts(asm)
    assert facts.registers <= 128, facts  # two 8-warp programs per SM
    if name == "filter":
        assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    else:  # capped at op.SELECT_MAXNREG, it keeps a few per-row values in local memory, never in a loop
        for body in _innermost_loops(aot.sass(asm)):  # over elements
            assert not any("STL" in ins or "LDL" in ins for ins in body), "\n".join(body)


def _innermost_loops(sass: str) -> list[list[str]]:
    """The instructions of each loop (a backward branch's range) that holds no other loop."""
    import re

    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,5}\*/", ln)]
    addr = [int(re.search(r"/\*([0-9a-f]{4,5})\*/", ln).group(1), 16) for ln in lines]
    spans = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i] and int(m.group(1), 16) in addr:
            spans.append((addr.index(int(m.group(1), 16)), i))
    inner = [(a, b) for a, b in spans if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    assert inner, "no loop found in the SASS"
    return [lines[a:b + 1] for a, b in inner]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,split", KERNELS)
def test_amd_build_has_no_vgpr_spills(target, dtype, name, split):
    from mqa_provider_gluon import aot

    facts = aot.amd_facts(build(target, dtype, 2048, name, split))
    assert facts.vgpr_spills == 0 and facts.scratch_bytes == 0, facts


# ---- on the GPU at size ------------------------------------------------------------------------

def _gpu_reference(x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, rows: list[int]) -> torch.Tensor:
    """Exact on the GPU: unique int64 keys (order key, then -position), torch.topk, sort."""
    n = x.shape[1]
    out = torch.full((len(rows), topk), -1, dtype=torch.int32, device=x.device)
    for j, r in enumerate(rows):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), n)
        if lo >= hi:
            continue
        v = x[r, lo:hi].float()
        v = torch.where(v == 0, torch.zeros_like(v), v)
        b = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        key = torch.where(b >= 2**31, 0xFFFFFFFF - b, b + 2**31)
        key = torch.where(v.isnan(), torch.zeros_like(key), key)
        pos = torch.arange(hi - lo, device=x.device)
        k = min(topk, hi - lo)
        out[j, :k] = torch.topk((key - 2**31) * 2**32 + (2**32 - 1 - pos), k).indices.sort().values.to(torch.int32)
    return out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m,n,topk,prefill", [(4096, 131072, 2048, True), (4096, 131072, 512, True),
                                              (128, 131072, 2048, False), (64, 65536, 2048, False),
                                              (8, 131072, 2048, False), (8, 131072, 512, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_large_matches_reference(m, n, topk, prefill, dtype):
    g = torch.Generator(device="cuda").manual_seed(m + topk)
    x = torch.randn(m, n, device="cuda", generator=g)
    x[0, :] = 1.0  # a row of ties: the whole-window fallback
    x[1, ::2] = float("nan")
    x = x.to(dtype)
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = ((n - m + torch.arange(m, device="cuda") + 1) if prefill
          else (n - torch.randint(0, 1024, (m,), device="cuda", generator=g))).to(torch.int32)
    ks[2], ke[2] = 100, 100 + topk // 2  # shorter than topk
    out = torch.full((m, topk), POISON_POS, dtype=torch.int32, device="cuda")
    topk_per_row_triton(x, ks, ke, topk, out=out)
    rows = sorted(set([0, 1, 2, m - 1] + torch.linspace(0, m - 1, 40).long().tolist()))
    assert torch.equal(out[rows], _gpu_reference(x, ks, ke, topk, rows))
    again = torch.empty_like(out)
    topk_per_row_triton(x, ks, ke, topk, out=again)
    assert torch.equal(out, again)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [4096, 8, 1])
def test_gpu_configs_agree(m):
    """Every launch knob gives the default's result, bit for bit, at size."""
    n, topk = 131072, 2048
    x = torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(m))
    x[0, 5000:9000] = 3.0  # ties inside the top-k
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = torch.full((m,), n, dtype=torch.int32, device="cuda") - torch.arange(m, dtype=torch.int32, device="cuda")
    want = topk_per_row_triton(x, ks, ke, topk)
    for cfg in (TopkConfig(filter_block=2048), TopkConfig(separate=True), TopkConfig(split_target=1),
                TopkConfig(split_target=1024), TopkConfig(block=1024, num_warps=4), TopkConfig(ahead=1),
                TopkConfig(cap=2048), TopkConfig(cap=32768),
                # gave other keys on an H100 before the barrier after the segment gather
                TopkConfig(separate=True, filter_block=4096, num_warps=16)):
        assert torch.equal(topk_per_row_triton(x, ks, ke, topk, config=cfg), want), cfg


@pytest.mark.parametrize("n,topk", [(40000, 4096), (20000, 5000)])
def test_large_topk(interpret, n, topk):
    """topk 4096 with a sampled threshold (CAP 16384 < N), and topk 5000 with every window within CAP."""
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(n))
    check(x, torch.tensor([0, 33], dtype=torch.int32), torch.tensor([n, n - 5], dtype=torch.int32), topk)


def test_the_compiled_kernel_knows_its_constexprs():
    """A compiled launch needs BLOCK & co. as constexprs (the interpreter does not): the rebuilt
    function keeps the annotations triton.jit reads them from."""
    from mqa_provider_gluon.ops.topk_triton import kernel

    constexprs = {p.name for p in kernel(interpret=False).params if p.is_constexpr}
    assert {"CAP", "SAMPLE", "BLOCK", "TAIL", "ABSOLUTE", "VALUES", "SPLIT"} <= constexprs
    constexprs = {p.name for p in kernel(interpret=False, name="filter").params if p.is_constexpr}
    assert {"CAP", "SAMPLE", "BLOCK", "SPLIT"} <= constexprs
