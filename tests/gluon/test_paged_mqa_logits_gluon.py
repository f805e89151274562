"""The warp-specialised Gluon paged kernel: sm_90 AOT builds here, the float64 oracle on an H200."""

from __future__ import annotations

import pytest
import torch

from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache
from mqa_core.testing import calc_diff, make_paged_inputs

pytest.importorskip("triton")

from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as gp  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import _triton_version_reason  # noqa: E402

needs_gluon_api = pytest.mark.skipif(_triton_version_reason() is not None,
                                     reason=f"Gluon kernels are written for triton 3.6: {_triton_version_reason()}")


@needs_gluon_api
@pytest.mark.parametrize("next_n,h,clean,lens_2d", [(1, 32, False, False), (1, 64, True, True), (2, 32, True, False),
                                                    (2, 64, False, True), (4, 32, True, True)])
@pytest.mark.parametrize("math_wgs", [2, 4])
def test_sm90_build_uses_fp8_wgmma_without_spills(next_n, h, clean, lens_2d, math_wgs):
    from mqa_provider_gluon.aot import sass_facts

    if math_wgs == 4 and next_n * h > 128 // 2 and next_n > 2:
        pytest.skip("next_n = 4 at four math warpgroups: the loader's 24 registers spill (outside DeepGEMM's scope)")
    cfg = gp.GluonPagedConfig(math_wgs=math_wgs, stages=12 if math_wgs == 4 else 8)
    k = gp.compile_sm90(next_n=next_n, h=h, clean_logits=clean, lens_2d=lens_2d, config=cfg)
    facts = sass_facts({**k.asm, "metadata": k.metadata})
    assert facts.qgmma > 0 and facts.hgmma == 0 and facts.mma_other == 0, facts
    assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    assert facts.shared_bytes <= 227 * 1024, facts  # one CTA per SM: the ring fits


def _tma_destination_offsets(ptx: str) -> list[int]:
    """The buffer offsets (immediates >= 1024 added on the way) of every TMA copy's shared-memory
    destination, traced back through the PTX's integer arithmetic."""
    import re

    lines = ptx.splitlines()
    found: list[int] = []

    def trace(reg: str, idx: int, depth: int) -> None:
        for j in range(idx, max(0, idx - 400), -1):
            m = re.search(r"\b(?:mov|add|mad|shl|sub|or)\S*\s+" + re.escape(reg) + r",(.*);", lines[j])
            if m:
                if lines[j].lstrip().startswith("add.s32") and (imm := re.search(r",\s*(\d+);", lines[j])):
                    if int(imm.group(1)) >= 1024:
                        found.append(int(imm.group(1)))
                if depth < 4:
                    for r in re.findall(r"%r\w+", m.group(1)):
                        trace(r, j - 1, depth + 1)
                return

    for i, line in enumerate(lines):
        if "cp.async.bulk.tensor" in line:
            trace(re.search(r"bytes \[(%r\w+)\]", line).group(1), i - 1, 0)
    return found


@needs_gluon_api
@pytest.mark.parametrize("next_n,h,lens_2d", [(1, 32, False), (1, 32, True), (2, 64, True), (1, 16, False)])
def test_tma_destinations_are_128_byte_aligned(next_n, h, lens_2d):
    """TMA faults on a shared-memory destination that is not 128-byte aligned (a sticky CUDA error
    that fails every later call). Round 9 on the H200: weights and scales rings allocated with a
    plain layout landed 32 bytes off at next_n=1, H=32 with 1-D lengths; they now take their
    descriptors' layouts."""
    k = gp.compile_sm90(next_n=next_n, h=h, d=64 if h == 16 else 128, lens_2d=lens_2d, clean_logits=True)
    offsets = _tma_destination_offsets(k.asm["ptx"])
    assert offsets, "no TMA destination traced"
    assert all(o % 128 == 0 for o in offsets), offsets


