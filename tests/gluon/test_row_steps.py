"""The fused indexer's per-row kernels (``row_steps``) alone, against python, in the interpreter; the
orchestration with them against the same steps as torch calls; and their AOT builds."""

from __future__ import annotations

import re

import pytest
import torch

triton = pytest.importorskip("triton")

from aot_targets import skip_unless_buildable  # noqa: E402
from mqa_provider_gluon.ops import mqa_topk_triton as op  # noqa: E402
from mqa_provider_gluon.ops import row_steps as rs  # noqa: E402
from test_mqa_topk_triton import PATHS, SMALL, Paths, edge_windows, exact_inputs, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_plans")


def test_tau_kernel_is_the_rth_largest():
    """Random rows with NaN, -inf, +inf, -0.0/+0.0 and repeated values, a row shorter than the block
    (its masked lanes must not count), r = 1, r = every column, r past the columns (-inf), and an
    unflagged row (-inf): each threshold equals the r-th largest by torch.topk with NaN as -inf."""
    gen = torch.Generator().manual_seed(3)
    rows, ncols, block = 9, 300, 512
    x = torch.randn(rows, block, generator=gen)
    x[0, :50] = float("nan")
    x[1, ::3] = float("-inf")
    x[2, :7] = float("inf")
    x[3] = torch.where(torch.rand(block, generator=gen) < 0.5, -0.0, 0.0)
    x[4] = torch.randint(-3, 3, (block,), generator=gen).float()
    x[5, :ncols] = float("-inf")
    x[:, ncols:] = 1e30  # past ncols: would win if the mask leaked
    flag = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0], dtype=torch.int32)
    for r in (1, 37, ncols, ncols + 1):
        tau = torch.full((rows,), 7.0)
        with op._interpreting():
            rs.tau_kernel(True)[(rows,)](x, x.stride(0), flag, tau, ncols, r, BLOCK=block)
        clean = x[:, :ncols].nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
        for i in range(rows):
            if flag[i] == 0 or r > ncols:
                assert tau[i] == float("-inf"), (r, i)
                continue
            want = torch.topk(clean[i], r).values[-1]
            assert tau[i] == want, (r, i, tau[i], want)
            # -0.0 and +0.0: the r-th largest key, so the sign is the r-th cell's own
            assert torch.signbit(tau[i]) == torch.signbit(want) or want != 0, (r, i)


