"""The paged (decode) Triton kernel: interpreter against the float64 oracle, AOT builds for sm_90 and AMD."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache
from mqa_core.testing import calc_diff, make_paged_inputs

triton = pytest.importorskip("triton")

from mqa_provider_gluon.ops import paged_mqa_logits_triton as op  # noqa: E402
from mqa_provider_gluon.ops.paged_mqa_logits_triton import (  # noqa: E402
    VARIANTS,
    PagedConfig,
    compile_for,
    fp8_paged_mqa_logits_triton,
    resident_programs,
)
from triton.backends.compiler import GPUTarget  # noqa: E402


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreter for this test only, and an output poisoned with NaN so unwritten cells show."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real = op._new_output
    monkeypatch.setattr(op, "_new_output", lambda *a: real(*a).fill_(float("nan")))


def check(out: torch.Tensor, ref: torch.Tensor, clean: bool) -> None:
    """``out`` where the kernel left it (``.cpu()`` would make its padded rows contiguous)."""
    ref = ref.to(out.device)
    assert out.shape == ref.shape and out.dtype == torch.float32 and out.stride(1) == 1
    assert out.stride(0) % 16 == 0
    inside = torch.isfinite(ref)
    assert not out[inside].isnan().any(), "visible cells left unwritten"
    assert calc_diff(out[inside], ref[inside]) < 1e-3
    assert calc_diff(out[inside], ref[inside]) < 1e-6  # fp32 sums of exact fp8 products
    if clean:
        assert not out.isnan().any(), "cells left unwritten"
        assert torch.equal(torch.isneginf(out), ~inside), "-inf mask differs from the contexts"


CASES = [  # (batch, next_n, H, D, max_context_len, block_size, 2-D lens)
    (1, 1, 16, 64, 40, 64, False),  # shorter than one block
    (2, 2, 32, 128, 300, 64, True),
    (3, 2, 16, 64, 200, 16, False),  # several blocks per tile
    (3, 1, 32, 128, 129, 64, False),
    (2, 1, 16, 128, 10, 16, True),  # shorter than one tile and than one block
    (1, 2, 32, 64, 520, 64, False),
]


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("batch,next_n,h,d,ctx,bs,lens_2d", CASES)
def test_interpreter_matches_reference(interpret, batch, next_n, h, d, ctx, bs, lens_2d, clean):
    inp = make_paged_inputs(batch, next_n, h, d, ctx, block_size=bs, lens_2d=lens_2d,
                            seed=batch * 1000 + ctx)
    if batch > 1:  # a sequence with nothing visible to its first row(s)
        inp.context_lens[1] = 0 if lens_2d else 1
    out = fp8_paged_mqa_logits_triton(*inp.args(), clean)
    check(out, inp.reference(), clean)
    if next_n == 2:  # one dot per query row: the same values
        out = fp8_paged_mqa_logits_triton(*inp.args(), clean, config=VARIANTS["rows"])
        check(out, inp.reference(), clean)


@pytest.mark.orchestration
@pytest.mark.parametrize("pipe", [0, 7])
@pytest.mark.parametrize("programs", [1, 2, 5, 17])  # 17: more programs than tiles
@pytest.mark.parametrize("clean", [True, False])
def test_balanced_schedule_covers_every_tile_once(interpret, programs, clean, pipe):
    """Ragged contexts (one empty, one below next_n, one past the table) split over a fixed grid:
    every visible cell written with its value, every other cell -inf (clean), whatever the number
    of programs, including more programs than tiles."""
    inp = make_paged_inputs(5, 2, 16, 64, 333, block_size=64, seed=programs)
    inp.context_lens[:] = torch.tensor([333, 0, 1, 200, 64], dtype=torch.int32)
    cfg = PagedConfig(programs=programs, pipe=pipe, prefetch=0 if pipe else 4)
    out = fp8_paged_mqa_logits_triton(*inp.args(), clean, config=cfg)
    check(out, inp.reference(), clean)


@pytest.mark.orchestration
@pytest.mark.parametrize("batch,next_n,h,empty,programs", [(131, 1, 16, 127, 5), (65, 2, 128, 63, 17)])
def test_schedule_spans_several_scan_chunks(interpret, batch, next_n, h, empty, programs):
    """More (sequence, query-row group) pairs than one schedule step scans (``_SCHED`` = 128): the
    prefix sums carry across chunks, and a program's range may start in one chunk and end in the next.
    (65, 2, 128): next_n * H exceeds one dot, so each sequence is two virtual ones."""
    inp = make_paged_inputs(batch, next_n, h, 64, 150, block_size=64, seed=batch + programs)
    g = torch.Generator().manual_seed(programs)
    inp.context_lens[:] = torch.randint(0, 151, (batch,), generator=g, dtype=torch.int32)
    inp.context_lens[empty] = 0  # an empty sequence at the first chunk's end
    out = fp8_paged_mqa_logits_triton(*inp.args(), True, config=PagedConfig(programs=programs))
    check(out, inp.reference(), True)


def arbitrary_lens(batch: int, next_n: int, ctx: int, seed: int) -> torch.Tensor:
    """[B, next_n] lengths following no rule (the last column is not the row maximum, zeros, past
    max_context_len)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, ctx + 1, (batch, next_n), generator=g)
    lens[0, -1] = 0
    lens[-1, 0] = ctx + 9
    return lens.to(torch.int32)