@needs_gluon_api
@pytest.mark.parametrize("clean,presplit", [(False, True), (True, False)])
def test_pdl_build_waits_for_the_previous_kernel_before_any_partition_starts(clean, presplit):
    """A programmatic dependent launch may start while the previous kernel still writes q, the
    lengths or the memory our output reuses: the build launched that way must run
    ``griddepcontrol.wait`` before the barrier that starts the partitions, and before any global
    load or TMA copy, and then (``trigger``) let the next kernel launch; the plain build has no wait
    and is not launched as a dependent."""
    import re

    k = gp.compile_sm90(next_n=2, h=64, clean_logits=clean, presplit=presplit)
    assert k.metadata.launch_pdl
    lines = k.asm["ptx"].splitlines()
    wait = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    assert len(wait) == 1, wait
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*barrier\.sync\s+1;", line))
    first_read = next(i for i, line in enumerate(lines)
                      if re.match(r"\s*(@%p\w+\s+)?(ld\.global|cp\.async\.bulk)", line))
    assert wait[0] < start and wait[0] < first_read, (wait, start, first_read)
    assert "launch_dependents" in lines[wait[0]]  # then lets the next kernel launch (trigger=1)
    plain = gp.compile_sm90(next_n=2, h=64, clean_logits=clean, presplit=presplit,
                            config=gp.GluonPagedConfig(pdl=0, trigger=0))
    assert not plain.metadata.launch_pdl and "griddepcontrol" not in plain.asm["ptx"]
    # a plain launch may still let the next kernel launch: at its start, with no wait
    ptx = gp.compile_sm90(next_n=2, h=64, clean_logits=clean, presplit=presplit,
                          config=gp.GluonPagedConfig(pdl=0)).asm["ptx"]
    assert "griddepcontrol.wait" not in ptx and ptx.count("griddepcontrol.launch_dependents") == 1