def test_book_kernel_says_who_keeps_what():
    """Counts below topk or past the capacity make a sampled row misjudged (not kept, nothing to
    select, no tie rule); a dense row selects over its window; an unscored row keeps nothing."""
    gen = torch.Generator().manual_seed(5)
    mc, topk, cap = 1500, 10, 40  # more rows than one program takes
    lo = torch.randint(0, 100, (mc,), generator=gen)
    hi = lo + torch.randint(0, 200, (mc,), generator=gen)
    sampled = torch.rand(mc, generator=gen) < 0.5
    scored = sampled | (torch.rand(mc, generator=gen) < 0.5)
    table = torch.zeros(8, mc, dtype=torch.int32)
    table[0], table[1], table[6], table[7] = lo.int(), hi.int(), sampled.int(), scored.int()
    cnt = torch.randint(0, 60, (mc,), generator=gen, dtype=torch.int32)
    counts = torch.full((mc,), -7, dtype=torch.int32)
    win = torch.full((4, mc), -7, dtype=torch.int32)
    with op._interpreting():
        rs.book_kernel(True)[(-(-mc // rs.BOOK_BLOCK),)](cnt, table, table.stride(0), counts, win, win.stride(0), mc,
                                                         topk, cap, BLOCK=rs.BOOK_BLOCK)
    bad = sampled & ((cnt < topk) | (cnt > cap))
    assert torch.equal(counts, torch.where(sampled, cnt, 0))
    assert torch.equal(win[0], torch.zeros(mc, dtype=torch.int32))
    want_n = torch.where(sampled, torch.where(bad, 0, cnt.clamp(max=cap)), torch.where(scored, hi - lo, 0))
    assert torch.equal(win[1], want_n.int())
    assert torch.equal(win[2].bool(), scored & ~bad) and torch.equal(win[3].bool(), sampled & ~bad)
    assert bad.any() and (sampled & ~bad).any() and (~scored).any()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("score_all", [False, True])
@pytest.mark.parametrize("stride", [0, 16])
def test_table_kernel_decides_as_the_host(dtype, score_all, stride):
    """Windows starting before key 0, ending past N, ending before they start, narrower than topk,
    wider than the capacity: each row's table entries are the host's formulas (clamped window,
    ceil(lo/s) for the sample, sampled only with a stride, every row scored with values)."""
    gen = torch.Generator().manual_seed(11)
    m, n, topk, cap = 1500, 5000, 64, 900  # more rows than one program takes
    ks = torch.randint(-300, n + 300, (m,), generator=gen)
    ke = ks + torch.randint(-100, 2000, (m,), generator=gen)
    table = torch.full((8, m + 5), -7, dtype=torch.int32)  # a wider buffer: the stride is not m
    with op._interpreting():
        rs.table_kernel(True)[(-(-m // rs.BOOK_BLOCK),)](ks.to(dtype), ke.to(dtype), table, table.stride(0), m, n,
                                                         topk, cap, stride, SCORE_ALL=score_all, BLOCK=rs.BOOK_BLOCK)
    lo = ks.clamp(0, n)
    hi = torch.maximum(ke.clamp(max=n), lo)
    w = hi - lo
    sampled = (w > cap) & (stride > 0)
    scored = (w > topk) | score_all
    s = max(stride, 1)
    want = torch.stack((lo, hi, lo * scored, hi * scored, torch.where(sampled, -(-lo // s), 0),
                        torch.where(sampled, -(-hi // s), 0), sampled, scored)).int()
    assert torch.equal(table[:, :m], want)
    assert (table[:, m:] == -7).all()  # past row m: untouched
    assert sampled.any() == (stride > 0) and (~scored).any() != score_all and (w == 0).any()


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("relative", [True, False])
def test_finish_kernel_sorts_the_winners_into_the_output(values, relative):
    """The winners of a selection over shuffled candidates become sorted positions (relative or
    absolute) with their values, -1 / -inf padding, ties at the k-th value to the smaller positions
    on rows the tie rule covers; rows not kept keep the output's poison. topk is not a power of
    two and needs the 2048-lane sort (LOG2 = 11)."""
    gen = torch.Generator().manual_seed(11 + values + 2 * relative)
    rows, cap, topk, n = 6, 2600, 1500, 40_000
    pos = torch.stack([torch.randperm(n, generator=gen)[:cap] for _ in range(rows)]).int()
    val = torch.randint(0, 5, (rows, cap), generator=gen).float() - 2.0  # few levels: ties everywhere
    val[2] = torch.randn(cap, generator=gen)  # no ties
    nvalid = torch.tensor([cap, cap - 9, 1000, cap, topk, cap], dtype=torch.int32)  # row 2: fewer than topk
    keep = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.int32)
    ties = torch.tensor([1, 1, 0, 0, 1, 0], dtype=torch.int32)  # row 3: tied but not covered (a dense row)
    win = torch.stack((torch.zeros(rows, dtype=torch.int32), nvalid, keep, ties))
    lo = torch.randint(0, 100, (rows,), generator=gen, dtype=torch.int32)
    idx = torch.empty(rows, topk, dtype=torch.int32)
    v = torch.empty(rows, topk)
    op.select_topk_torch(val, win[0], nvalid, topk, out=idx, values=v)
    slots = idx.clone()
    out = torch.full((rows, topk), -7, dtype=torch.int32)
    vals = torch.full((rows, topk), float("nan"))
    fixed = torch.zeros(rows, dtype=torch.int32)
    with op._interpreting():
        rs.finish_kernel(True)[(rows,)](idx, v, pos, val, win, win.stride(0), lo, out, out.stride(0), vals,
                                        vals.stride(0), fixed, pos.stride(0), idx.stride(0), topk, n,
                                        CBLOCK=rs.TIES_BLOCK, TBLOCK=rs.TIES_BLOCK, LOG2=11, RELATIVE=relative,
                                        VALUES=values)
    for i in range(rows):
        if keep[i] == 0:
            assert (out[i] == -7).all() and vals[i].isnan().all(), i
            continue
        nv = int(nvalid[i])
        if ties[i]:  # the smallest positions among the cells equal to the k-th value
            cells = sorted(((float(val[i, j]), int(pos[i, j])) for j in range(nv)), key=lambda c: (-c[0], c[1]))
            taken = cells[:topk]
        else:  # the selection's own winners (slot order broke its ties)
            taken = [(float(val[i, j]), int(pos[i, j])) for j in slots[i].tolist() if j >= 0]
        taken.sort(key=lambda c: c[1])
        want = [p - (int(lo[i]) if relative else 0) for _, p in taken]
        got = out[i].tolist()
        assert got[:len(want)] == want and all(p == -1 for p in got[len(want):]), i
        if values:
            assert vals[i, :len(want)].tolist() == [x for x, _ in taken], i
            assert (vals[i, len(want):] == float("-inf")).all(), i
        else:
            assert vals[i].isnan().all(), i
    assert fixed[0] == 1 and fixed[1] == 1 and fixed[3] == 0  # the tied rows were the ones rewritten


@pytest.mark.parametrize("path", ["sampled", "default", "overflow"])
def test_kernels_equal_the_torch_steps(monkeypatch, path):
    """The orchestration with ``row_steps``' kernels and with the same steps as torch calls
    (``tuning(glue=True)``) give the same bits and the same path counts, on exact inputs that tie,
    with values, in both position modes. On the sampled path the logits come in five levels
    (k_scale = 1 + n % 5), so rows hold many more cells equal to their k-th value than are taken."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    m, n, h, d, topk = 11, 150, 16, 64, 12
    inp = exact_inputs(m, n, h, d, seed=77, window="full" if path == "sampled" else "ragged")
    edge_windows(inp, n)
    if path == "sampled":
        inp.q.fill_(1.0)
        inp.k.fill_(1.0)
        inp.weights.fill_(1 / (h * d))
        inp.k_scale.copy_(1.0 + torch.arange(n) % 5)
    for positions in ("relative", "absolute"):
        got = {}
        for glue in (False, True):
            paths = Paths()
            with op.tuning(config=SMALL, poison=True, report=paths, glue=glue, **PATHS[path]):
                got[glue] = (*run(inp, topk, positions=positions, return_values=True), paths.calls[0])
        (p0, v0, c0), (p1, v1, c1) = got[False], got[True]
        assert torch.equal(p0, p1) and v0 is not None and v1 is not None and torch.equal(v0, v1), positions
        assert {k: c0[k] for k in c0 if k != "plan"} == {k: c1[k] for k in c1 if k != "plan"}
    if path == "sampled":
        assert c0["sampled_rows"] > 0 and c0["tie_rows"] > 0  # the tie rule ran in both


@pytest.mark.parametrize("target", ["sm_90", "gfx942", "gfx950"])
@pytest.mark.parametrize("kernel,kw", [("tau", {}), ("tau", {"sample_cols": rs.TAU_COLS}), ("book", {}),
                                       ("table", {}), ("finish", {}), ("finish", {"topk": rs.FINISH_TOPK}),
                                       ("ties", {})])
def test_aot_row_steps_build_without_spills(target, kernel, kw):
    """Each per-row kernel builds for each target as the launcher calls it, at the widest row it
    takes (16384 sample columns, topk 4096), with no spills: the rows, and a tied row's bisection
    state, stay in registers."""
    from mqa_provider_gluon import aot

    skip_unless_buildable(target)
    asm = op.compile_small_kernel_for(target, kernel, **kw)
    if target == "sm_90":
        facts = aot.sass_facts(asm)
        if (facts.spill_stores or facts.spill_loads) and not triton.__version__.startswith("3.6."):
            pytest.xfail(f"triton {triton.__version__}: {facts.spill_stores} spill stores, {facts.spill_loads} "
                         "spill loads; the kernels are tuned for triton 3.6 (the device's)")
        assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
        assert "ATOM" not in aot.sass(asm)  # a row is one program's: no atomics
    else:
        facts = aot.amd_facts(asm)
        assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts
    print(f"{kernel} {kw} {target}: {facts}")
    if target == "sm_90" and kernel == "finish" and not kw and triton.__version__.startswith("3.6."):
        # the sort's steps find each lane's partner with one reduction (an xor), not two sums: at
        # topk 2048 with values 176 shared-memory stores and 5160 instructions, against 320 and 9656
        sass = aot.sass(asm)
        assert len(re.findall(r"\bSTS\b", sass)) <= 200 and facts.registers <= 96, facts
