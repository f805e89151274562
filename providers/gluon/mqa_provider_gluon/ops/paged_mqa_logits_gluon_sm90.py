"""fp8 paged MQA logits (the decode op) as a warp-specialised Gluon kernel for Hopper (sm_90), triton 3.6.

Why a second paged kernel: the Triton kernel (``paged_mqa_logits_triton``) needs several programs per
SM to keep enough cache bytes in flight, because each program waits for its own loads in order;
fewer, longer programs or deeper rings lose (cb9ff2b:bench/README.md, round 6). Here one CTA per SM keeps the
memory system busy by itself:

- a one-warp **loader** runs ahead through the block table: per 64-token tile one TMA copy of the
  tile's fp8 values (a [1, 64, D] box of the cache viewed as [blocks, block_size, D], so strided page
  pools need no copy) and one of its 64 float32 scales (a [1, 64] box of the scales viewed as
  [blocks, block_size]), into a STAGES-deep ring guarded by mbarriers; per sequence the q rows
  ([next_n * H, D], one box) and the weights ([next_n, H]) into a double buffer;
- four (or two) **math** warpgroups take the tiles round-robin: one wgmma with M = 64 keys,
  N = next_n * H query rows, K = D, then relu, the weight FMA, the head sum, the scale, the
  visibility mask and the store (four epilogues in flight are what the next_n = 2, H = 64 class needs);
  each hands its slot back as soon as the wgmma completes (``release``), and the default one sets the
  rings' barriers up after the partitions start, while the loader reads its first lengths and block
  ids (``late_init``, round 17);
- with ``clean_logits`` a one-warp **filler** writes the ``-inf`` tails (tiles past each sequence's
  context) while the others work;
- it is launched as a programmatic dependent launch: its CTAs may start (and set up a barrier)
  while the previous kernel on the stream finishes, and wait for it (``griddepcontrol.wait``) before
  any partition touches global memory (round 14: DeepGEMM's kernel waits the same way, where an engine
  turns its PDL on); then each CTA lets the next kernel launch (``launch_dependents``, round 15), so a
  next kernel launched the same way sets up on each SM as soon as this kernel's CTA there exits.

The batch's visible tiles are split evenly over the CTAs from the context lengths on the device, as
the Triton kernel does: no schedule buffer, no second launch, no host synchronisation, so it is
capturable in a CUDA graph. Or, given a decode step's ``schedule`` (``mqa_core.paged_schedule``,
computed once for every layer), each partition reads its range from that table instead (round 13:
the in-kernel split is ~0.9 us of an 8 us kernel's start; the table is one read). Without one, in
each CTA the default math warpgroup works the split out first, with shuffles inside each warp (its
four warps are replicas; no bar.sync), and publishes it in shared memory behind an mbarrier for
the loader, the other math warpgroups and the filler (round 11: the cross-warp scan it replaced
parked all 17 warps at CTA barriers before the first copy).

Scope: sm_90, e4m3fn, D in {64, 128}, H a power of two with 8 <= P * H <= 128 where P is next_n rounded
up to a power of two (next_n = 3 computes a fourth row it never stores; next_n above 2 runs with two
math warpgroups, :func:`default_config_for`), block_size a multiple of 64, 16-byte aligned q / pool /
strides. :func:`unsupported` says why a call is outside it; the provider then serves the call with the
Triton kernel. The provider sends a call here only for the classes in :data:`MEASURED_AHEAD`: next_n in
(1, 2) with H in (32, 64), each measured ahead of the Triton kernel on the H200 once this build's GPU
tests passed there
(cb9ff2b:bench/README.md, rounds 9 and 10).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from ..launch import bind, direct_launch_unsupported, hooks_active, residues
from .mqa_logits_gluon_sm90 import gluon_supported
from .paged_mqa_logits_triton import _device_facts, _launch_on, _row, fp8_paged_mqa_logits_triton
from .paged_mqa_logits_triton import prepare as prepare_triton

__all__ = ["PDL_VARIABLE", "GluonPagedConfig", "PreparedCall", "compile_sm90", "default_config",
           "fp8_paged_mqa_logits_gluon",
           "fp8_paged_mqa_logits_sm90", "prepare", "prepare_sm90", "serves", "unsupported"]

#: Keys per tile: one wgmma's M, one TMA box of one cache block.
TILE = 64
#: Sequences the split reads per step (SCHED / 32 per lane of each warp of the default partition).
SCHED = 128

@dataclasses.dataclass(frozen=True)
class GluonPagedConfig:
    """Launch shape. ``stages``: depth of the tile ring (a multiple of ``math_wgs``: each slot stays
    with one math warpgroup); the registers per thread of the partitions (the default math warpgroup
    gets what is left)."""

    stages: int = 8
    #: Math warpgroups (2 or 4): tiles go round-robin to them, so this many epilogues are in flight.
    #: Four measured ahead at every shape class (cb9ff2b:bench/README.md, round 9).
    math_wgs: int = 4
    #: Registers per thread of the math partitions but the default one, of the loader and of the
    #: filler; None: 232 / 40 / 40 with two math warpgroups, 112 / 24 / 24 with four (what the register
    #: file holds without spills at next_n * H = 128; AOT sm_90 builds, tests/gluon).
    math_regs: int | None = None
    loader_regs: int | None = None
    fill_regs: int | None = None
    #: 1: launched as a programmatic dependent launch (PDL): the CTAs may start while the previous kernel
    #: on the stream finishes and set up their barriers; the default partition then waits for that
    #: kernel (``griddepcontrol.wait``) before ``warp_specialize`` starts the partitions, so none
    #: touches global memory earlier. The launch overlaps the previous kernel's tail instead of
    #: following it (round 14). 0: a plain launch.
    pdl: int = 1
    #: 1: each CTA lets the next kernel on the stream launch (``griddepcontrol.launch_dependents``) once
    #: the previous one is done (at its start with ``pdl=0``): a next kernel launched with PDL then takes
    #: each SM as soon as this kernel's CTA there exits, sets up, and waits (its own
    #: ``griddepcontrol.wait``) for this whole grid. Without the trigger it launches only once every
    #: CTA here has exited (round 15). Kernels launched plainly are not affected.
    trigger: int = 1
    #: How a math warpgroup hands a ring slot back. 1: right after its wgmma completes, by its first
    #: thread alone with no warpgroup barrier (the wgmma's reads of the slot are done for the whole
    #: warpgroup once any of its threads sees it complete); the tile's scales and block id, read by
    #: every thread, then sit in a deeper ring (``stages + math_wgs`` slots, rounded up to a power of
    #: two), so the slot a tile reads them from is rewritten only after the warpgroup's next tile
    #: started, behind the barrier before that tile's wait. 0: a warpgroup barrier (``bar.sync``), then
    #: the release, per tile (round 16's kernel). Alone it measured neutral (cb9ff2b:bench/README.md, round 17).
    release: int = 1
    #: 1: the rings' barriers are set up by the default math warpgroup once the partitions have started,
    #: published with the split (``split_ready``), while the loader reads its range, lengths and first
    #: block ids; their set-up (one ``bar.sync`` per stage, triton 3.6's barrier analysis) is then off
    #: the path to the first copy. 0: set up before ``warp_specialize`` (round 16's kernel).
    late_init: int = 1
    #: 1: a debugging build that writes clock stamps (:data:`TRACE_EVENTS`) into an int64 [programs, TRACE_WIDTH]
    #: buffer given as ``schedule`` (bench/h200_decode_trace.py); 0 in every other use.
    trace: int = 0

    def __post_init__(self) -> None:
        if self.math_wgs not in (2, 4):
            raise ValueError(f"GluonPagedConfig.math_wgs must be 2 or 4, got {self.math_wgs}")
        flags = {"pdl": self.pdl, "trigger": self.trigger, "release": self.release, "late_init": self.late_init}
        if any(v not in (0, 1) for v in flags.values()):
            raise ValueError(f"GluonPagedConfig: pdl, trigger, release and late_init must be 0 or 1; "
                             f"got {', '.join(f'{k}={v}' for k, v in flags.items())}")
        if self.stages < self.math_wgs or self.stages % self.math_wgs:
            raise ValueError(f"GluonPagedConfig.stages must be a positive multiple of math_wgs ({self.math_wgs}): "
                             f"each ring slot stays with one math warpgroup; got {self.stages}")


#: The engine's choice of launch mode: "1" (default) PDL with the trigger, "0" a plain launch. Which is
#: faster depends on the kernels around the op (cb9ff2b:bench/README.md, round 15): with PDL-launched
#: neighbours PDL wins (B=32, 4k: 1.04-1.11x DeepGEMM against 0.92-0.94), beside plainly launched
#: ones the plain launch does (0.91-0.94 against 0.89-0.92).
PDL_VARIABLE = "MQA_GLUON_PDL"


def default_config_for(next_n: int) -> GluonPagedConfig:
    """:func:`default_config` for a call's next_n: above 2 (MTP's 3 and 4 draft tokens), two math
    warpgroups and an 8-deep ring, as four at next_n * H = 128 spill the loader's 24 registers (sm_90
    AOT builds, tests/gluon/test_paged_mqa_logits_gluon.py)."""
    cfg = default_config()
    return dataclasses.replace(cfg, math_wgs=2, stages=8) if next_n > 2 else cfg


def default_config() -> GluonPagedConfig:
    """The config of a call given none: the defaults, launched as :data:`PDL_VARIABLE` says (as the
    current state read it, once, like every ``MQA_*`` variable: ``mqa_core.reload()`` reads it again).
    A value that is not a boolean raises ``mqa_core.SettingsError`` naming the variable (when the
    state is built)."""
    from mqa_core.settings import parse_bool, setting_text

    pdl = parse_bool(PDL_VARIABLE, setting_text(PDL_VARIABLE), default=True)
    return GluonPagedConfig(pdl=int(pdl), trigger=int(pdl))


try:  # guarded: the module must import on any triton; gluon_supported() reports what is missing
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .mqa_logits_gluon_sm90 import mma_layout

    _jit = gluon.jit

    @gluon.constexpr_function
    def rows_pad(next_n):
        """The query rows a sequence's tensors hold: next_n rounded up to a power of two (a next_n of 3
        computes a fourth row, all zeros or the next sequence's, never stored)."""
        return 1 << (int(next_n) - 1).bit_length()
    SCHED_N = gl.constexpr(SCHED)
    _jit_sizes = gluon.jit(do_not_specialize=["num_seqs", "max_ctx", "covered", "num_blocks"])