@pytest.mark.parametrize("value,launch", [(None, 1), ("", 1), ("1", 1), ("on", 1), ("0", 0), ("off", 0)])
def test_engine_chooses_the_launch_mode_with_an_environment_variable(monkeypatch, value, launch):
    """``MQA_GLUON_PDL`` picks between the two measured launch modes, PDL with the trigger (default) or
    a plain launch with neither, for calls given no config."""
    if value is None:
        monkeypatch.delenv(gp.PDL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(gp.PDL_VARIABLE, value)
    assert gp.default_config() == gp.GluonPagedConfig(pdl=launch, trigger=launch)


def test_a_launch_mode_that_is_not_a_boolean_is_refused(monkeypatch):
    from mqa_core import SettingsError

    monkeypatch.setenv(gp.PDL_VARIABLE, "sometimes")
    with pytest.raises(SettingsError, match="MQA_GLUON_PDL"):
        gp.default_config()


@needs_gluon_api
def test_builds_given_no_config_follow_the_environment(monkeypatch):
    monkeypatch.setenv(gp.PDL_VARIABLE, "0")
    k = gp.compile_sm90(next_n=1, h=32, presplit=True)
    assert not k.metadata.launch_pdl and "griddepcontrol" not in k.asm["ptx"]


def test_config_rejects_unknown_launch_modes():
    for field in ("pdl", "trigger", "release", "late_init"):
        with pytest.raises(ValueError, match=f"pdl, trigger, release and late_init must be 0 or 1.*{field}=2"):
            gp.GluonPagedConfig(**{field: 2})


def test_config_rejects_a_ring_the_warpgroups_cannot_share():
    with pytest.raises(ValueError, match="multiple of math_wgs"):
        gp.GluonPagedConfig(stages=7)
    with pytest.raises(ValueError, match="multiple of math_wgs"):
        gp.GluonPagedConfig(math_wgs=4, stages=6)
    with pytest.raises(ValueError, match="2 or 4"):
        gp.GluonPagedConfig(math_wgs=3, stages=6)


def test_unsupported_says_why_on_this_machine():
    inp = make_paged_inputs(2, 2, 64, 128, 130, seed=1)
    reason = gp.unsupported(*inp.args()[:5])
    assert reason  # no sm_90 GPU (or another triton) here: a reason, not an exception
    with pytest.raises(ValueError, match="fp8_paged_mqa_logits_gluon"):
        gp.fp8_paged_mqa_logits_gluon(*inp.args())


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs filled with NaN before the kernel runs, so unwritten cells show."""
    real = gp._new_output
    monkeypatch.setattr(gp, "_new_output", lambda *a: real(*a).fill_(float("nan")))


def check(out: torch.Tensor, ref: torch.Tensor, clean: bool) -> None:
    ref = ref.to(out.device)
    assert out.shape == ref.shape and out.stride(1) == 1 and out.stride(0) % 16 == 0
    inside = torch.isfinite(ref)
    assert not out[inside].isnan().any(), "visible cells left unwritten"
    assert calc_diff(out[inside], ref[inside]) < 1e-6  # fp32 sums of exact fp8 products
    # every cell written outside the contexts is -inf; with clean, every one is written
    written = ~out.isnan()
    assert torch.equal(torch.isneginf(out), written & ~inside), "-inf cells differ from the written invisible ones"
    if clean:
        assert written.all(), "cells left unwritten"


def _arbitrary_lens(batch: int, next_n: int, ctx: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, ctx + 1, (batch, next_n), generator=g)
    lens[0, -1] = 0  # the last column is not the row maximum
    lens[-1, 0] = ctx + 9  # past max_context_len
    return lens.to(torch.int32)


CASES = [  # batch, next_n, H, D, ctx, block_size, lens: "1d" | "2d" (DeepGEMM's rule) | "any"
    (6, 2, 64, 128, 3000, 64, "any"),
    (5, 1, 32, 128, 4100, 64, "1d"),
    (3, 2, 32, 128, 700, 128, "2d"),  # two tiles per block
    (300, 1, 64, 128, 500, 64, "1d"),  # more sequences than one schedule step scans
    (1, 1, 64, 128, 40, 64, "1d"),  # fewer tiles than CTAs
    (4, 4, 32, 128, 333, 64, "any"),
    (7, 1, 16, 64, 900, 64, "2d"),
]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch,next_n,h,d,ctx,bs,lens_kind", CASES)
@pytest.mark.parametrize("clean", [True, False])
def test_gpu_matches_the_oracle(poisoned, batch, next_n, h, d, ctx, bs, lens_kind, clean):
    inp = make_paged_inputs(batch, next_n, h, d, ctx, block_size=bs, lens_2d=lens_kind == "2d", seed=batch + ctx)
    lens = _arbitrary_lens(batch, next_n, ctx, seed=ctx) if lens_kind == "any" else inp.context_lens.clone()
    if batch > 2:
        lens[1] = 0  # an empty sequence
    tables = inp.block_tables.clone()
    if batch > 3 and tables.shape[1] > 5:
        tables[3, 5] = -1  # an out-of-range id inside a context
        tables[2, 1] = 1 << 30
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, tables, ctx)
    pool = pad_paged_cache(inp.kv_cache.cuda(), 512)  # strided pool, NaN garbage between blocks
    args = (inp.q.cuda(), pool, inp.weights.cuda(), lens.cuda(), tables.cuda(), ctx)
    assert gp.unsupported(*args[:5]) is None
    configs = (None, gp.GluonPagedConfig(math_wgs=2, stages=4), gp.GluonPagedConfig(stages=12), None)
    for config in configs:  # the last call is the bound launch
        check(gp.fp8_paged_mqa_logits_gluon(*args, clean, config=config), ref, clean)
    assert gp._LAUNCHES[gp._signature(*args[:5], clean, None, gp._ptrs(*args[:5]))].bound


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("clean", [True, False])
def test_gpu_long_contexts_reuse_every_ring_slot(poisoned, clean):
    """Dozens of tiles per program, so every ring slot (values, scales, block ids) is refilled many
    times: each way of handing a slot back (``release``) and of setting the rings up (``late_init``), with
    rings of several depths."""
    ctx = 60000
    inp = make_paged_inputs(8, 2, 64, 128, ctx, lens_2d=True, seed=11)
    g = torch.Generator().manual_seed(3)
    lens = (ctx - torch.randint(0, 3000, (8, 2), generator=g)).to(torch.int32)  # ~57 tiles per program
    tables = inp.block_tables.clone()
    tables[2, 300] = -1  # an out-of-range id deep in a context: its tile's id comes through a reused slot
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, tables, ctx)
    args = (inp.q.cuda(), inp.kv_cache.cuda(), inp.weights.cuda(), lens.cuda(), tables.cuda(), ctx)
    for config in (gp.GluonPagedConfig(release=0, late_init=0), gp.GluonPagedConfig(release=1, late_init=0),
                   gp.GluonPagedConfig(release=1),
                   gp.GluonPagedConfig(release=1, stages=12), gp.GluonPagedConfig(release=1, math_wgs=2, stages=4)):
        check(gp.fp8_paged_mqa_logits_gluon(*args, clean, config=config), ref, clean)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch,next_n,h,ctx,lens_kind", [(6, 2, 64, 3000, "any"), (300, 1, 32, 500, "1d"),
                                                          (40, 2, 32, 4100, "2d"), (1, 1, 64, 40, "1d")])
@pytest.mark.parametrize("clean", [True, False])
def test_gpu_reads_a_precomputed_schedule(poisoned, batch, next_n, h, ctx, lens_kind, clean):
    """A split computed once (compat's metadata, as an engine computes it per step) and read by every
    program instead of worked out: exact for the lengths it came from, and still every tile for a
    table from other lengths (longer, shorter, all zero), by the owner-of-the-end rule."""
    from mqa_core.compat.deep_gemm import get_paged_mqa_logits_metadata

    inp = make_paged_inputs(batch, next_n, h, 128, ctx, lens_2d=lens_kind == "2d", seed=batch + 7)
    lens = _arbitrary_lens(batch, next_n, ctx, seed=ctx) if lens_kind == "any" else inp.context_lens.clone()
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, ctx)
    args = (inp.q.cuda(), inp.kv_cache.cuda(), inp.weights.cuda(), lens.cuda(), inp.block_tables.cuda(), ctx)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stale = [lens, (lens // 3), (lens * 2 + 70), torch.zeros_like(lens), lens.flip(0), None]
    for other in stale:
        schedule = get_paged_mqa_logits_metadata(other.cuda(), 64, sms) if other is not None else \
            torch.randint(-5, batch + 3, (sms + 1, 2), dtype=torch.int32, device="cuda")  # any table at all
        for config in (None, gp.GluonPagedConfig(math_wgs=2, stages=4), gp.GluonPagedConfig(late_init=0)):
            check(gp.fp8_paged_mqa_logits_gluon(*args, clean, config=config, schedule=schedule), ref, clean)
    with pytest.raises(ValueError, match="rows"):
        gp.fp8_paged_mqa_logits_gluon(*args, clean, schedule=get_paged_mqa_logits_metadata(args[3], 64, sms - 1))
    with pytest.raises(ValueError, match="int32"):
        gp.fp8_paged_mqa_logits_gluon(*args, clean, schedule=schedule.long())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_replay_follows_new_lengths(poisoned):
    """Captured once, replayed after the lengths changed in place: the schedule is the device's."""
    inp = make_paged_inputs(6, 2, 64, 128, 3000, seed=3)
    q, w, t, cache = inp.q.cuda(), inp.weights.cuda(), inp.block_tables.cuda(), inp.kv_cache.cuda()
    lens = _arbitrary_lens(6, 2, 3000, seed=4)
    dev_lens = lens.cuda()
    gp.fp8_paged_mqa_logits_gluon(q, cache, w, dev_lens, t, 3000)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = gp.fp8_paged_mqa_logits_gluon(q, cache, w, dev_lens, t, 3000)
    for new in (lens, _arbitrary_lens(6, 2, 3000, seed=5), torch.zeros_like(lens)):
        dev_lens.copy_(new)
        g.replay()
        check(out, fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, new, inp.block_tables, 3000), True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True])