@pytest.mark.parametrize("variant", ["base", "rows", "pipe", "pipetma", "piperows"])
@pytest.mark.parametrize("bs", [64, 16])
@pytest.mark.parametrize("clean", [True, False])
def test_strided_pool_and_arbitrary_2d_lengths(interpret, bs, clean, variant):
    """A page pool with garbage (fp8 and float32 NaNs) between blocks, read in place, and 2-D
    lengths that the 1-D rule cannot express."""
    inp = make_paged_inputs(4, 2, 32, 64, 210, block_size=bs, seed=bs)
    pool = pad_paged_cache(inp.kv_cache, 4 * 37)
    lens = arbitrary_lens(4, 2, 210, seed=bs)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 210)
    cfg = dataclasses.replace(VARIANTS[variant], programs=3)
    out = fp8_paged_mqa_logits_triton(inp.q, pool, inp.weights, lens, inp.block_tables, 210, clean,
                                      config=cfg)
    check(out, ref, clean)


@pytest.mark.parametrize("variant", [None, "pipe", "pipetma"])
@pytest.mark.parametrize("bs", [64, 16])
def test_block_ids_out_of_range_give_neg_inf(interpret, bs, variant):
    """Negative and too-large ids among the visible blocks: their positions are -inf (never read),
    the rest exact. The pool is a slice of a bigger buffer of NaNs, so a read past it would show."""
    inp = make_paged_inputs(3, 2, 16, 64, 192, block_size=bs, seed=bs + 1)
    inp.context_lens[:] = 192
    blocks = inp.kv_cache.shape[0]
    big = torch.full((blocks + 4, bs, 1, 68), 0x7F, dtype=torch.uint8)
    big[2:blocks + 2] = inp.kv_cache
    pool = big[2:blocks + 2]
    tables = inp.block_tables.clone()
    tables[0, 1], tables[1, 2], tables[2, 0] = -1, blocks, -2
    ref = fp8_paged_mqa_logits_ref(inp.q, pool, inp.weights, inp.context_lens, tables, 192)
    assert torch.isneginf(ref[0:2, bs:2 * bs]).all() and torch.isneginf(ref[2:4, 2 * bs:3 * bs]).all()
    out = fp8_paged_mqa_logits_triton(inp.q, pool, inp.weights, inp.context_lens, tables, 192,
                                      config=VARIANTS.get(variant))
    check(out, ref, True)


def test_query_row_groups_h128(interpret):
    """H = 128 with next_n = 2: the rows of a sequence are split in two groups (two virtual
    sequences of the schedule)."""
    inp = make_paged_inputs(2, 2, 128, 64, 150, block_size=64, lens_2d=True, seed=12)
    inp.context_lens[0] = torch.tensor([150, 3], dtype=torch.int32)
    for clean in (True, False):
        check(fp8_paged_mqa_logits_triton(*inp.args(), clean, config=PagedConfig(programs=4)),
              inp.reference(), clean)


def test_no_blocks_and_empty_sizes(interpret):
    inp = make_paged_inputs(2, 1, 16, 64, 40, seed=13)
    out = fp8_paged_mqa_logits_triton(inp.q, inp.kv_cache[:0], *inp.args()[2:])
    assert out.shape == (2, 40) and torch.isneginf(out).all()
    assert fp8_paged_mqa_logits_triton(*inp.args()[:5], 0).shape == (2, 0)
    inp.context_lens[:] = 0
    assert torch.isneginf(fp8_paged_mqa_logits_triton(*inp.args())).all()