except Exception:  # pragma: no cover - depends on the installed triton

    def _jit(fn):  # type: ignore[no-redef]
        return fn

    _jit_sizes = _jit


@_jit
def _add(a, b):
    return a + b


@_jit
def _ring(g, N: gl.constexpr):
    """(slot, phase) of item ``g`` >= 0 of an N-slot ring: with N a power of two, a mask and a shift
    (``%`` and ``//`` of a signed counter cost a sign correction each, on every tile of the loader's
    and the math's loops)."""
    if (N & (N - 1)) == 0:
        LOG: gl.constexpr = N.bit_length() - 1
        r = g & (N - 1), (g >> LOG) & 1
    else:
        r = g % N, (g // N) & 1
    return r


@_jit
def _seq_hi(cl_ptr, v, v_ok, covered, stride_clb, stride_clj, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Positions the longest query row of sequence(s) ``v`` sees, in [0, covered]."""
    row = cl_ptr + v.to(gl.int64) * stride_clb
    if LENS_2D:
        hi = gl.load(row, mask=v_ok, other=0)
        for j in gl.static_range(1, NEXT_N):
            hi = gl.maximum(hi, gl.load(row + j * stride_clj, mask=v_ok, other=0))
    else:  # the last row sees lens[b] - next_n + next_n positions
        hi = gl.load(row, mask=v_ok, other=0)
    return gl.minimum(gl.maximum(hi, 0), covered)


@_jit
def _share(i, total, P):
    """floor(i * total / P) for 0 <= i <= P: in 32 bits where the product fits (integer division is
    emulated, and 64-bit division costs several times more)."""
    if total <= 2147483647 // P:
        r = (i * total) // P
    else:
        r = ((i.to(gl.int64) * total) // P).to(gl.int32)
    return r


@_jit
def _chunk_tiles(cl_ptr, v, num_seqs, covered, stride_clb, stride_clj, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Tiles each sequence ``v`` of one schedule step computes (0 past the batch)."""
    ok = v < num_seqs
    return gl.where(ok, gl.cdiv(_seq_hi(cl_ptr, v, ok, covered, stride_clb, stride_clj, NEXT_N, LENS_2D), 64), 0)


@_jit
def _add6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5


@_jit
def _locate(v, n, base, lo, hi):
    """Within one chunk of sequences ``v`` holding ``n`` items each (``base`` items before the chunk):
    (sequence, offset) of item ``lo`` and of item ``hi - 1`` (zeros where not in this chunk), the
    chunk's item count, and the item count of item ``lo``'s sequence. Sequences without items never
    match."""
    end = gl.associative_scan(n, 0, _add) + base
    start = end - n
    at_lo = (start <= lo) & (lo < end)
    at_last = (start < hi) & (hi <= end)
    return gl.reduce((gl.where(at_lo, v, 0), gl.where(at_lo, lo - start, 0), gl.where(at_last, v, 0),
                      gl.where(at_last, hi - 1 - start, 0), n, gl.where(at_lo, n, 0)), 0, _add6)


@_jit
def _items(cl_ptr, v, num_seqs, covered, t_max, stride_clb, stride_clj, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr,
           FILL: gl.constexpr):
    """Items of sequences ``v``: the tiles each computes, or with FILL the tiles past them up to ``t_max``
    (0 past the batch)."""
    n = _chunk_tiles(cl_ptr, v, num_seqs, covered, stride_clb, stride_clj, NEXT_N, LENS_2D)
    if FILL:
        n = gl.where(v < num_seqs, t_max - n, 0)
    return n


@_jit
def _split(cl_ptr, num_seqs, covered, t_max, stride_clb, stride_clj, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr,
           FILL: gl.constexpr):
    """This CTA's even share of the batch's items (:func:`_items`) as ``(va, ta, vb, tb, v_end, n_va)``:
    (sequence, item) of its first and of its last item, the end of its sequence range and the item count
    of sequence ``va``. Worked out in registers by a 4-warp partition: every warp holds all SCHED
    sequences of a step (SCHED / 32 a lane; the warps are replicas), so the sums, the scan and the search
    are shuffles within one warp, with no shared memory and no ``bar.sync``."""
    lay: gl.constexpr = gl.BlockedLayout([SCHED_N // 32], [32], [4], [0])
    offs_s = gl.arange(0, SCHED_N, layout=lay)
    # the first SCHED sequences (all of them, in most batches) are read once and kept
    n0 = _items(cl_ptr, offs_s, num_seqs, covered, t_max, stride_clb, stride_clj, NEXT_N, LENS_2D, FILL)
    total = gl.sum(n0, 0)
    for c0 in range(SCHED_N, num_seqs, SCHED_N):
        total += gl.sum(_items(cl_ptr, c0 + offs_s, num_seqs, covered, t_max, stride_clb, stride_clj, NEXT_N,
                               LENS_2D, FILL), 0)
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    w_lo = _share(pid, total, P)
    w_hi = _share(pid + 1, total, P)
    va, ta, vb, tb, base, n_va = _locate(offs_s, n0, 0, w_lo, w_hi)
    for c0 in range(SCHED_N, num_seqs, SCHED_N):
        v = c0 + offs_s
        n = _items(cl_ptr, v, num_seqs, covered, t_max, stride_clb, stride_clj, NEXT_N, LENS_2D, FILL)
        d0, d1, d2, d3, d4, d5 = _locate(v, n, base, w_lo, w_hi)
        n_va += d5
        va += d0
        ta += d1
        vb += d2
        tb += d3
        base += d4
    return va, ta, vb, tb, gl.where(w_hi > w_lo, vb + 1, va), n_va


@_jit
def _publish(split, split_ready, cl_ptr, num_seqs, covered, max_ctx, stride_clb, stride_clj, NEXT_N: gl.constexpr,
             LENS_2D: gl.constexpr, CLEAN: gl.constexpr, PRESPLIT: gl.constexpr):
    """The default math warpgroup's first job: this CTA's split of the batch's tiles (``split[0:6]``) and,
    with CLEAN, of the -inf tails (``split[6:11]``), for the loader, the other math warpgroups and the
    filler; the arrive on ``split_ready`` releases the stores before it. (Not in each partition: with
    the scan the 24-register loader and filler warps spill, and the math warpgroups of next_n = 2,
    H = 64 hold its results in spilled registers; AOT sm_90 builds.)"""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    one = gl.zeros([1], gl.int32, lay)
    if not PRESPLIT:
        va, ta, vb, tb, v_end, n_va = _split(cl_ptr, num_seqs, covered, 0, stride_clb, stride_clj, NEXT_N, LENS_2D,
                                             False)
        _put_range(split, 0, va, ta, vb, tb, v_end, lay)
        split.index(5).store(one + n_va)
    if CLEAN:
        fa, fta, fb, ftb, fv_end, _ = _split(cl_ptr, num_seqs, covered, gl.cdiv(max_ctx, 64), stride_clb, stride_clj,
                                             NEXT_N, LENS_2D, True)
        _put_range(split, 6, fa, fta, fb, ftb, fv_end, lay)
    mbarrier.arrive(split_ready.index(0), count=1)


@_jit
def _put_range(split, at: gl.constexpr, a, b, c, d, e, lay: gl.constexpr):
    """One range of a split, ``(va, ta, vb, tb, v_end)``, into ``split[at:at + 5]``."""
    one = gl.zeros([1], gl.int32, lay)
    split.index(at).store(one + a)
    split.index(at + 1).store(one + b)
    split.index(at + 2).store(one + c)
    split.index(at + 3).store(one + d)
    split.index(at + 4).store(one + e)


@_jit
def _split_at(split, i: gl.constexpr, lay: gl.constexpr):
    """Entry ``i`` of the published split (after the wait on ``split_ready``)."""
    return gl.max(split.index(i).load(lay), 0)


@_jit
def _get_range(split, split_ready, at: gl.constexpr, lay: gl.constexpr):
    """``split[at:at + 5]``, the range :func:`_put_range` wrote, once ``split_ready`` has completed."""
    mbarrier.wait(split_ready.index(0), 0)
    return (_split_at(split, at, lay), _split_at(split, at + 1, lay), _split_at(split, at + 2, lay),
            _split_at(split, at + 3, lay), _split_at(split, at + 4, lay))


@_jit
def _table_range(sched_ptr, num_seqs):
    """This CTA's range from a precomputed split (``sched_ptr``: [programs + 1, 2] int32, row i where
    program i starts as (sequence, tile), as ``mqa_core.paged_schedule`` writes it) as
    :func:`_get_range` returns the published one. The first program starts at (0, 0) and the last ends
    at (B, 0) whatever the table says, and a program whose range runs past a sequence computes its
    tiles up to what the lengths give (the callers clip the last sequence's ``tb + 1`` to its tiles).
    So any table covers every tile: for a point x, the last row <= x starts a range that holds it (a
    table that is not monotone only makes ranges overlap, whose cells get equal values twice)."""
    pid = gl.program_id(0)
    last = pid + 1 == gl.num_programs(0)
    row = sched_ptr + pid * 2
    va = gl.minimum(gl.maximum(gl.load(row, mask=pid > 0, other=0), 0), num_seqs)
    ta = gl.maximum(gl.load(row + 1, mask=pid > 0, other=0), 0)
    ve = gl.minimum(gl.maximum(gl.load(row + 2, mask=not last, other=num_seqs), 0), num_seqs)
    te = gl.where(ve < num_seqs, gl.maximum(gl.load(row + 3, mask=not last, other=0), 0), 0)
    has = (ve > va) | ((ve == va) & (te > ta))
    return va, ta, gl.where(te > 0, ve, -1), te - 1, gl.where(has, ve + (te > 0).to(gl.int32), va)


@_jit
def _range(split, split_ready, sched_ptr, num_seqs, lay: gl.constexpr, PRESPLIT: gl.constexpr):
    """``(va, ta, vb, tb, v_end)``: this CTA's tiles, from the table or as published."""
    if PRESPLIT:
        r = _table_range(sched_ptr, num_seqs)
    else:
        r = _get_range(split, split_ready, 0, lay)
    return r


#: What a ``trace=1`` build stamps, by column of the trace buffer (clock64 cycles of the SM, but the
#: %globaltimer nanoseconds of 0 and 11, the tile count of 12, the SM of 14). Columns 15-19 are sums over
#: the program's tiles, in cycles: where the loader and warpgroup 0 spend the steady state.
TRACE_EVENTS = ("start ns", "start", "split published", "loader has range", "first copy issued",
                "last copy issued", "wg0 first tile ready", "wg0 done", "wg1 done", "wg2 done", "wg3 done", "end ns",
                "tiles", "loader start", "sm id", "loader waits for free slots", "wg0 waits for data",
                "wg0 waits for its wgmma", "wg0 epilogue", "wg0 tiles")
#: Columns per program of a trace buffer.
TRACE_WIDTH = gl.constexpr(32)


@_jit
def _stamp(trace_ptr, idx: gl.constexpr, lay: gl.constexpr, NS: gl.constexpr):
    """A ``trace=1`` build's stamp: clock64 (or with NS %globaltimer) into trace[program, idx]."""
    if NS:
        t = _sreg("mov.u64 $0, %globaltimer;", True, lay)
    else:
        t = _sreg("mov.u64 $0, %clock64;", True, lay)
    _put_trace(trace_ptr, idx, t, lay)


@_jit
def _tick(lay: gl.constexpr):
    """[1] int32: the SM's 32-bit clock, for a ``trace=1`` build's short intervals (fewer registers)."""
    return _sreg("mov.u32 $0, %clock;", False, lay)


@_jit
def _sreg(ASM: gl.constexpr, WIDE: gl.constexpr, lay: gl.constexpr):
    """[1] a special register that ``ASM`` moves into $0 (a clock, the SM id): int64 if WIDE, else int32."""
    z = gl.zeros([1], gl.int32, lay)
    if WIDE:
        v = gl.inline_asm_elementwise(ASM, "=l,r", [z], dtype=gl.int64, is_pure=False, pack=1)
    else:
        v = gl.inline_asm_elementwise(ASM, "=r,r", [z], dtype=gl.int32, is_pure=False, pack=1)
    return v


@_jit
def _put_trace(trace_ptr, idx: gl.constexpr, value, lay: gl.constexpr):
    ptr = trace_ptr.to(gl.pointer_type(gl.int64), bitcast=True) + gl.program_id(0) * TRACE_WIDTH + idx
    gl.store(ptr + gl.zeros([1], gl.int32, lay), value)


@_jit
def _loader(q_desc, w_desc, kv_desc, sc_desc, q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty,
            split, split_ready, sched_ptr, cl_ptr, bt_ptr, num_seqs, covered, stride_clb, stride_clj, stride_btb,
            NEXT_N: gl.constexpr, H: gl.constexpr, BS: gl.constexpr, STAGES: gl.constexpr, LENS_2D: gl.constexpr,
            PRESPLIT: gl.constexpr, TRACE: gl.constexpr, SC_SLOTS: gl.constexpr, LATE_INIT: gl.constexpr):
    """One warp: walks this CTA's tiles, issuing their TMA copies STAGES ahead of the math. Block ids
    are read 32 at a time, the next 32 requested while the current ones are issued."""
    NQ: gl.constexpr = NEXT_N * H  # the sequence's q rows in global memory (its box may hold more)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    if TRACE:
        _stamp(sched_ptr, 13, lay, False)
    va, ta, vb, tb, v_end = _range(split, split_ready, sched_ptr, num_seqs, lay, PRESPLIT and not TRACE)
    if TRACE:
        _stamp(sched_ptr, 3, lay, False)
    if PRESPLIT:
        n_va = gl.cdiv(_seq_hi(cl_ptr, va, va < num_seqs, covered, stride_clb, stride_clj, NEXT_N, LENS_2D), 64)
    else:
        n_va = _split_at(split, 5, lay)
    lane = gl.arange(0, 32, layout=lay)
    g = 0
    qn = 0
    waited = gl.zeros([1], gl.int64, lay)  # trace=1: cycles waiting for free slots
    # What each sequence starts with (its tile count, its first 32 block ids) is requested one sequence
    # ahead, so a switch of sequence does not wait for global memory; the first comes with the split.
    tiles = n_va
    first = gl.load(bt_ptr + va.to(gl.int64) * stride_btb + ((ta + lane) * 64) // BS,
                    mask=(ta + lane) * 64 < covered, other=0)
    if LATE_INIT:
        mbarrier.wait(split_ready.index(0), 0)  # the rings are set up (_init_rings)
    for v in range(va, v_end):
        t_lo = gl.where(v == va, ta, 0)
        t_hi = gl.where(v == vb, gl.minimum(tb + 1, tiles), tiles)
        nv = v + 1
        more = nv < v_end
        tiles = gl.cdiv(_seq_hi(cl_ptr, nv, more, covered, stride_clb, stride_clj, NEXT_N, LENS_2D), 64)
        blk_ids = first
        first = gl.load(bt_ptr + nv.to(gl.int64) * stride_btb + (lane * 64) // BS,
                        mask=more & (lane * 64 < covered), other=0)
        # every sequence of the range gets its q slot (the math warpgroups wait for each)
        qs, qph = _ring(qn, 2)
        mbarrier.wait(q_empty.index(qs), qph ^ 1)
        mbarrier.expect(q_ready.index(qs), q_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [v * NQ, 0], q_ready.index(qs), q_smem.index(qs))
        tma.async_copy_global_to_shared(w_desc, [v * NEXT_N, 0], q_ready.index(qs), w_smem.index(qs))
        qn += 1
        table = bt_ptr + v.to(gl.int64) * stride_btb
        for c in range(t_lo, t_hi, 32):
            nxt = gl.load(table + ((c + 32 + lane) * 64) // BS, mask=c + 32 + lane < t_hi, other=0)
            for i in range(gl.minimum(32, t_hi - c)):
                blk = gl.sum(gl.where(lane == i, blk_ids, 0), 0)
                s, ph = _ring(g, STAGES)
                s2 = _ring(g, SC_SLOTS)[0]  # the scales' and ids' slot
                if TRACE:
                    t0 = _tick(lay)
                mbarrier.wait(empty.index(s), ph ^ 1)
                if TRACE:
                    waited += (_tick(lay) - t0).to(gl.int64)
                ids.index(s2).store(gl.zeros([1], gl.int32, lay) + blk)
                mbarrier.expect(ready.index(s), kv_desc.block_type.nbytes + sc_desc.block_type.nbytes)
                off = ((c + i) * 64) % BS
                # ids outside [0, num_blocks) read zeros (TMA bounds); the math masks them.
                # The [64, D] ring slot, seen as the descriptor's [1, 64, D] box (same bytes).
                box = k_smem.index(s)._reinterpret(kv_desc.dtype, kv_desc.block_type.shape, kv_desc.layout)
                tma.async_copy_global_to_shared(kv_desc, [blk, off, 0], ready.index(s), box)
                tma.async_copy_global_to_shared(sc_desc, [blk, off], ready.index(s), sc_smem.index(s2))
                if TRACE:
                    if g == 0:
                        _stamp(sched_ptr, 4, lay, False)
                g += 1
            blk_ids = nxt
    if TRACE:
        _stamp(sched_ptr, 5, lay, False)
        _put_trace(sched_ptr, 12, gl.zeros([1], gl.int64, lay) + g, lay)
        _put_trace(sched_ptr, 15, waited, lay)


@_jit
def _row_lens(cl_ptr, v, offs_j, ok, covered, stride_clb, stride_clj, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """[next_n] positions each query row of sequence ``v`` sees, in [0, covered] (0 where not ``ok``)."""
    row = cl_ptr + v.to(gl.int64) * stride_clb
    if LENS_2D:
        lens = gl.load(row + offs_j * stride_clj, mask=ok, other=0)
    else:
        lens = gl.load(row + offs_j * 0, mask=ok, other=0) - NEXT_N + offs_j + 1
    return gl.minimum(gl.maximum(lens, 0), covered)


@_jit
def _head_sum(acc, w_row, NEXT_N: gl.constexpr, H: gl.constexpr):
    """[64 keys, next_n rows]: sum over heads of relu(acc) * weights (adjacent columns: in-thread sums
    and quad shuffles)."""
    return gl.sum(gl.reshape(gl.maximum(acc, 0.0) * w_row, [64, NEXT_N, H]), axis=2)


@_jit
def _math(q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready, sched_ptr, cl_ptr,
          out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj, stride_om, WG: gl.constexpr,
          NEXT_N: gl.constexpr, H: gl.constexpr, STAGES: gl.constexpr, MATH_WGS: gl.constexpr,
          LENS_2D: gl.constexpr, CLEAN: gl.constexpr, PRESPLIT: gl.constexpr, TRACE: gl.constexpr,
          RELEASE: gl.constexpr, SC_SLOTS: gl.constexpr, LATE_INIT: gl.constexpr):
    """One math warpgroup: the tiles ``g`` of the CTA's tile counter with ``g % MATH_WGS == WG``. The
    tensors hold NP = next_n rounded up to a power of two rows per sequence; rows past next_n are
    computed (their lengths are 0) and never stored."""
    NP: gl.constexpr = rows_pad(NEXT_N)
    NQ: gl.constexpr = NP * H
    mlay: gl.constexpr = mma_layout(64, NQ, 4)
    # The head sum's result layout (what the compiler infers for the reduction of the accumulator):
    # the positions, rows, lengths and scales are built in it, so no tile result changes layout.
    rlay: gl.constexpr = _head_sum(gl.zeros([64, NQ], gl.float32, mlay), gl.zeros([1, NQ], gl.float32, mlay),
                                   NP, H).type.layout
    slay: gl.constexpr = gl.SliceLayout(1, rlay)
    jlay: gl.constexpr = gl.SliceLayout(0, rlay)
    idl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    offs_t = gl.expand_dims(gl.arange(0, 64, layout=slay), 1)
    offs_j = gl.arange(0, NP, layout=jlay)
    real_j = offs_j < NEXT_N  # all true unless next_n is not a power of two
    if WG == 0:
        if TRACE:
            _stamp(sched_ptr, 0, idl, True)
            _stamp(sched_ptr, 1, idl, False)
            _put_trace(sched_ptr, 14, _sreg("mov.u32 $0, %smid;", False, idl).to(gl.int64), idl)
        if LATE_INIT:
            _init_rings(ready, empty, q_ready, q_empty, STAGES, MATH_WGS)
        if CLEAN or not PRESPLIT or TRACE:
            _publish(split, split_ready, cl_ptr, num_seqs, covered, max_ctx, stride_clb, stride_clj, NEXT_N, LENS_2D,
                     CLEAN, PRESPLIT and not TRACE)
        elif LATE_INIT:
            mbarrier.arrive(split_ready.index(0), count=1)
        if TRACE:
            _stamp(sched_ptr, 2, idl, False)
    va, ta, vb, tb, v_end = _range(split, split_ready, sched_ptr, num_seqs, idl, PRESPLIT and not TRACE)
    if LATE_INIT:
        mbarrier.wait(split_ready.index(0), 0)  # the rings are set up
    g = 0
    qn = 0
    spent = gl.zeros([4], gl.int64, gl.BlockedLayout([4], [32], [4], [0]))  # trace=1: data, wgmma, epilogue, tiles
    lens_n = _row_lens(cl_ptr, va, offs_j, real_j, covered, stride_clb, stride_clj, NEXT_N, LENS_2D)
    if NP != NEXT_N:
        lens_n = gl.where(real_j, lens_n, 0)
    for v in range(va, v_end):
        lens = lens_n
        more = v + 1 < v_end  # the next sequence's lengths, requested now
        lens_n = _row_lens(cl_ptr, v + 1, offs_j, more & real_j, covered, stride_clb, stride_clj, NEXT_N, LENS_2D)
        if NP != NEXT_N:
            lens_n = gl.where(real_j, lens_n, 0)
        t_lo = gl.where(v == va, ta, 0)
        tiles = gl.cdiv(gl.max(lens, 0), 64)
        t_hi = gl.where(v == vb, gl.minimum(tb + 1, tiles), tiles)
        rows = out_ptr + gl.expand_dims((v * NEXT_N + offs_j).to(gl.int64) * stride_om, 0)
        lens2 = gl.expand_dims(lens, 0)
        qs, qph = _ring(qn, 2)
        mbarrier.wait(q_ready.index(qs), qph)
        q_op = q_smem.index(qs).permute((1, 0))
        w_row = gl.expand_dims(w_smem.index(qs)._reinterpret(gl.float32, [NQ], flat).load(gl.SliceLayout(0, mlay)),
                               0)  # came with q
        n_t = gl.maximum(t_hi - t_lo, 0)
        for i in range((WG - g % MATH_WGS + MATH_WGS) % MATH_WGS, n_t, MATH_WGS):
            s, ph = _ring(g + i, STAGES)
            s2 = _ring(g + i, SC_SLOTS)[0]
            if RELEASE:
                # every thread of this warpgroup has read its previous tile's scales and block id: the
                # loader rewrites those slots only after a release that follows this barrier
                gl.thread_barrier()
            if TRACE:
                c0 = _tick(idl)
            mbarrier.wait(ready.index(s), ph)
            if TRACE:
                c1 = _tick(idl)
                if WG == 0:
                    if g + i == 0:
                        _stamp(sched_ptr, 6, idl, False)
            acc = warpgroup_mma(k_smem.index(s), q_op, gl.zeros([64, NQ], gl.float32, mlay), use_acc=False,
                                is_async=True)
            # during the wgmma
            sc = gl.expand_dims(sc_smem.index(s2)._reinterpret(gl.float32, [64], flat).load(slay), 1)
            blk = gl.max(ids.index(s2).load(idl), 0)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            if TRACE:
                c2 = _tick(idl)
            if RELEASE:
                # an arrive with no bytes expected: triton 3.6's barrier analysis puts no bar.sync before it
                mbarrier.expect(empty.index(s), 0)
            else:
                mbarrier.arrive(empty.index(s), count=1)
            r = _head_sum(acc, w_row, NP, H)
            p2 = (t_lo + i) * 64 + offs_t
            seen = (p2 < lens2) & (blk >= 0) & (blk < num_blocks)
            logits = gl.where(seen, r * sc, float("-inf")).to(rows.dtype.element_ty)
            if NP == NEXT_N:
                gl.store(rows + p2, logits, mask=p2 < max_ctx)
            else:
                gl.store(rows + p2, logits, mask=(p2 < max_ctx) & gl.expand_dims(real_j, 0))
            if TRACE:
                spent = _account(spent, c0, c1, c2, _tick(idl))
        mbarrier.arrive(q_empty.index(qs), count=1)
        g += n_t
        qn += 1
    if TRACE:
        _stamp(sched_ptr, 7 + WG, idl, False)
        if WG == 0:
            _stamp(sched_ptr, 11, idl, True)
            ptr = sched_ptr.to(gl.pointer_type(gl.int64), bitcast=True) + gl.program_id(0) * TRACE_WIDTH + 16
            gl.store(ptr + gl.arange(0, 4, layout=spent.type.layout), spent)


@_jit
def _account(spent, c0, c1, c2, c3):
    """trace=1: one tile's cycles added to [waiting for data, waiting for the wgmma, epilogue, tiles]."""
    k = gl.arange(0, 4, layout=spent.type.layout)
    one = gl.where(k == 0, gl.sum(c1 - c0, 0), gl.where(k == 1, gl.sum(c2 - c1, 0), gl.sum(c3 - c2, 0)))
    return spent + gl.where(k == 3, 1, one).to(gl.int64)


@_jit
def _filler(split, split_ready, cl_ptr, out_ptr, covered, max_ctx, stride_clb, stride_clj, stride_om,
            NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """One warp: -inf into this CTA's share of the tiles past each sequence's computed ones."""
    lay: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])
    offs = gl.arange(0, 64, layout=lay)
    ninf = gl.full([64], float("-inf"), out_ptr.dtype.element_ty, lay)
    t_max = gl.cdiv(max_ctx, 64)
    fa, fta, fb, ftb, fv_end = _get_range(split, split_ready, 6, lay)
    for v in range(fa, fv_end):
        n = gl.cdiv(_seq_hi(cl_ptr, v, True, covered, stride_clb, stride_clj, NEXT_N, LENS_2D), 64)
        i_lo = gl.where(v == fa, fta, 0)
        i_hi = gl.where(v == fb, ftb + 1, t_max - n)
        for j in gl.static_range(NEXT_N):
            row = out_ptr + (v * NEXT_N + j).to(gl.int64) * stride_om
            for i in range(i_lo, i_hi):
                pos = (n + i) * 64 + offs
                gl.store(row + pos, ninf, mask=pos < max_ctx)


@_jit
def _init_rings(ready, empty, q_ready, q_empty, STAGES: gl.constexpr, MATH_WGS: gl.constexpr):
    """The rings' barriers: one arrival completes a tile's copy (the loader's expect) or hands its slot
    back (its math warpgroup); a q slot is handed back by every math warpgroup."""
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=MATH_WGS)
    fence_async_shared()  # visible to the copies' completions (async proxy) once published


@_jit
def _grid_dependency(WAIT: gl.constexpr, TRIGGER: gl.constexpr):
    """Run by the default partition after its barrier set-up and before ``warp_specialize``, whose start
    releases the other partitions only after it. WAIT, a programmatic dependent launch's wait: returns
    once the previous kernel on the stream has completed and its writes are visible, so no partition
    touches global memory before it is done (the inputs it wrote, the output's memory it may still
    use). Then TRIGGER lets the next kernel launch (``launch_dependents``): that kernel's own wait
    still holds it until this grid has completed."""
    if WAIT and TRIGGER:
        asm: gl.constexpr = "griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, $1;"
    elif WAIT:
        asm: gl.constexpr = "griddepcontrol.wait; mov.u32 $0, $1;"
    else:
        asm: gl.constexpr = "griddepcontrol.launch_dependents; mov.u32 $0, $1;"
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    gl.inline_asm_elementwise(asm, "=r,r", [gl.zeros([1], gl.int32, lay)], dtype=gl.int32, is_pure=False, pack=1)


@_jit_sizes
def _paged_kernel_ws(q_desc, w_desc, kv_desc, sc_desc, cl_ptr, bt_ptr, sched_ptr, out_ptr, num_seqs, max_ctx,
                     covered, num_blocks, stride_clb, stride_clj, stride_btb, stride_om, NEXT_N: gl.constexpr,
                     H: gl.constexpr, BS: gl.constexpr, STAGES: gl.constexpr, MATH_WGS: gl.constexpr,
                     LENS_2D: gl.constexpr, CLEAN: gl.constexpr, MATH_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                     FILL_REGS: gl.constexpr, PRESPLIT: gl.constexpr, TRACE: gl.constexpr, PDL: gl.constexpr,
                     TRIGGER: gl.constexpr, RELEASE: gl.constexpr, LATE_INIT: gl.constexpr,
                     num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4, "the default partition is one math warpgroup")
    NP: gl.constexpr = rows_pad(NEXT_N)  # a sequence's rows in the tensors (q's and w's TMA boxes)
    NQ: gl.constexpr = NP * H
    D: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, NQ, D], q_desc.layout)
    # The float32 TMA targets take their descriptors' layouts, so the allocator aligns them as TMA needs
    # (128 bytes); the math reads them through flat views of the same bytes.
    w_smem = gl.allocate_shared_memory(gl.float32, [2, NP, H], w_desc.layout)
    k_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, 64, D],
                                       gl.NVMMASharedLayout.get_default_for([64, D], kv_desc.dtype))
    # With RELEASE the scales and block ids sit in a deeper ring than the values: tile g's slot is
    # rewritten for tile g + SC_SLOTS, issued once tile g + SC_SLOTS - STAGES was released, which
    # (SC_SLOTS >= STAGES + MATH_WGS) is at or past the warpgroup's next tile, behind the barrier before
    # its wait (GluonPagedConfig.release). A power of two: slot by mask.
    SC_SLOTS: gl.constexpr = (1 << (STAGES + MATH_WGS - 1).bit_length()) if RELEASE else STAGES
    sc_smem = gl.allocate_shared_memory(gl.float32, [SC_SLOTS, 1, 64], sc_desc.layout)
    ids = gl.allocate_shared_memory(gl.int32, [SC_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    split = gl.allocate_shared_memory(gl.int32, [11, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    split_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(split_ready.index(0), count=1)
    if not LATE_INIT:
        _init_rings(ready, empty, q_ready, q_empty, STAGES, MATH_WGS)
    if PDL or TRIGGER:
        _grid_dependency(PDL, TRIGGER)
    # The partition lists are written out: a tuple bound to a name would turn its constexprs into tensors.
    if MATH_WGS == 2:
        if CLEAN:
            gl.warp_specialize([
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 0, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 1, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_loader, (q_desc, w_desc, kv_desc, sc_desc, q_smem, w_smem, k_smem, sc_smem, ids, ready, empty,
                           q_ready, q_empty, split, split_ready, sched_ptr, cl_ptr, bt_ptr, num_seqs, covered,
                           stride_clb, stride_clj, stride_btb, NEXT_N, H, BS, STAGES, LENS_2D, PRESPLIT, TRACE,
                           SC_SLOTS, LATE_INIT)),
                (_filler, (split, split_ready, cl_ptr, out_ptr, covered, max_ctx, stride_clb, stride_clj, stride_om,
                           NEXT_N, LENS_2D)),
            ], [4, 1, 1], [MATH_REGS, LOADER_REGS, FILL_REGS])
        else:
            gl.warp_specialize([
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 0, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 1, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_loader, (q_desc, w_desc, kv_desc, sc_desc, q_smem, w_smem, k_smem, sc_smem, ids, ready, empty,
                           q_ready, q_empty, split, split_ready, sched_ptr, cl_ptr, bt_ptr, num_seqs, covered,
                           stride_clb, stride_clj, stride_btb, NEXT_N, H, BS, STAGES, LENS_2D, PRESPLIT, TRACE,
                           SC_SLOTS, LATE_INIT)),
            ], [4, 1], [MATH_REGS, LOADER_REGS])
    else:
        if CLEAN:
            gl.warp_specialize([
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 0, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 1, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 2, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 3, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_loader, (q_desc, w_desc, kv_desc, sc_desc, q_smem, w_smem, k_smem, sc_smem, ids, ready, empty,
                           q_ready, q_empty, split, split_ready, sched_ptr, cl_ptr, bt_ptr, num_seqs, covered,
                           stride_clb, stride_clj, stride_btb, NEXT_N, H, BS, STAGES, LENS_2D, PRESPLIT, TRACE,
                           SC_SLOTS, LATE_INIT)),
                (_filler, (split, split_ready, cl_ptr, out_ptr, covered, max_ctx, stride_clb, stride_clj, stride_om,
                           NEXT_N, LENS_2D)),
            ], [4, 4, 4, 1, 1], [MATH_REGS, MATH_REGS, MATH_REGS, LOADER_REGS, FILL_REGS])
        else:
            gl.warp_specialize([
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 0, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 1, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 2, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_math, (q_smem, w_smem, k_smem, sc_smem, ids, ready, empty, q_ready, q_empty, split, split_ready,
                          sched_ptr, cl_ptr, out_ptr, num_seqs, covered, max_ctx, num_blocks, stride_clb, stride_clj,
                          stride_om, 3, NEXT_N, H, STAGES, MATH_WGS, LENS_2D, CLEAN, PRESPLIT, TRACE, RELEASE,
                          SC_SLOTS, LATE_INIT)),
                (_loader, (q_desc, w_desc, kv_desc, sc_desc, q_smem, w_smem, k_smem, sc_smem, ids, ready, empty,
                           q_ready, q_empty, split, split_ready, sched_ptr, cl_ptr, bt_ptr, num_seqs, covered,
                           stride_clb, stride_clj, stride_btb, NEXT_N, H, BS, STAGES, LENS_2D, PRESPLIT, TRACE,
                           SC_SLOTS, LATE_INIT)),
            ], [4, 4, 4, 1], [MATH_REGS, MATH_REGS, MATH_REGS, LOADER_REGS])