def test_gpu_dependent_call_reads_the_previous_output_only_once_complete(monkeypatch, graph):
    """Two calls back to back, the second's weights a view of the first's output: the first lets the
    second launch early (``trigger``), the second is a programmatic dependent launch whose partitions
    must wait for the whole first grid. The first call's schedule gives program 0 every tile and the
    others none, so they exit at once and the second call's programs start on their SMs while
    program 0 still writes, row after row, the cells the second reads as weights (each sequence's
    last tile), poisoned with NaN before: a read before the first call completes gives NaN."""
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    length, h = 8 * 64, 64
    first = make_paged_inputs(programs, 1, h, 128, length, context_lens=torch.full((programs,), length), seed=11)
    one_program = torch.tensor([[0, 0]] + [[programs, 0]] * programs, dtype=torch.int32, device="cuda")
    second = make_paged_inputs(programs, 1, h, 128, 3000, seed=12)
    a_args = (first.q.cuda(), first.kv_cache.cuda(), first.weights.cuda(), first.context_lens.cuda(),
              first.block_tables.cuda(), length)
    q_b, cache_b, lens_b, tables_b = (second.q.cuda(), second.kv_cache.cuda(), second.context_lens.cuda(),
                                      second.block_tables.cuda())
    out_a = torch.empty(programs, length, device="cuda")
    out_b = torch.empty(programs, gp._row(3000), device="cuda")[:, :3000]
    weights_b = out_a[:, length - h:]  # each sequence's last tile (64 positions: H weights)
    cfg = gp.GluonPagedConfig()
    assert cfg.pdl and cfg.trigger  # the shipped launch mode

    def both() -> None:
        outs = iter((out_a, out_b))
        monkeypatch.setattr(gp, "_new_output", lambda *a: next(outs))
        gp.fp8_paged_mqa_logits_gluon(*a_args, False, config=cfg, schedule=one_program)
        gp.fp8_paged_mqa_logits_gluon(q_b, cache_b, weights_b, lens_b, tables_b, 3000, True, config=cfg)

    both()  # compile and bind both signatures outside any capture
    torch.cuda.synchronize()
    ref_a = fp8_paged_mqa_logits_ref(first.q, first.kv_cache, first.weights, first.context_lens, first.block_tables,
                                     length)
    check(out_a, ref_a, False)
    # the second call's oracle from the weights it reads: the first output's cells (deterministic)
    ref_b = fp8_paged_mqa_logits_ref(second.q, second.kv_cache, weights_b.cpu().clone(), second.context_lens,
                                     second.block_tables, 3000)
    run = both
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            both()
        run = g.replay
    for _ in range(10):
        out_a.fill_(float("nan"))
        out_b.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        check(out_a, ref_a, False)
        check(out_b, ref_b, True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_provider_routes_measured_classes_here(poisoned, monkeypatch):
    """The gluon provider's paged op: classes in MEASURED_AHEAD run this kernel (and its prepared
    call), the others and single sequences (MIN_BATCH) the Triton kernel; both give the oracle's values."""
    from mqa_provider_gluon.kernels import GLUON
    from mqa_provider_gluon.ops import paged_mqa_logits_triton as tp

    monkeypatch.setattr(gp, "MEASURED_AHEAD", frozenset({(2, 64)}))
    monkeypatch.setattr(tp, "_new_output", lambda *a, real=tp._new_output: real(*a).fill_(float("nan")))
    runs = []
    monkeypatch.setattr(gp, "_call", lambda *a, real=gp._call: runs.append(a[3].shape[0]) or real(*a))
    # B = 1 after B = 9 of the same class: one launch signature (B is not in it), still the Triton kernel
    for batch, next_n, h, here in ((9, 2, 64, True), (9, 1, 32, False), (1, 2, 64, False)):
        inp = make_paged_inputs(batch, next_n, h, 128, 2000, seed=next_n, lens_2d=True)
        ref = fp8_paged_mqa_logits_ref(*inp.args())
        args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in inp.args())
        runs.clear()
        for _ in range(2):  # the first call decides and binds
            check(GLUON.fp8_paged_mqa_logits(*args, clean_logits=True), ref, True)
        assert runs == ([batch] * 2 if here else [])
        prepared = GLUON.prepare_fp8_paged_mqa_logits(*args, clean_logits=True)
        assert isinstance(prepared, gp.PreparedCall) == here and prepared is not None
        check(prepared(*args[:5]), ref, True)
        key = gp._signature(*args[:5], True, None, gp._ptrs(*args[:5]))
        if batch >= gp.MIN_BATCH:
            assert (key in gp._LAUNCHES) == here and (key in gp._TRITON_ROUTE) != here


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_public_op_hands_the_schedule_to_this_kernel(poisoned, monkeypatch):
    """mqa_core's op with the gluon provider: the step's schedule reaches this kernel's launch (and its
    prepared call, on later calls); one of another program count is ignored; the logits are the
    oracle's every time."""
    import mqa_core

    monkeypatch.setenv("MQA_PROVIDER", "gluon")
    mqa_core.reload()
    inp = make_paged_inputs(40, 2, 64, 128, 3000, seed=21, lens_2d=True)
    ref = fp8_paged_mqa_logits_ref(*inp.args())
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in inp.args())
    read = []
    monkeypatch.setattr(gp, "_run", lambda *a, real=gp._run: read.append(a[8]) or real(*a))  # sched
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = mqa_core.paged_schedule(args[3])
    for _ in range(3):
        check(mqa_core.fp8_paged_mqa_logits(*args, clean_logits=False, schedule=schedule), ref, False)
    assert read[-2:] == [schedule.data_ptr()] * 2  # the prepared call passes the table's address
    read.clear()
    other = mqa_core.paged_schedule(args[3], sms - 4)
    for _ in range(3):
        check(mqa_core.fp8_paged_mqa_logits(*args, clean_logits=False, schedule=other), ref, False)
    assert read[-2:] == [0, 0]  # worked out in the kernel instead