def test_cached_launch_passes_the_arguments_the_kernel_declares(interpret, monkeypatch):
    """The hot path (a cached launch handing ints and constants to the bound C launcher) builds the
    same arguments, in the kernel's parameter order, as Triton's own binding: run here through the
    interpreter in place of the launcher, the pointers mapped back to their tensors."""
    inp = make_paged_inputs(3, 2, 16, 64, 150, block_size=16, lens_2d=True, seed=14)
    pool = pad_paged_cache(inp.kv_cache, 64)
    cfg = PagedConfig(programs=2)
    shape = op._Shape(2, 16, 64, 16, cfg.tile)
    constexprs = shape.constexprs(cfg, True, True, False, False, 0)
    fn = op.kernel(interpret=True)
    names = [p.name for p in op.kernel(interpret=False).params]
    assert names[-len(constexprs):] == list(constexprs)
    outputs: list[torch.Tensor] = []
    real_new = op._new_output
    monkeypatch.setattr(op, "_new_output", lambda *a: outputs.append(real_new(*a)) or outputs[-1])
    tensors = {t.data_ptr(): t for t in (inp.q, pool, inp.weights, inp.context_lens, inp.block_tables)}
    calls = []

    class Bound:
        def __call__(self, gx, gy, gz, stream, args):
            assert (gy, gz, stream) == (1, 1, 7)
            assert len(args) == len(names)
            tensors[outputs[-1].data_ptr()] = outputs[-1]
            ptr_args = {i for i, n in enumerate(names) if n.endswith("_ptr")}
            assert all(isinstance(args[i], int) and args[i] in tensors for i in ptr_args)
            calls.append(gx)
            real = [tensors[a] if i in ptr_args else a for i, a in enumerate(args)]
            with op._interpreting():
                fn[(gx,)](*real[:-len(constexprs)], **constexprs, num_warps=4)

    strides = op._strides(inp.q, pool, inp.weights, inp.context_lens, inp.block_tables)
    launch = op._Launch(Bound(), 2, tuple(constexprs.values()), False, cfg.tile, strides, cfg)
    monkeypatch.setattr(op, "_stream", lambda index: 7)
    out = op._run(launch, inp.q, pool, inp.weights, inp.context_lens, inp.block_tables, 150)
    assert calls == [2]
    check(out, inp.reference(), True)