@functools.cache
def _layouts(d: int, nq: int) -> tuple[Any, Any, Any]:
    """Shared-memory layouts of the TMA boxes: q [NQ, D], values [1, 64, D], and the unswizzled float32
    ones (scales [1, 64], weights [next_n, H])."""
    return (gl.NVMMASharedLayout.get_default_for([nq, d], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([1, TILE, d], gl.float8e4nv),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


def _constexprs(cfg: GluonPagedConfig, next_n: int, h: int, block_size: int, lens_2d: bool,
                clean: bool, presplit: bool = False) -> dict[str, Any]:
    two = cfg.math_wgs == 2
    return {"NEXT_N": next_n, "H": h, "BS": block_size, "STAGES": cfg.stages, "MATH_WGS": cfg.math_wgs,
            "LENS_2D": bool(lens_2d), "CLEAN": bool(clean), "MATH_REGS": cfg.math_regs or (232 if two else 112),
            "LOADER_REGS": cfg.loader_regs or (40 if two else 24),
            "FILL_REGS": (cfg.fill_regs or (40 if two else 24)) if clean else 0, "PRESPLIT": bool(presplit),
            "TRACE": bool(cfg.trace), "PDL": bool(cfg.pdl), "TRIGGER": bool(cfg.trigger), "RELEASE": bool(cfg.release),
            "LATE_INIT": bool(cfg.late_init),
            "num_warps": 4}


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _rows_pad(next_n: int) -> int:
    """next_n rounded up to a power of two: the rows a sequence's q and weights boxes hold (the kernel's
    ``rows_pad``)."""
    return 1 << (next_n - 1).bit_length()


def unsupported(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                block_tables: torch.Tensor) -> str | None:
    """None when this kernel serves the call, else why not (the caller then uses the Triton kernel)."""
    reason = gluon_supported(q.device)
    if reason:
        return reason
    b, next_n, h, d = q.shape
    if q.dtype != torch.float8_e4m3fn:
        return f"q is {q.dtype}; the Gluon paged kernel reads float8_e4m3fn"
    if d not in (64, 128) or not (_pow2(h) and 8 <= _rows_pad(next_n) * h <= 128):
        return (f"next_n={next_n}, H={h}, D={d}: the Gluon paged kernel needs D in (64, 128), H a power of two "
                "and 8 <= P * H <= 128, P = next_n rounded up to a power of two")
    if kv_cache.shape[1] % TILE:
        return f"block_size {kv_cache.shape[1]} is not a multiple of {TILE}"
    if q.stride() != (next_n * h * d, h * d, d, 1) or q.data_ptr() % 16:
        return "q is not contiguous and 16-byte aligned (TMA reads it as [B * next_n * H, D] rows)"
    if kv_cache.data_ptr() % 16 or kv_cache.stride(0) % 16:
        return "the page pool's start or block stride is not a multiple of 16 bytes (TMA needs both)"
    if weights.dtype != torch.float32 or weights.stride(1) != 1 or weights.stride(0) % 4 or weights.data_ptr() % 16:
        return "weights are not float32 rows with unit inner stride, 16-byte aligned (TMA reads them with q)"
    if context_lens.dtype != torch.int32 or block_tables.dtype != torch.int32 or block_tables.stride(1) != 1:
        return "context_lens and block_tables must be int32 (block_tables with unit inner stride)"
    return None


def _q_descriptor(q: torch.Tensor) -> Any:
    """q [B, next_n, H, D] as [B * next_n * H, D] rows, one [P * H, D] box per sequence (P: next_n rounded
    up to a power of two)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, next_n, h, d = q.shape
    nq, box = next_n * h, _rows_pad(next_n) * h  # a box past the last sequence reads zeros (TMA bounds)
    return TensorDescriptor(q.view(b * nq, d), [b * nq, d], [d, 1], [box, d], _layouts(d, box)[0])


def _w_descriptor(weights: torch.Tensor, next_n: int) -> Any:
    """weights [B * next_n, H] (any 16-byte row stride), one [next_n, H] box per sequence."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, h = weights.shape
    return TensorDescriptor(weights, [m, h], [weights.stride(0), 1], [_rows_pad(next_n), h], _layouts(16, 16)[2])


def _kv_descriptors(kv_cache: torch.Tensor, dtype: torch.dtype) -> tuple[Any, Any]:
    """The pool's values as [blocks, block_size, D] (a [1, 64, D] box per tile) and its scales as
    [blocks, block_size] float32 (a [1, 64] box), both ``stride(0)`` bytes per block: no copy."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    nb, bs, _, d4 = kv_cache.shape
    d = d4 - 4
    _, kv_lay, sc_lay = _layouts(d, 8)
    stride0 = kv_cache.stride(0)
    base = kv_cache.storage_offset()
    values = kv_cache.as_strided((nb, bs, d), (stride0, d, 1), base).view(dtype)
    scales = kv_cache.as_strided((nb, bs * 4), (stride0, 1), base + bs * d).view(torch.float32)
    return (TensorDescriptor(values, [nb, bs, d], [stride0, d, 1], [1, TILE, d], kv_lay),
            TensorDescriptor(scales, [nb, bs], [stride0 // 4, 1], [1, TILE], sc_lay))


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What a call signature needs at launch: the bound kernel (``launch.BoundKernel``, or False where
    calls launch through Triton), the grid (one CTA per SM), the stride arguments and the constexprs
    (the C launcher skips them, but counts them), and the config it was built with (a call given none
    keeps the launch mode :func:`default_config` read at binding, also where it launches through Triton)."""

    bound: Any
    grid: int
    strides: tuple[int, ...]
    constexprs: tuple[Any, ...]
    config: GluonPagedConfig


#: Launch state per call signature (bounded, as the Triton kernel's).
_LAUNCHES: dict[tuple[Any, ...], _Launch] = {}
_LAUNCHES_MAX = 256


def _signature(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, lens: torch.Tensor,
               tables: torch.Tensor, clean: bool, cfg: GluonPagedConfig | None,
               ptrs: tuple[int, ...], presplit: bool = False,
               logits_dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """What the compiled kernel and its launch depend on: device, dtypes, sizes but B and the pool's
    block count, every stride (Triton specialises the stride arguments), the five pointers' 16-byte
    residues (``ptrs``: q, pool, weights, lengths, tables), the clean mode and the config."""
    return (q.device, q.dtype, q.shape[1:], kv_cache.shape[1:], kv_cache.stride(), q.stride(), weights.stride(),
            weights.dtype, lens.dtype, lens.dim(), lens.stride(), tables.dtype, tables.stride(), clean, cfg, presplit,
            (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 and residues(ptrs), logits_dtype)


def _ptrs(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, lens: torch.Tensor,
          tables: torch.Tensor) -> tuple[int, ...]:
    return q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), lens.data_ptr(), tables.data_ptr()


def _tail(launch: _Launch, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor,
          max_context_len: int, logits_dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """The kernel's arguments after the output pointer (B ... the constexprs), in parameter order."""
    nb, bs = kv_cache.shape[:2]
    return (q.shape[0], max_context_len, min(max_context_len, tables.shape[1] * bs), nb, *launch.strides,
            _row(max_context_len, logits_dtype.itemsize), *launch.constexprs)


def _run(launch: _Launch, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, ptrs: tuple[int, ...],
         size: tuple[int, int], index: int | None, tail: tuple[Any, ...], sched: int = 0,
         logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The hot path for a non-empty call (B, max_context_len and the pool's blocks all > 0): allocate
    the output (``size``), hand the pointers (``ptrs``, as :func:`_ptrs`), the cached descriptor
    encodings and ``tail`` (:func:`_tail`) to the bound launcher; ``sched``: the schedule table's
    address (0: none, the lengths' address goes in its place)."""
    out = _new_output(size[0], size[1], weights, logits_dtype)
    bound = launch.bound
    b, nb = tail[0], tail[3]
    # keyed per tensor (an engine's q, weights and per-layer pools combine into many more triples)
    q_desc = bound.descriptor((0, ptrs[0], b), _q_descriptor, q)
    w_desc = bound.descriptor((1, ptrs[2], b), _w_descriptor, weights, q.shape[1])
    kv_descs = bound.descriptors((2, ptrs[1], nb), _kv_descriptors, kv_cache, q.dtype)
    _launch_on(bound, launch.grid, index, (*q_desc, *w_desc, *kv_descs, ptrs[3], ptrs[4], sched or ptrs[3],
                                           out.data_ptr(), *tail))
    return out


def _new_output(m: int, n: int, weights: torch.Tensor, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[m, n] logits on the weights' device, with the Triton kernel's row stride (``_row``). The weights
    are float32 here (:func:`unsupported`), so for float32 logits their ``new_empty_strided`` is
    ``torch.empty_strided(..., dtype=float32, device=...)`` without parsing either argument; every output
    of this module comes from here (the tests poison it)."""
    if logits_dtype is _F32:
        return weights.new_empty_strided((m, n), (_row(n), 1))
    return weights.new_empty_strided((m, n), (_row(n, logits_dtype.itemsize), 1), dtype=logits_dtype)


_F32 = torch.float32


def fp8_paged_mqa_logits_gluon(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                               context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                               clean_logits: bool = True, *, config: GluonPagedConfig | None = None,
                               schedule: torch.Tensor | None = None,
                               logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The paged op (contract of ``fp8_paged_mqa_logits_triton``) on this kernel: ``[B * next_n,
    max_context_len]`` of ``logits_dtype`` (bfloat16: rounded to nearest as stored), rows padded to 64
    bytes. Raises ValueError with :func:`unsupported`'s
    reason outside its scope. The first call of a signature compiles and binds the launch; later ones
    allocate the output and launch (descriptors encoded once per pointer and size). ``schedule``: a
    precomputed split (:func:`schedule_unsupported` says what it must be), read instead of worked out."""
    clean_logits = bool(clean_logits)
    if schedule is not None and not (config and config.trace):
        reason = schedule_unsupported(schedule, q.device)
        if reason:
            raise ValueError(f"fp8_paged_mqa_logits_gluon: {reason}")
    ptrs = _ptrs(q, kv_cache, weights, context_lens, block_tables)
    key = _signature(q, kv_cache, weights, context_lens, block_tables, clean_logits, config, ptrs,
                     schedule is not None, logits_dtype)
    return _call(_LAUNCHES.get(key), key, ptrs, q, kv_cache, weights, context_lens, block_tables, max_context_len,
                 clean_logits, config, schedule, logits_dtype)


def schedule_unsupported(schedule: torch.Tensor, device: torch.device) -> str | None:
    """None when ``schedule`` is a split this kernel reads: int32 [programs + 1, 2], contiguous, on the
    call's device, one program per multiprocessor (the grid)."""
    want = _multiprocessors(device.index) + 1
    if schedule.dtype != torch.int32 or schedule.dim() != 2 or schedule.shape[1] != 2 or not schedule.is_contiguous():
        return f"the schedule must be contiguous int32 [{want}, 2]; got {schedule.dtype} {list(schedule.shape)}"
    if schedule.device != device:
        return f"the schedule is on {schedule.device}, the call on {device}"
    if schedule.shape[0] != want:
        return (f"the schedule has {schedule.shape[0]} rows; this kernel runs one program per multiprocessor "
                f"and needs {want} (num_sms = {want - 1})")
    return None


def _call(launch: _Launch | None, key: tuple[Any, ...], ptrs: tuple[int, ...], q: torch.Tensor,
          kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
          max_context_len: int, clean_logits: bool, config: GluonPagedConfig | None,
          schedule: torch.Tensor | None = None, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`fp8_paged_mqa_logits_gluon` once its signature ``key`` (with ``launch``, what
    ``_LAUNCHES`` holds for it) is known: the bound launch, or the checks, Triton's launch and binding."""
    if launch is not None and launch.bound and not hooks_active() and q.shape[0] and max_context_len \
            and kv_cache.shape[0]:
        return _run(launch, q, kv_cache, weights, ptrs, (q.shape[0] * q.shape[1], max_context_len), q.device.index,
                    _tail(launch, q, kv_cache, block_tables, max_context_len, logits_dtype),
                    0 if schedule is None else schedule.data_ptr(), logits_dtype)
    reason = unsupported(q, kv_cache, weights, context_lens, block_tables)
    if reason:
        raise ValueError(f"fp8_paged_mqa_logits_gluon: {reason}")
    b, next_n, h, d = q.shape
    nb, bs = kv_cache.shape[:2]
    out = _new_output(b * next_n, max_context_len, weights, logits_dtype)
    if out.numel() == 0:
        return out
    if nb == 0:
        return out.fill_(float("-inf"))
    cfg = config or (launch.config if launch is not None else default_config_for(next_n))
    lens_2d = context_lens.dim() == 2
    strides = (*(context_lens.stride() if lens_2d else (context_lens.stride(0), 0)), block_tables.stride(0))
    constexprs = _constexprs(cfg, next_n, h, bs, lens_2d, clean_logits, schedule is not None)
    kv_desc, sc_desc = _kv_descriptors(kv_cache, q.dtype)
    grid = _multiprocessors(q.device.index)
    with torch.cuda.device(q.device):
        compiled = _paged_kernel_ws[(grid,)](_q_descriptor(q), _w_descriptor(weights, next_n), kv_desc, sc_desc,
                                             context_lens, block_tables,
                                             context_lens if schedule is None else schedule, out, b,
                                             max_context_len, min(max_context_len, block_tables.shape[1] * bs), nb,
                                             *strides, out.stride(0), launch_pdl=bool(cfg.pdl), **constexprs)
    if launch is None:
        if len(_LAUNCHES) >= _LAUNCHES_MAX:
            _LAUNCHES.clear()
        params = _paged_kernel_ws.arg_names[len(_paged_kernel_ws.arg_names) - len(constexprs):]
        _LAUNCHES[key] = _Launch(bind(compiled) if direct_launch_unsupported() is None else False, grid, strides,
                                 tuple(constexprs[p] for p in params), cfg)
    return out


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """mqa-core's prepared call for one full call signature (``mqa_core.memo``: every shape and stride
    fixed), with everything that signature fixes worked out once: the bound launch, the output's size,
    the kernel's arguments after the output pointer. Per call it reads five pointers
    (other 16-byte residues, or a Triton launch hook, take the full launcher), allocates and launches."""

    launch: _Launch
    size: tuple[int, int]
    index: int | None
    #: :func:`_tail`: B ... the constexprs.
    tail: tuple[Any, ...]
    max_context_len: int
    clean_logits: bool
    residues: tuple[int, ...] | None
    #: The launch reads a schedule: calls of this signature come with one that :func:`schedule_unsupported`
    #: accepts (mqa-core's signature holds the schedule's layout); without, a call given one ignores it.
    scheduled: bool = False
    logits_dtype: torch.dtype = torch.float32

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, schedule: torch.Tensor | None = None, *,
                 logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``logits_dtype``: as for ``mqa_logits_triton.PreparedCall``."""
        ptrs = _ptrs(q, kv_cache, weights, context_lens, block_tables)
        other_dtype = logits_dtype is not None and logits_dtype is not self.logits_dtype
        if hooks_active() or (self.scheduled and schedule is None) or other_dtype or (
                (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 if self.residues is None
                else residues(ptrs) != self.residues):
            return fp8_paged_mqa_logits_gluon(q, kv_cache, weights, context_lens, block_tables, self.max_context_len,
                                              self.clean_logits, schedule=_usable(schedule, q),
                                              logits_dtype=logits_dtype or self.logits_dtype)
        return _run(self.launch, q, kv_cache, weights, ptrs, self.size, self.index, self.tail,
                    schedule.data_ptr() if self.scheduled else 0, self.logits_dtype)


def prepare(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
            block_tables: torch.Tensor, max_context_len: int, clean_logits: bool = True,
            scheduled: bool = False, logits_dtype: torch.dtype = torch.float32) -> PreparedCall | None:
    """The :class:`PreparedCall` for calls like this one (default config; ``scheduled``: calls come
    with a schedule this kernel reads) once a call of its signature has bound a launch, else None (also
    for an empty output or pool: the full path handles those)."""
    ptrs = _ptrs(q, kv_cache, weights, context_lens, block_tables)
    launch = _LAUNCHES.get(_signature(q, kv_cache, weights, context_lens, block_tables, bool(clean_logits), None,
                                      ptrs, scheduled, logits_dtype))
    if launch is None or not launch.bound or not (q.shape[0] and max_context_len and kv_cache.shape[0]):
        return None
    return PreparedCall(launch, (q.shape[0] * q.shape[1], max_context_len), q.device.index,
                        _tail(launch, q, kv_cache, block_tables, max_context_len, logits_dtype), max_context_len,
                        bool(clean_logits), residues(ptrs), scheduled, logits_dtype)


def _usable(schedule: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """``schedule`` where this kernel reads it (:func:`schedule_unsupported`), else None: a schedule of
    another program count (an engine that splits over fewer SMs) is a hint this grid cannot take."""
    return schedule if schedule is not None and schedule_unsupported(schedule, q.device) is None else None


#: (next_n, H) classes where this kernel was measured ahead of the Triton kernel on the H200 (ragged
#: batches, graph replay, bench/h200_decode_vs_deepgemm.py: ahead on all 36 shapes, 0.95-0.96x
#: DeepGEMM per class against the Triton kernel's 0.83-0.93x; cb9ff2b:bench/README.md, round 10); the provider
#: sends the others to Triton.
MEASURED_AHEAD: frozenset[tuple[int, int]] = frozenset({(1, 32), (1, 64), (2, 32), (2, 64)})
#: Fewest sequences a call sends here: one sequence fills at most a few dozen tiles, one per CTA, and
#: then the Triton kernel's shorter start wins (B = 1, 6k context, graph replay: 5.3 vs 5.6 us at H = 32,
#: 5.5 vs 5.7 at H = 64; even at B = 8, 1k; ahead from B = 24; cb9ff2b:bench/README.md, round 11).
MIN_BATCH = 2
#: Call signatures that :func:`fp8_paged_mqa_logits_sm90` sends to the Triton kernel.
_TRITON_ROUTE: set[tuple[Any, ...]] = set()


def serves(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
           block_tables: torch.Tensor) -> bool:
    """Whether the provider sends this call here: in scope, of a class measured ahead, and a batch of at
    least MIN_BATCH sequences."""
    return (q.shape[1], q.shape[2]) in MEASURED_AHEAD and _batch_here(q) \
        and unsupported(q, kv_cache, weights, context_lens, block_tables) is None


def _batch_here(q: torch.Tensor) -> bool:
    """MIN_BATCH, checked on every call by the dispatchers: B is not part of the launch signature."""
    return q.shape[0] >= MIN_BATCH


def fp8_paged_mqa_logits_sm90(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                              context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                              clean_logits: bool = True, schedule: torch.Tensor | None = None,
                              logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``gluon`` provider's paged op on sm_90: this kernel where :func:`serves` (decided once per
    call signature), with ``schedule`` where it can read it, else the Triton kernel (which reads none)."""
    clean_logits = bool(clean_logits)
    if not _batch_here(q):
        return fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                           clean_logits, logits_dtype=logits_dtype)
    ptrs = _ptrs(q, kv_cache, weights, context_lens, block_tables)
    schedule = _usable(schedule, q)
    key = _signature(q, kv_cache, weights, context_lens, block_tables, clean_logits, None, ptrs, schedule is not None,
                     logits_dtype)
    launch = _LAUNCHES.get(key)
    if launch is None and (key in _TRITON_ROUTE or not serves(q, kv_cache, weights, context_lens, block_tables)):
        if len(_TRITON_ROUTE) >= _LAUNCHES_MAX:
            _TRITON_ROUTE.clear()
        _TRITON_ROUTE.add(key)
        return fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                           clean_logits, logits_dtype=logits_dtype)
    return _call(launch, key, ptrs, q, kv_cache, weights, context_lens, block_tables, max_context_len, clean_logits,
                 None, schedule, logits_dtype)


def prepare_sm90(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, max_context_len: int, clean_logits: bool = True,
                 schedule: torch.Tensor | None = None, logits_dtype: torch.dtype = torch.float32) -> Any:
    """:func:`fp8_paged_mqa_logits_sm90`'s prepared call: this kernel's or the Triton kernel's."""
    scheduled = _usable(schedule, q) is not None
    key = _signature(q, kv_cache, weights, context_lens, block_tables, bool(clean_logits), None,
                     _ptrs(q, kv_cache, weights, context_lens, block_tables), scheduled, logits_dtype)
    if key in _TRITON_ROUTE or not _batch_here(q):
        return prepare_triton(q, kv_cache, weights, context_lens, block_tables, max_context_len, clean_logits,
                              logits_dtype=logits_dtype)
    return prepare(q, kv_cache, weights, context_lens, block_tables, max_context_len, clean_logits, scheduled,
                   logits_dtype)


def _multiprocessors(index: int | None) -> int:
    return _device_facts(index or 0)[0]


def compile_sm90(*, next_n: int = 2, h: int = 64, d: int = 128, block_size: int = 64, lens_2d: bool = True,
                 clean_logits: bool = False, config: GluonPagedConfig | None = None, presplit: bool = False,
                 out_dtype: str = "fp32") -> Any:
    """Compile ahead of time for sm_90 (no GPU needed); triton's CompiledKernel (``asm["cubin"]``).
    ``presplit``: the build that reads a precomputed schedule."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or default_config()
    fn = _paged_kernel_ws
    rows = _rows_pad(next_n)
    q_lay, kv_lay, sc_lay = _layouts(d, rows * h)
    sig = {"q_desc": f"tensordesc<fp8e4nv[{rows * h}, {d}],{q_lay!r}>",
           "w_desc": f"tensordesc<fp32[{rows}, {h}],{sc_lay!r}>",
           "kv_desc": f"tensordesc<fp8e4nv[1, {TILE}, {d}],{kv_lay!r}>",
           "sc_desc": f"tensordesc<fp32[1, {TILE}],{sc_lay!r}>",
           "cl_ptr": "*i32", "bt_ptr": "*i32", "sched_ptr": "*i32", "out_ptr": f"*{out_dtype}"}
    for name in ("num_seqs", "max_ctx", "covered", "num_blocks", "stride_clb", "stride_clj", "stride_btb",
                 "stride_om"):
        sig[name] = "i32"
    kw = _constexprs(cfg, next_n, h, block_size, lens_2d, clean_logits, presplit)
    constexprs = {}
    for key, val in kw.items():
        sig[key] = "constexpr"
        constexprs[(fn.arg_names.index(key), )] = val
    aligned = ("cl_ptr", "bt_ptr", "out_ptr", "stride_btb", "stride_om")
    attrs = {(fn.arg_names.index(p), ): [["tt.divisibility", 16]] for p in aligned}
    return triton.compile(GluonASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "launch_pdl": bool(cfg.pdl)})