@pytest.fixture
def sm90_host(monkeypatch):
    """The GPU path on CPU tensors (see the test below): an sm_90 device, Triton's host path up to a
    recording C launcher, empty launch caches."""
    import contextlib

    from mqa_provider_gluon.host_driver import HostOnlyDriver, host_only

    monkeypatch.setattr(op, "_arch_of", lambda device: "sm_90")
    monkeypatch.setattr(op, "_device_facts", lambda index: (132, 65536, 233472, 2048))
    monkeypatch.setattr(op, "_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(op, "_LAUNCHES", {})
    monkeypatch.setattr(op, "_GRIDS", {})
    op._default_for.cache_clear()  # defaults follow _arch_of, cached per device
    with host_only(HostOnlyDriver()) as drv:
        yield drv
    op._default_for.cache_clear()


def test_compiled_path_caches_one_launch_per_signature_unless_a_hook_listens(sm90_host, monkeypatch):
    """The GPU path on the CPU: Triton's host path up to the C launcher (the host-only driver, sm_90
    answers; the kernel compiles for real). Triton's hook chains are truthy even when empty, so the
    launcher must ask whether one holds a hook: with none, the first call caches its launch under the
    variant it was built for and the next call takes it; with a hook, calls go through Triton's own
    launch path (which hands the hook every launch). Where direct launches are unsupported (a triton
    other than the one they were written for), only the grid is kept and every call takes Triton's
    path: the same kernel and grid each time, nothing bound."""
    from mqa_provider_gluon.launch import direct_launch_unsupported
    from triton import knobs

    drv = sm90_host
    direct = direct_launch_unsupported() is None
    cached = []
    real_run = op._run
    monkeypatch.setattr(op, "_run", lambda *a: cached.append(a[0]) or real_run(*a))
    assert bool(knobs.runtime.launch_enter_hook) and not op.hooks_active()  # empty, yet truthy
    inp = make_paged_inputs(3, 2, 64, 128, 300, block_size=64, lens_2d=True, seed=17)
    cfg = VARIANTS["rows"]
    for _ in range(2):
        op.fp8_paged_mqa_logits_triton(*inp.args(), True, config=cfg)
    if direct:
        (launch,) = op._LAUNCHES.values()
        assert launch.config == cfg and cached == [launch] and not op._GRIDS
    else:
        (programs,) = op._GRIDS.values()
        assert programs > 0 and not cached and not op._LAUNCHES
    assert len(drv.launches) == 2
    first, second = drv.launches
    assert first[:5] == second[:5] and len(first) == len(second)  # grid, stream, the same kernel
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        op.fp8_paged_mqa_logits_triton(*inp.args(), True, config=cfg)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(drv.launches) == 3 and drv.launches[2][:5] == first[:5]
    assert cached == ([launch] if direct else []) and len(op._LAUNCHES) == int(direct)


def _marked(launch, outs):
    """A recorded launch with each output's address replaced by a marker (outputs are new per call)."""
    ptrs = {o.data_ptr() for o in outs}
    return tuple("out" if isinstance(a, int) and a in ptrs else a for a in launch)


@pytest.mark.parametrize("next_n,lens_2d", [(2, True), (1, False)])  # the defaults: "pipe", "tma"
def test_prepared_call_hands_the_launcher_what_the_other_paths_do(sm90_host, next_n, lens_2d):
    """Three calls of one signature: Triton's launch (the first, which binds), the bound launch of the
    kernel signature, and the call prepared for the full signature: the C launcher receives the same
    grid, stream, kernel and arguments from each (the outputs' addresses aside), TMA descriptor too."""
    from mqa_provider_gluon.launch import direct_launch_unsupported

    drv = sm90_host
    inp = make_paged_inputs(3, next_n, 64, 128, 300, block_size=64, lens_2d=lens_2d, seed=21)
    outs = [op.fp8_paged_mqa_logits_triton(*inp.args()) for _ in range(2)]
    prepared = op.prepare(*inp.args())
    if direct_launch_unsupported() is not None:  # only the grid is kept: nothing to prepare
        assert prepared is None and not op._LAUNCHES
        return
    assert prepared is not None and prepared.launch.tma == (next_n == 1)
    outs.append(prepared(inp.q, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables))
    assert all(o.shape == outs[0].shape and o.stride() == outs[0].stride() for o in outs)
    slow, bound, fast = (_marked(launch, outs) for launch in drv.launches)
    assert fast == bound and fast[:5] == slow[:5] and len(fast) == len(slow)
    assert fast == slow, "the bound launch passes what Triton's launcher passes"


def test_prepared_call_yields_to_hooks_the_interpreter_and_what_is_not_bound(sm90_host, monkeypatch):
    """With a launch hook set, the prepared call launches through Triton's own path (which hands the
    hook every launch), not the bound launcher; under the interpreter, or for a signature never
    bound (a config asked for explicitly, a moved pool start), there is nothing to prepare."""
    from mqa_provider_gluon.launch import direct_launch_unsupported
    from triton import knobs

    if direct_launch_unsupported() is not None:
        pytest.skip(direct_launch_unsupported())
    drv = sm90_host  # H = 32: a kernel no other test compiles (Triton keeps the recorder it was built with)
    inp = make_paged_inputs(2, 2, 32, 128, 200, block_size=64, lens_2d=True, seed=22)
    op.fp8_paged_mqa_logits_triton(*inp.args())
    prepared = op.prepare(*inp.args())
    assert prepared is not None
    assert op.prepare(*inp.args(), config=VARIANTS["rows"]) is None
    moved = torch.empty(inp.kv_cache.numel() + 16, dtype=torch.uint8)[4:4 + inp.kv_cache.numel()]
    assert op.prepare(inp.q, moved.view(inp.kv_cache.shape).copy_(inp.kv_cache), *inp.args()[2:]) is None
    direct = []
    real_launch_on = op._launch_on
    monkeypatch.setattr(op, "_launch_on", lambda *a: direct.append(a) or real_launch_on(*a))
    prepared(inp.q, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables)
    assert len(direct) == 1 and len(drv.launches) == 2
    # q 8 bytes past a 16-byte boundary: the same memo signature, another kernel specialisation, so
    # the prepared call takes the full launcher (which compiles for it and launches through Triton)
    q8 = torch.empty(inp.q.numel() + 8, dtype=torch.uint8)[8:].view(inp.q.dtype).view(inp.q.shape).copy_(inp.q)
    prepared(q8, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables)
    assert len(direct) == 1 and len(drv.launches) == 3 and drv.launches[2][4] != drv.launches[1][4]
    drv.launches.pop()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:  # Triton's launcher hands the hook to the C launch (here the recorder, which drops it)
        prepared(inp.q, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(direct) == 1 and len(drv.launches) == 3 and drv.launches[2][:5] == drv.launches[1][:5]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert op.prepare(*inp.args()) is None


def test_signature_tells_apart_what_triton_specialises_on():
    inp = make_paged_inputs(2, 1, 16, 64, 64, seed=15)
    cfg = PagedConfig()
    key = op._signature(inp.q, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables, True, cfg)
    same = make_paged_inputs(5, 1, 16, 64, 64, seed=16)  # another batch and contents: same launch
    assert key == op._signature(same.q, same.kv_cache, same.weights, same.context_lens,
                                same.block_tables, True, cfg)
    shifted = torch.empty(inp.kv_cache.numel() + 4, dtype=torch.uint8)[4:].view(inp.kv_cache.shape)
    assert key != op._signature(inp.q, shifted, inp.weights, inp.context_lens, inp.block_tables, True, cfg)
    assert key != op._signature(inp.q, inp.kv_cache, inp.weights, inp.context_lens, inp.block_tables,
                                False, cfg)
    assert key != op._signature(inp.q, pad_paged_cache(inp.kv_cache, 16), inp.weights,
                                inp.context_lens, inp.block_tables, True, cfg)


def test_resident_programs():
    # 166 registers x 128 threads: three programs of 4 warps in 64K registers; 56: by shared memory.
    assert resident_programs(166, 49_664, 4) == 3
    assert resident_programs(127, 49_664, 4) == 4  # the "rows" build of next_n = 2, H = 64
    assert resident_programs(64, 37_120, 4) == 6
    assert resident_programs(255, 200_000, 4) == 1
    assert resident_programs(32, 1_000, 4) == 16  # 2048 threads per SM


@pytest.mark.parametrize("bs", [64, 16])  # 16: a tile spans blocks, so TMA falls back to plain loads
def test_tma_path(interpret, bs):
    inp = make_paged_inputs(3, 2, 16, 64, 300, block_size=bs, seed=bs)
    check(fp8_paged_mqa_logits_triton(*inp.args(), config=PagedConfig(tma=True)), inp.reference(), True)


def test_block_table_shorter_than_context(interpret):
    """Positions past what the block table covers are not read (-inf), as in the reference."""
    inp = make_paged_inputs(2, 1, 16, 64, 256, block_size=64, seed=7)
    inp.context_lens[:] = 250
    tables = inp.block_tables[:, :2].contiguous()  # covers 128 positions
    out = fp8_paged_mqa_logits_triton(inp.q, inp.kv_cache, inp.weights, inp.context_lens, tables, 256)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, inp.context_lens, tables, 256)
    assert torch.isneginf(ref[:, 128:]).all()
    check(out, ref, True)


def test_gfx942_relabelling_is_exact(interpret, monkeypatch):
    """The in-kernel e4m3fn -> e4m3fnuz path of gfx942: q converted, cache bytes re-labelled, scales
    doubled. (The interpreter reads fnuz 0x80 as -0 rather than NaN, so the -0 fix-up itself is
    exercised only on gfx942 hardware.)"""
    monkeypatch.setattr(op, "wants_fnuz", lambda arch: True)
    inp = make_paged_inputs(2, 2, 16, 64, 150, block_size=16, seed=11)
    out = fp8_paged_mqa_logits_triton(*inp.args())
    check(out, inp.reference(), True)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inp = make_paged_inputs(1, 1, 16, 64, 32, seed=1)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        fp8_paged_mqa_logits_triton(*inp.args())


def test_interpreter_then_compiled_in_one_process(interpret, monkeypatch):
    """The kernel is jitted per mode on first use, and an interpreted run leaves Triton able to compile."""
    inp = make_paged_inputs(1, 2, 16, 64, 70, seed=3)
    check(fp8_paged_mqa_logits_triton(*inp.args()), inp.reference(), True)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert op.kernel() is not op.kernel(interpret=True)
    asm = compile_for(GPUTarget("cuda", 90, 32), next_n=1, h=16, d=64)
    assert "cubin" in asm


SM90_BUILDS = [(v, nn, h, 64) for v in sorted(VARIANTS) for nn, h in ((1, 32), (2, 64))] + [
    ("base", 2, 64, 16), ("base", 1, 128, 64), ("tma", 2, 128, 64), ("rows", 2, 32, 64)]


@pytest.mark.parametrize("variant,next_n,h,bs", SM90_BUILDS)
def test_sm90_build_uses_fp8_wgmma_without_spills(variant, next_n, h, bs):
    """Every benchmarked variant: fp8 wgmma, no spills, registers for 3 programs per SM, the keys
    pipelined num_stages - 1 tiles deep (one smem buffer per stage), the scale prefetch present."""
    from mqa_provider_gluon.aot import sass, sass_facts

    cfg = VARIANTS[variant]
    asm = compile_for(GPUTarget("cuda", 90, 32), next_n=next_n, h=h, d=128, block_size=bs, lens_2d=True,
                      config=cfg)
    tma = cfg.tma and bs % cfg.tile == 0
    assert ("cp.async.bulk.tensor" in asm["ptx"]) == tma  # TMA, or cp.async pointer loads
    assert tma or "cp.async.cg.shared.global" in asm["ptx"]
    facts = sass_facts(asm)
    assert facts.qgmma > 0 and facts.hgmma == 0, facts
    key_bytes = cfg.tile * 128
    if cfg.pipe:  # the compiler picks the depth of each load from the loop's stages
        depth = max(int(n) for n in re.findall(rf"(\d+)x{cfg.tile}x128xf8", asm["ttgir"]))
        assert depth >= 3, "keys not pipelined at least two tiles ahead"
        loop = _main_loop(sass(asm))
        assert "QGMMA" in loop and not re.search(r"\bLDG\.", loop), "a load the tile loop waits for"
    else:
        depth = cfg.num_stages
        assert f"{depth}x{cfg.tile}x128xf8" in asm["ttgir"], "keys not pipelined num_stages deep"
    assert facts.shared_bytes >= depth * key_bytes
    prefetches = sass(asm).count("CCTL.E.PF1")
    assert (prefetches > 0) == (cfg.prefetch > 0 and bs % cfg.tile == 0), prefetches
    # The register budget: three programs of 128 threads per SM; H = 128 (outside DeepGEMM's sm_90
    # range) may take two; the register cap of "rows" gives four. It is the tuned Triton's: under
    # another the build still has to be right (above), and a miss is reported as an expected failure
    # naming the numbers, since only an H200 benchmark can retune the variants.
    budget = cfg.maxnreg or (168 if h <= 64 else 192)
    within = facts.spill_stores == 0 and facts.spill_loads == 0 and facts.registers <= budget
    if not triton.__version__.startswith(op.TUNED_TRITON + ".") and not within:
        pytest.xfail(f"triton {triton.__version__}: {facts.registers} registers (budget {budget}), "
                     f"{facts.spill_stores} spill stores; the variants are tuned for triton {op.TUNED_TRITON}")
    assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    assert facts.registers <= budget, facts


def _main_loop(text: str) -> str:
    """The SASS of the innermost loop holding the wgmma: from the target of the first backward
    branch after the first QGMMA to that branch."""
    lines = re.findall(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", text, re.MULTILINE)
    first = next(int(a, 16) for a, ins in lines if "QGMMA" in ins)
    for a, ins in lines:
        target = re.search(r"BRA\S*\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ins)
        if int(a, 16) > first and target and target.group(1) and int(target.group(1), 16) <= first:
            start, end = int(target.group(1), 16), int(a, 16)
            return "\n".join(ins for a2, ins in lines if start <= int(a2, 16) <= end)
    raise AssertionError("no loop around the wgmma")


@pytest.mark.parametrize("arch,mfma", [("gfx950", "v_mfma_f32_32x32x64_f8f6f4"),
                                       ("gfx942", "v_mfma_f32_32x32x16_fp8_fp8")])
def test_amd_build_uses_fp8_mfma(arch, mfma):
    from mqa_provider_gluon.aot import mfma_ops

    try:
        asm = compile_for(GPUTarget("hip", arch, 64), next_n=2, h=64, d=128)
    except Exception as exc:  # a Triton build without the AMD backend
        pytest.skip(f"no {arch} build here: {type(exc).__name__}: {exc}")
    ops = mfma_ops(asm)
    assert ops[mfma] > 0 and all("f8" in name or "fp8" in name for name in ops), ops


def test_compiled_mode_kernel_keeps_its_constexpr_parameters():
    # A rebuilt function loses __annotations__; triton.jit then treats every constexpr as a runtime
    # value and the real (non-interpreted) compile fails. AOT compiles pass constexprs explicitly,
    # so only this check catches it on a machine without a GPU.
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import _jitted

    names = {p.name for p in _jitted(False).params if p.is_constexpr}
    assert {"NEXT_N", "H", "D", "NG", "TILE", "CLEAN"} <= names


def _gpu_inputs(seed: int, next_n: int = 2, h: int = 64):
    inp = make_paged_inputs(6, next_n, h, 128, 3000, block_size=64, seed=seed)
    lens = arbitrary_lens(6, next_n, 3000, seed=seed)
    lens[2] = 2999  # long rows next to short and empty ones
    tables = inp.block_tables.clone()
    tables[3, 5] = -1  # an out-of-range id inside a context
    lens[3] = 1000
    return inp, lens, tables


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("next_n,h", [(1, 32), (2, 64)])
def test_gpu_variants_match_the_oracle(variant, next_n, h):
    """Every variant on the GPU: a strided pool, arbitrary 2-D lengths, an out-of-range id, both
    clean modes, NaN-poisoned outputs; the second call takes the cached launch."""
    inp, lens, tables = _gpu_inputs(21, next_n, h)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, tables, 3000)
    pool = pad_paged_cache(inp.kv_cache.cuda(), 512)
    args = (inp.q.cuda(), pool, inp.weights.cuda(), lens.cuda(), tables.cuda(), 3000)
    for clean in (True, False, True):  # the third call is a cached launch
        torch.full((12, 3072), float("nan"), device="cuda")
        out = fp8_paged_mqa_logits_triton(*args, clean, config=VARIANTS[variant])
        check(out, ref, clean)
    assert any(launch.config == VARIANTS[variant] for launch in op._LAUNCHES.values())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_replay_follows_new_lengths():
    """Captured once, replayed after the lengths changed in place: the schedule is computed on
    the device from the current lengths (no host value baked into the graph)."""
    inp, lens, tables = _gpu_inputs(22)
    q, w, t = inp.q.cuda(), inp.weights.cuda(), tables.cuda()
    cache, dev_lens = inp.kv_cache.cuda(), lens.cuda()
    fp8_paged_mqa_logits_triton(q, cache, w, dev_lens, t, 3000)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fp8_paged_mqa_logits_triton(q, cache, w, dev_lens, t, 3000)
    for new in (lens, arbitrary_lens(6, 2, 3000, seed=5), torch.zeros_like(lens)):
        dev_lens.copy_(new)
        g.replay()
        check(out, fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, new, tables, 3000),
              True)


def test_default_config_follows_the_measured_table():
    """NVIDIA: the variant measured fastest for (next_n, H class); unmeasured classes get the base
    config; gfx9 keeps its own."""
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import _MEASURED_BEST, default_config

    for (next_n, h), name in _MEASURED_BEST.items():
        assert default_config("sm_90", 64, next_n, h) == VARIANTS[name]
    assert default_config("sm_90", 64, 1, 16) == VARIANTS[_MEASURED_BEST[(1, 32)]]
    assert default_config("sm_90", 64, 3, 64) == PagedConfig()
    assert default_config("sm_90", 64, 1, 128) == PagedConfig()
    assert default_config("gfx942", 64, 2, 64).num_stages == 2


def test_pipelined_config_is_checked():
    with pytest.raises(ValueError, match="pipe"):
        PagedConfig(pipe=1, prefetch=0)
    with pytest.raises(ValueError, match="prefetch 0"):
        PagedConfig(pipe=7)  # the pipelined loop loads the scales ahead itself
    assert str(PagedConfig(pipe=7, prefetch=0, tma=True)).endswith("tmaP7")
