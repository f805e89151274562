"""fp8 paged MQA logits (the decode op) in portable Triton, over DeepGEMM's paged cache layout.

Decode is memory-bound: every visible cache byte is read once and each is used by all ``next_n * H``
query rows of its sequence. A tile is ``TILE`` positions of one sequence for all its query rows: one
fp8 dot ``k[TILE, D] x q^T[D, next_n*H]`` (keys on the MMA's M side, query heads on its N side, so the
head reduction of ``relu(s) * w`` stays mostly inside each thread), so a tile's cache bytes are read
once for every row of the sequence.

**Balance.** Decode batches are ragged: one program per sequence (or a fixed split of each) leaves
SMs idle behind the longest context. Here a fixed grid of persistent programs (what fits on the
device at once) shares the batch's *visible* tiles evenly: every program reads the context lengths,
prefix-sums the tiles per sequence and takes an equal contiguous range of the flattened
(sequence, tile) list, typically a tail of one sequence and a head of the next. The schedule is
computed on the device by every program (a few hundred integer ops on ``B`` lengths that stay in
L2), so there is no prologue kernel, no schedule buffer and no host synchronisation: the launch is
one kernel of a fixed grid, capturable in a CUDA graph. The ``-inf`` tail of each row (``clean``) is
shared out the same way, as a second flattened list.

**Memory.** Two tile loops. The first (``pipe = 0``): keys software-pipelined by the compiler
``num_stages - 1`` tiles ahead from block ids carried one tile ahead, scales loaded one tile ahead
(their lines prefetched to L1 ``prefetch`` tiles ahead). Its SASS shows why it stops near 1 us per
tile and program: the compiler reloads the id of each key copy right before issuing it, and the
carried loads are waited for one iteration later, so each iteration waits for global round trips.
The pipelined loop (``pipe > 0``, ``tl.range(num_stages=pipe)``): plain per-tile loads of the id,
the keys and the scales, all of which the loop attribute lets Triton pipeline (the ids one level of
indirection ahead of the keys and scales); no load is waited for in the iteration that issues it.
It warms L2 for the next sequence of a short segment. ``row_dots`` (next_n = 2) issues one dot per
query row, the second made to wait for the first row's reduction, so a 128-register cap fits four
programs per SM instead of three. docs/paged-op.md has the numbers.

**Layout.** Cache block ``i`` starts ``kv_cache.stride(0)`` bytes after block ``i - 1`` (a strided
page pool when that exceeds ``block_size * (D + 4)``) and holds ``block_size * D`` fp8 bytes
(token-major), then ``block_size`` float32 scales; the kernel reads both through the one uint8 base
pointer, cast in the kernel (no host-side views). A block id outside ``[0, num_blocks)`` is never
dereferenced: its positions come out ``-inf`` (to top-k, not visible), at the cost of one compare per
tile. On gfx942 (whose MFMA reads fp8 as e4m3fnuz) e4m3fn cache bytes are re-labelled in registers
(same byte = half the value, see ``fp8.py``) and the scale doubled.

**Host cost.** The first call of a signature (dtypes, shapes, 16-byte alignments, constexprs)
compiles through ``triton.jit`` and binds the compiled kernel (``launch.BoundKernel``) with its grid;
later calls allocate the output and hand ints to Triton's C launcher (TMA descriptors encoded once
per pool address and size), without Triton's argument binding. Through mqa-core a call signature is
built once, by the core: ``prepare`` returns a :class:`PreparedCall` for the core's signature (every
size fixed), whose calls read five pointers, allocate and launch.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
from typing import Any

import torch
import triton
import triton.language as tl

from ..fp8 import e4m3fn_to_e4m3fnuz, wants_fnuz
from ..launch import bind, direct_launch_unsupported, hooks_active, residues
from .mqa_logits_triton import _interpreting  # the interpreter fixes of Triton 3.6, shared

__all__ = ["PagedConfig", "PreparedCall", "VARIANTS", "compile_for", "default_config",
           "fp8_paged_mqa_logits_triton", "kernel", "prepare", "resident_programs"]

#: Output rows are padded to this many bytes (16 floats, 32 bf16), so each row starts 64-byte aligned.
_ROW_BYTES = 64
#: At most this many query rows (next_n * padded H) per program: the accumulator is TILE x ROWS fp32.
_MAX_ROWS = 128
#: Sequences the schedule scans per step (one int32 per thread of a 4-warp program).
_SCHED = 128
#: The pipelined loop warms L2 for a program's next sequence when the current segment has at most
#: this many tiles (L2 holds ~10 us of streamed keys, so a longer segment would lose the lines).
_NEXT_PF_TILES = tl.constexpr(48)


@dataclasses.dataclass(frozen=True)
class PagedConfig:
    """Launch shape of the persistent kernel.

    ``programs_per_sm`` caps the programs per SM (the launcher lowers it to what the compiled kernel's
    registers and shared memory let stay resident, so the grid is one wave); ``programs`` > 0 fixes
    the grid instead (tests). Key tiles are loaded ``num_stages - 1`` tiles ahead; ``prefetch`` is
    how many tiles ahead the scales' cache lines are requested (NVIDIA builds only; 0: off).
    """

    tile: int = 64
    num_warps: int = 4
    num_stages: int = 4
    programs_per_sm: int = 4
    #: Load key tiles with TMA (NVIDIA sm_90+, block_size % tile == 0, D in {64, 128}, 16-byte
    #: aligned pool; plain loads otherwise).
    tma: bool = False
    prefetch: int = 4
    #: With two query rows per tile (next_n = 2), one dot per row instead of one over both: the
    #: tile is still read once, the accumulator is half as big (more programs fit on an SM).
    row_dots: bool = False
    #: Cap on registers per thread (NVIDIA; 0: the compiler's choice): 128 lets four 4-warp
    #: programs share an SM.
    maxnreg: int = 0
    #: > 0: the tile loop is one the compiler pipelines whole with this many stages (block ids,
    #: keys and scales all loaded asynchronously ahead); ``num_stages`` and ``prefetch`` then do not
    #: apply to it. 0: keys pipelined from ids carried one tile ahead (the first kernel's loop).
    pipe: int = 0
    programs: int = 0

    def __post_init__(self) -> None:
        for k in ("tile", "num_warps"):
            v = getattr(self, k)
            if v < 1 or v & (v - 1):
                raise ValueError(f"PagedConfig.{k} must be a power of two, got {v}")
        if self.tile < 16:
            raise ValueError(f"PagedConfig.tile must be >= 16 (an MMA tile), got {self.tile}")
        if self.num_stages < 1 or self.programs_per_sm < 1 or self.programs < 0:
            raise ValueError("PagedConfig.num_stages and programs_per_sm must be >= 1, programs >= 0")
        if self.prefetch < 0:
            raise ValueError(f"PagedConfig.prefetch must be >= 0, got {self.prefetch}")
        if self.pipe < 0 or self.pipe == 1 or (self.pipe and self.prefetch):
            raise ValueError(f"PagedConfig.pipe must be 0 (off) or >= 2 stages, and prefetch 0 with it "
                             f"(the pipelined loop loads scales ahead itself); got pipe={self.pipe}, "
                             f"prefetch={self.prefetch}")

    def __str__(self) -> str:
        tma = "tma" if self.tma else ""
        fixed = f"g{self.programs}" if self.programs else ""
        return (f"t{self.tile}w{self.num_warps}s{self.num_stages}p{self.programs_per_sm}"
                f"f{self.prefetch}{'r' if self.row_dots else ''}{tma}"
                f"{f'n{self.maxnreg}' if self.maxnreg else ''}{f'P{self.pipe}' if self.pipe else ''}{fixed}")


def default_config(arch: str, block_size: int, next_n: int = 1, h: int = 64) -> PagedConfig:
    """The variant measured fastest for the shape class on the H200 (``_MEASURED_BEST``); classes
    not measured get the base config. gfx9: two stages, two programs per CU, no prefetch (not tuned:
    no AMD GPU here)."""
    if arch.startswith("gfx"):
        return PagedConfig(tile=64, num_warps=4, num_stages=2, programs_per_sm=2, prefetch=0)
    name = _MEASURED_BEST.get((next_n, 32 if h <= 32 else 64 if h <= 64 else 0))
    return VARIANTS[name] if name else PagedConfig()


#: (next_n, H class) -> the variant with the best graph-replay time against DeepGEMM on ragged
#: batches (B 32-256, contexts 4k-64k spread between half and full): from the H200 runs of
#: 2026-12-02, cb9ff2b:bench/results/2026-12-02-h200-decode-vs-deepgemm-v1.log (base/rows/tma/noprefetch/deep)
#: and -v2.log (tma/rows/pipe/pipetma/piperows, 288/288 checks ok). ``tma`` leads or ties at
#: next_n = 1 (geomean 0.94x / 0.93x DeepGEMM at H = 32 / 64) and next_n = 2, H = 32 (0.91x, level
#: with ``pipe``); at next_n = 2, H = 64 the pipelined loop ``pipe`` (0.84x) is well ahead of ``rows``
#: (0.73x) and ``tma`` (0.78x).
_MEASURED_BEST: dict[tuple[int, int], str] = {(1, 32): "tma", (1, 64): "tma", (2, 32): "tma", (2, 64): "pipe"}


#: The Triton whose register allocation the variants are tuned for (the H200 runs torch's 3.6): under
#: 3.9 the same sm_90 builds take more registers (fewer programs per SM) and "rows" spills under its
#: 128-register cap. The grid follows the real register count, so results stay right; the budgets
#: (tests/gluon) hold for this version, and a newer one needs retuning on an H200.
TUNED_TRITON = "3.6"

#: Launch variants the H200 benchmark times side by side (``bench/h200_decode_vs_deepgemm.py``).
VARIANTS: dict[str, PagedConfig] = {
    "base": PagedConfig(),
    "rows": PagedConfig(row_dots=True, maxnreg=128),
    "deep": PagedConfig(num_stages=6, prefetch=6),
    "tma": PagedConfig(tma=True),
    "noprefetch": PagedConfig(prefetch=0),  # balance alone: what the scale prefetch adds
    # The whole tile loop pipelined by the compiler (ids, keys and scales loaded ahead).
    "pipe": PagedConfig(pipe=7, prefetch=0),
    "pipetma": PagedConfig(pipe=7, prefetch=0, tma=True),
    "piperows": PagedConfig(pipe=7, prefetch=0, row_dots=True, maxnreg=128),
}


def _paged_kernel(
    q_ptr, kv_ptr, kv_desc, w_ptr, cl_ptr, bt_ptr, out_ptr,
    num_seqs, max_ctx, covered, num_blocks, num_programs, block_bytes, block_words,
    stride_qb, stride_qn, stride_qh, stride_wm, stride_clb, stride_clj, stride_btb, stride_om,
    NEXT_N: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    NG: tl.constexpr, NUM_GROUPS: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr,
    SCHED: tl.constexpr, PREFETCH: tl.constexpr, ROW_DOTS: tl.constexpr,
    LENS_2D: tl.constexpr, CLEAN: tl.constexpr, KV_FNUZ: tl.constexpr, USE_TMA: tl.constexpr,
    PIPE: tl.constexpr, NEXT_PF: tl.constexpr,
):
    # A work item is one tile of one (sequence, query-row group); groups exist only when
    # next_n * H exceeds one dot's N side (H = 128 with next_n >= 2).
    pid = tl.program_id(0)
    num_virtual = num_seqs * NUM_GROUPS
    t_max = tl.cdiv(max_ctx, TILE)
    if KV_FNUZ:
        kv_vals = kv_ptr
    else:
        kv_vals = kv_ptr.to(tl.pointer_type(q_ptr.dtype.element_ty), bitcast=True)
    kv_scales = kv_ptr.to(tl.pointer_type(tl.float32), bitcast=True)

    # -- the schedule: every program derives the same one from the context lengths --------------
    offs_s = tl.arange(0, SCHED)
    total = 0
    for c0 in range(0, num_virtual, SCHED):
        v = c0 + offs_s
        total += tl.sum(_tiles(cl_ptr, v, v < num_virtual, covered, stride_clb, stride_clj,
                               NEXT_N, NG, NUM_GROUPS, TILE, LENS_2D), axis=0)
    fill_total = num_virtual * t_max - total
    pid64 = pid.to(tl.int64)
    w_lo = ((pid64 * total) // num_programs).to(tl.int32)
    w_hi = (((pid64 + 1) * total) // num_programs).to(tl.int32)
    f_lo = ((pid64 * fill_total) // num_programs).to(tl.int32)
    f_hi = (((pid64 + 1) * fill_total) // num_programs).to(tl.int32)
    # Where this program's first and last work items (and fill items) sit: (virtual sequence, tile).
    # Each step costs two cross-warp exchanges (a scan, one reduction of five sums) per list.
    va, ta, vb, tb, base = 0, 0, 0, 0, 0
    fa, fta, fb, ftb, fbase = 0, 0, 0, 0, 0
    for c0 in range(0, num_virtual, SCHED):
        v = c0 + offs_s
        v_ok = v < num_virtual
        n = _tiles(cl_ptr, v, v_ok, covered, stride_clb, stride_clj, NEXT_N, NG, NUM_GROUPS, TILE,
                   LENS_2D)
        d0, d1, d2, d3, d4 = _locate(v, n, base, w_lo, w_hi)
        va, ta, vb, tb, base = va + d0, ta + d1, vb + d2, tb + d3, base + d4
        if CLEAN:
            d0, d1, d2, d3, d4 = _locate(v, tl.where(v_ok, t_max - n, 0), fbase, f_lo, f_hi)
            fa, fta, fb, ftb, fbase = fa + d0, fta + d1, fb + d2, ftb + d3, fbase + d4

    ROWS: tl.constexpr = NG * H_PAD
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    offs_t = tl.arange(0, TILE)
    offs_g = tl.arange(0, NG)
    k_offs = offs_t[:, None] * D + offs_d[None, :]  # a tile's bytes inside its block

    # -- the -inf tails: tiles past each context, shared out like the work; done first, so that
    # none of its values stay live (in registers) through the work loop -----------------------
    if CLEAN:
        ninf = tl.full((TILE, NG), float("-inf"), tl.float32).to(out_ptr.dtype.element_ty)
        fv_end = tl.where(f_hi > f_lo, fb + 1, fa)
        for v in range(fa, fv_end):
            b = v // NUM_GROUPS
            offs_j = (v % NUM_GROUPS) * NG + offs_g
            j_ok = offs_j < NEXT_N
            lens = _row_lens(cl_ptr, b, offs_j, j_ok, covered, stride_clb, stride_clj, NEXT_N, LENS_2D)
            n = tl.cdiv(tl.max(lens, axis=0), TILE)
            i_lo = tl.where(v == fa, fta, 0)
            i_hi = tl.where(v == fb, ftb + 1, t_max - n)
            out_rows = out_ptr + (b * NEXT_N + offs_j).to(tl.int64)[None, :] * stride_om
            for i in range(i_lo, i_hi):
                pos = (n + i) * TILE + offs_t
                tl.store(out_rows + pos[:, None], ninf, mask=(pos < max_ctx)[:, None] & j_ok[None, :])

    # -- the work: a tail of one sequence, whole sequences, a head of another ---------------------
    v_end = tl.where(w_hi > w_lo, vb + 1, va)
    for v in range(va, v_end):
        b = v // NUM_GROUPS
        g = v % NUM_GROUPS
        offs_j = g * NG + offs_g
        j_ok = offs_j < NEXT_N
        lens = _row_lens(cl_ptr, b, offs_j, j_ok, covered, stride_clb, stride_clj, NEXT_N, LENS_2D)
        hi = tl.max(lens, axis=0)
        t_lo = tl.where(v == va, ta, 0)
        t_hi = tl.where(v == vb, tb + 1, tl.cdiv(hi, TILE))
        if NEXT_PF:  # the first ids, asked of L2 before q (whose smem store the id copies wait for)
            _prefetch_l2(bt_ptr + b.to(tl.int64) * stride_btb + (t_lo * TILE) // BS + offs_g * 0)

        # The dot's N side: r = query row * H_PAD + head; padded rows and heads load q = 0, weight 0.
        r_j = g * NG + offs_r // H_PAD
        r_h = offs_r % H_PAD
        r_ok = (r_j < NEXT_N) & (r_h < H)
        if ROW_DOTS:  # one [D, H_PAD] operand per query row: half the accumulator registers
            q0_t, w0 = _row_operands(q_ptr, w_ptr, b, g * NG, stride_qb, stride_qn, stride_qh, stride_wm,
                                     offs_d, d_ok, NEXT_N, H, H_PAD)
            q1_t, w1 = _row_operands(q_ptr, w_ptr, b, g * NG + 1, stride_qb, stride_qn, stride_qh,
                                     stride_wm, offs_d, d_ok, NEXT_N, H, H_PAD)
        else:
            q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + r_j[:, None] * stride_qn
                        + r_h[:, None] * stride_qh + offs_d[None, :],
                        mask=r_ok[:, None] & d_ok[None, :], other=0.0)
            q_t = tl.trans(q)
            w = tl.load(w_ptr + (b * NEXT_N + r_j).to(tl.int64) * stride_wm + r_h, mask=r_ok, other=0.0)
        out_rows = out_ptr + (b * NEXT_N + offs_j).to(tl.int64)[None, :] * stride_om
        table = bt_ptr + b.to(tl.int64) * stride_btb
        if NEXT_PF:  # a short segment: the next sequence's start is near, warm L2 for it
            if (v + 1 < v_end) & (t_hi - t_lo <= _NEXT_PF_TILES):
                _prefetch_sequence(q_ptr, w_ptr, bt_ptr, v + 1, offs_r, stride_qb, stride_qn, stride_qh,
                                   stride_wm, stride_btb, NEXT_N, H, H_PAD, NG, NUM_GROUPS)

        if not ROW_DOTS:  # one operand set for both helpers; the unused one is never read
            q0_t, w0, q1_t, w1 = q_t, w, q_t, w
        else:
            q_t, w = q0_t, w0
        if PIPE > 0:
            # Plain loads in a loop the compiler pipelines whole (``tl.range(num_stages=...)``
            # marks it): the block ids of each tile are copied asynchronously into shared memory
            # several tiles ahead, and the keys and scales addressed by them a few tiles later, so
            # no load result is waited for in the iteration that uses it.
            for t in tl.range(t_lo, t_hi, num_stages=PIPE):
                pos = t * TILE + offs_t
                if BS % TILE == 0:  # inside the loop t * TILE < hi: no mask
                    blk = tl.load(table + (t * TILE) // BS).to(tl.int64)
                else:
                    blk = tl.load(table + pos // BS, mask=pos < hi, other=0).to(tl.int64)
                blk_ok = (blk >= 0) & (blk < num_blocks)
                k = _keys(kv_vals, kv_desc, blk, blk_ok, t, pos, hi, k_offs, offs_d, d_ok, block_bytes,
                          BS, D, D_PAD, TILE, KV_FNUZ, USE_TMA)
                scale = _scales(kv_scales, blk, t, offs_t, hi, num_blocks, block_words, BS, D, TILE)
                _tile_out(k, scale, blk_ok, pos, lens, max_ctx, j_ok, out_rows, q_t, w, q0_t, w0, q1_t, w1,
                          NG, H_PAD, TILE, BS, ROW_DOTS, KV_FNUZ)
        else:
            # Every carried value is one iteration old (a longer loop-carried distance stops
            # Triton's pipelining): the key loads are pipelined by the compiler from ids loaded one
            # tile ahead; the scales (which do not feed the dot, so the compiler leaves them alone)
            # are loaded one tile ahead from ids loaded two ahead, and their cache lines are
            # requested PREFETCH ahead.
            blk_next = _ids(table, t_lo, offs_t, hi, BS, TILE)
            scale_next = _scales(kv_scales, blk_next, t_lo, offs_t, hi, num_blocks, block_words, BS, D,
                                 TILE)
            sblk = _ids(table, t_lo + 1, offs_t, hi, BS, TILE)
            pblk = _ids(table, t_lo + PREFETCH, offs_t, hi, BS, TILE)
            for t in range(t_lo, t_hi):
                pos = t * TILE + offs_t
                blk = blk_next
                scale = scale_next
                blk_next = _ids(table, t + 1, offs_t, hi, BS, TILE)
                scale_next = _scales(kv_scales, sblk, t + 1, offs_t, hi, num_blocks, block_words, BS, D,
                                     TILE)
                sblk = _ids(table, t + 2, offs_t, hi, BS, TILE)
                if PREFETCH > 0:
                    _prefetch_scales(kv_scales, pblk, t + PREFETCH, num_blocks, block_words, BS, D, TILE)
                    pblk = _ids(table, t + PREFETCH + 1, offs_t, hi, BS, TILE)
                blk_ok = (blk >= 0) & (blk < num_blocks)
                k = _keys(kv_vals, kv_desc, blk, blk_ok, t, pos, hi, k_offs, offs_d, d_ok, block_bytes,
                          BS, D, D_PAD, TILE, KV_FNUZ, USE_TMA)
                _tile_out(k, scale, blk_ok, pos, lens, max_ctx, j_ok, out_rows, q_t, w, q0_t, w0, q1_t, w1,
                          NG, H_PAD, TILE, BS, ROW_DOTS, KV_FNUZ)


def _keys(kv_vals, kv_desc, blk, blk_ok, t, pos, hi, k_offs, offs_d, d_ok, block_bytes, BS: tl.constexpr,
          D: tl.constexpr, D_PAD: tl.constexpr, TILE: tl.constexpr, KV_FNUZ: tl.constexpr,
          USE_TMA: tl.constexpr):
    """fp8 [TILE, D_PAD] keys of tile ``t`` (zeros where the block id is out of range)."""
    if USE_TMA:  # one block per tile: a [1, TILE, D] box; ids out of range read zeros
        k = tl.reshape(kv_desc.load([blk.to(tl.int32), (t * TILE) % BS, 0]), (TILE, D_PAD))
    else:
        if BS % TILE == 0:  # one block: a scalar base, rows past the context stay inside it
            k_ptrs = kv_vals + (blk * block_bytes + ((t * TILE) % BS) * D) + k_offs
            k_mask = blk_ok & d_ok[None, :]
        else:  # rows in different blocks; rows past the context may have garbage ids
            k_ptrs = kv_vals + (blk * block_bytes + (pos % BS) * D)[:, None] + offs_d[None, :]
            k_mask = ((pos < hi) & blk_ok)[:, None] & d_ok[None, :]
        if not KV_FNUZ:
            k = tl.load(k_ptrs, mask=k_mask, other=0.0)
        else:  # e4m3fn bytes -> e4m3fnuz bytes of half the value (-0 -> +0, NaN -> NaN)
            k = tl.load(k_ptrs, mask=k_mask, other=0)
            k = tl.where(k == 0x80, tl.full((TILE, D_PAD), 0, tl.uint8), k)
            k = tl.where((k & 0x7F) == 0x7F, tl.full((TILE, D_PAD), 0x80, tl.uint8), k)
            k = k.to(tl.float8e4b8, bitcast=True)
    return k


def _tile_out(k, scale, blk_ok, pos, lens, max_ctx, j_ok, out_rows, q_t, w, q0_t, w0, q1_t, w1,
              NG: tl.constexpr, H_PAD: tl.constexpr, TILE: tl.constexpr, BS: tl.constexpr,
              ROW_DOTS: tl.constexpr, KV_FNUZ: tl.constexpr):
    """One tile's logits for the group's query rows, -inf where not visible, stored."""
    if KV_FNUZ:
        scale = scale * 2.0
    if ROW_DOTS:  # two rows (NG == 2): a dot each, the tile read once from shared memory
        l0 = tl.sum(tl.maximum(tl.dot(k, q0_t), 0.0) * w0[None, :], axis=1)
        # The second dot accumulates onto zeros that depend on the first row's reduction, so
        # one accumulator is live at a time (x * 0 is not folded for floats).
        acc = tl.zeros((TILE, H_PAD), tl.float32) + (l0 * 0.0)[:, None]
        l1 = tl.sum(tl.maximum(tl.dot(k, q1_t, acc), 0.0) * w1[None, :], axis=1)
        logits = tl.join(l0, l1) * scale[:, None]  # [TILE, 2]
    else:
        s = tl.dot(k, q_t)  # [TILE, ROWS] fp32
        s = tl.maximum(s, 0.0) * w[None, :]
        logits = tl.sum(tl.reshape(s, (TILE, NG, H_PAD)), axis=2) * scale[:, None]  # [TILE, NG]
    if BS % TILE == 0:
        seen = (pos[:, None] < lens[None, :]) & blk_ok
    else:
        seen = (pos[:, None] < lens[None, :]) & blk_ok[:, None]
    logits = tl.where(seen, logits, float("-inf"))
    tl.store(out_rows + pos[:, None], _as_logits(logits, out_rows), mask=(pos < max_ctx)[:, None] & j_ok[None, :])


def _as_logits(x, ptrs):
    """float32 logits in the element type of ``ptrs``: bf16 rounded once to nearest even, in the bits
    (the conversion that follows is then exact: Triton's interpreter truncates where compiled code
    rounds; -inf keeps its bits)."""
    if ptrs.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(ptrs.dtype.element_ty)


def _add5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4


def _locate(v, n, base, lo, hi):
    """Within one chunk of sequences ``v`` holding ``n`` items each (``base`` items before the chunk):
    (sequence, offset) of item ``lo`` and of item ``hi - 1`` (zeros where not in this chunk), and
    the chunk's item count."""
    end = tl.cumsum(n, axis=0) + base
    start = end - n
    at_lo = (start <= lo) & (lo < end)
    at_last = (start < hi) & (hi <= end)
    return tl.reduce((tl.where(at_lo, v, 0), tl.where(at_lo, lo - start, 0), tl.where(at_last, v, 0),
                      tl.where(at_last, hi - 1 - start, 0), n), 0, _add5)


def _row_lens(cl_ptr, b, offs_j, j_ok, covered, stride_clb, stride_clj, NEXT_N: tl.constexpr,
              LENS_2D: tl.constexpr):
    """int32 [NG] positions each query row of a group sees, in [0, covered]: lens[b] - next_n + j + 1,
    or lens[b, j] with 2-D lengths (any values: the group's longest row sets its tiles)."""
    if LENS_2D:
        lens = tl.load(cl_ptr + b.to(tl.int64) * stride_clb + offs_j * stride_clj, mask=j_ok, other=0)
    else:
        lens = tl.load(cl_ptr + b.to(tl.int64) * stride_clb) - NEXT_N + offs_j + 1
    return tl.where(j_ok, tl.minimum(tl.maximum(lens, 0), covered), 0)


def _tiles(cl_ptr, v, v_ok, covered, stride_clb, stride_clj, NEXT_N: tl.constexpr, NG: tl.constexpr,
           NUM_GROUPS: tl.constexpr, TILE: tl.constexpr, LENS_2D: tl.constexpr):
    """int32 [SCHED] tiles each virtual sequence ``v`` computes (0 where not ``v_ok``)."""
    b = v // NUM_GROUPS
    first = (v % NUM_GROUPS) * NG
    if LENS_2D:
        j = first[:, None] + tl.arange(0, NG)[None, :]
        ok = v_ok[:, None] & (j < NEXT_N)
        lens = tl.load(cl_ptr + b.to(tl.int64)[:, None] * stride_clb + j * stride_clj, mask=ok, other=0)
        hi = tl.max(lens, axis=1)
    else:  # the group's last row sees the most
        last = tl.minimum(first + NG, NEXT_N)
        hi = tl.load(cl_ptr + b.to(tl.int64) * stride_clb, mask=v_ok, other=0) - NEXT_N + last
    hi = tl.minimum(tl.maximum(hi, 0), covered)
    return tl.where(v_ok, tl.cdiv(hi, TILE), 0)


def _row_operands(q_ptr, w_ptr, b, j, stride_qb, stride_qn, stride_qh, stride_wm, offs_d, d_ok,
                  NEXT_N: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr):
    """q[b, j]^T as a [D_PAD, H_PAD] dot operand and its weights [H_PAD] (zeros past H or next_n)."""
    offs_h = tl.arange(0, H_PAD)
    ok = (offs_h < H) & (j < NEXT_N)
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + j * stride_qn + offs_h[:, None] * stride_qh
                + offs_d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
    w = tl.load(w_ptr + (b * NEXT_N + j).to(tl.int64) * stride_wm + offs_h, mask=ok, other=0.0)
    return tl.trans(q), w


def _ids(table, t, offs_t, hi, BS: tl.constexpr, TILE: tl.constexpr):
    """Cache block of tile ``t``: an int64 scalar when the tile lies inside one block, else int64
    [TILE] per position. Past ``hi`` it is 0 (a masked load): never used to read anything."""
    if BS % TILE == 0:
        blk = tl.load(table + (t * TILE) // BS, mask=t * TILE < hi, other=0).to(tl.int64)
    else:
        pos = t * TILE + offs_t
        blk = tl.load(table + pos // BS, mask=pos < hi, other=0).to(tl.int64)
    return blk


def _prefetch_scales(kv_scales, blk, t, num_blocks, block_words, BS: tl.constexpr, D: tl.constexpr,
                     TILE: tl.constexpr):
    """Ask for the L1 lines holding tile ``t``'s scales: no register result, so nothing waits on
    it (one-block tiles only; ids out of range fetch block 0's lines instead)."""
    if BS % TILE == 0 and TILE >= 32:
        LINES: tl.constexpr = TILE // 32  # one address per 128-byte line of scales
        blk = tl.where((blk >= 0) & (blk < num_blocks), blk, 0)
        lines = tl.arange(0, LINES) * 32
        ptrs = kv_scales + (blk * block_words + (BS * D) // 4 + (t * TILE) % BS) + lines
        tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L1 [$1];", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)


def _prefetch_sequence(q_ptr, w_ptr, bt_ptr, v, offs_r, stride_qb, stride_qn, stride_qh, stride_wm, stride_btb,
                       NEXT_N: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, NG: tl.constexpr,
                       NUM_GROUPS: tl.constexpr):
    """Ask L2 for what virtual sequence ``v`` starts with (its q rows and weights, the head of its
    block-table row), so that its first loads, each waited for in turn, hit L2 (PTX only)."""
    b = v // NUM_GROUPS
    r_j = (v % NUM_GROUPS) * NG + offs_r // H_PAD
    r_h = offs_r % H_PAD
    ok = (r_j < NEXT_N) & (r_h < H)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + tl.where(ok, r_j * stride_qn + r_h * stride_qh, 0)
    w_rows = w_ptr + (b * NEXT_N + tl.where(ok, r_j, 0)).to(tl.int64) * stride_wm + tl.where(ok, r_h, 0)
    _prefetch_l2(q_rows)
    _prefetch_l2(w_rows)
    _prefetch_l2(bt_ptr + b.to(tl.int64) * stride_btb + offs_r * 0)


def _prefetch_l2(ptrs):
    """``prefetch.global.L2`` of the lines ``ptrs`` point into (no register result: nothing waits)."""
    tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


def _scales(kv_scales, blk, t, offs_t, hi, num_blocks, block_words, BS: tl.constexpr,
            D: tl.constexpr, TILE: tl.constexpr):
    """float32 [TILE] scales of tile ``t``: they follow the BS * D value bytes of each block. Ids out
    of range are not read (the tile's logits are masked by the same test); in a one-block tile the
    positions past the context are read from the same block (and masked later)."""
    ok = (blk >= 0) & (blk < num_blocks)
    if BS % TILE == 0:
        scale = tl.load(kv_scales + (blk * block_words + (BS * D) // 4 + (t * TILE) % BS) + offs_t,
                        mask=ok, other=0.0)
    else:
        pos = t * TILE + offs_t
        scale = tl.load(kv_scales + blk * block_words + (BS * D) // 4 + pos % BS, mask=ok & (pos < hi),
                        other=0.0)
    return scale


_HELPERS = (_add5, _locate, _row_lens, _tiles, _row_operands, _ids, _scales, _prefetch_scales, _keys, _as_logits,
            _tile_out, _prefetch_sequence, _prefetch_l2)
#: Runtime sizes: specialising on them would compile variants for no gain.
_UNSPECIALIZED = ["num_seqs", "max_ctx", "covered", "num_blocks", "num_programs"]


@functools.lru_cache(maxsize=2)
def _jitted(interpret: bool) -> Any:
    """The kernel jitted for one mode. ``triton.jit`` fixes interpreter-or-compiled when it runs,
    so the kernel and the helpers it calls are jitted on first use per mode, not at import; they
    share one globals dict in which the helper names are the same mode's jitted helpers."""
    with triton.knobs.runtime.scope():  # restores the knob and TRITON_INTERPRET afterwards
        triton.knobs.runtime.interpret = interpret
        scope = dict(_paged_kernel.__globals__)

        def rebuilt(f: Any) -> Any:
            g = types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__)
            # triton.jit reads constexpr parameters off the annotations, which FunctionType drops.
            g.__annotations__ = dict(f.__annotations__)
            g.__module__, g.__qualname__ = f.__module__, f.__qualname__
            return g

        scope.update({f.__name__: triton.jit(rebuilt(f)) for f in _HELPERS})
        return triton.jit(rebuilt(_paged_kernel), do_not_specialize=_UNSPECIALIZED)


def kernel(interpret: bool | None = None) -> Any:
    """The jitted kernel for ``interpret`` (default: what TRITON_INTERPRET says now)."""
    return _jitted(bool(triton.knobs.runtime.interpret) if interpret is None else interpret)


def _arch_of(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    from mqa_core.arch import arch_of_device

    return arch_of_device(device)


@functools.cache
def _device_facts(index: int) -> tuple[int, int, int, int]:
    """(SMs, registers per SM, shared bytes per SM, threads per SM) of CUDA device ``index``."""
    p = torch.cuda.get_device_properties(index)
    return (p.multi_processor_count, int(getattr(p, "regs_per_multiprocessor", 65536)),
            int(getattr(p, "shared_memory_per_multiprocessor", 228 * 1024)),
            int(getattr(p, "max_threads_per_multi_processor", 2048)))


def resident_programs(regs: int, shared: int, num_warps: int, *, regs_per_sm: int = 65536,
                      shared_per_sm: int = 228 * 1024, threads_per_sm: int = 2048) -> int:
    """How many programs of ``num_warps`` warps, ``regs`` registers per thread and ``shared`` bytes
    fit on one NVIDIA SM at once (registers are granted per warp in 256s; 1 KB of shared memory
    per block is reserved by the driver)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = regs_per_sm // max(per_warp * num_warps, 1)
    by_smem = shared_per_sm // (shared + 1024)
    by_threads = threads_per_sm // (num_warps * 32)
    return max(1, min(by_regs, by_smem, by_threads, 32))


@dataclasses.dataclass(frozen=True)
class _Shape:
    """The constexprs of one launch, derived from (next_n, H, D, block_size, tile)."""

    next_n: int
    h: int
    d: int
    block_size: int
    tile: int

    @property
    def h_pad(self) -> int:
        return max(16, triton.next_power_of_2(self.h))

    @property
    def ng(self) -> int:  # query rows (of next_n) per program
        return max(1, min(triton.next_power_of_2(self.next_n), _MAX_ROWS // self.h_pad))

    @property
    def groups(self) -> int:
        return triton.cdiv(self.next_n, self.ng)

    @property
    def d_pad(self) -> int:
        return max(32, triton.next_power_of_2(self.d))

    def tma_ok(self) -> bool:
        """A tile is one TMA box: it lies inside one block, and a row fits one 128-byte swizzle."""
        return self.block_size % self.tile == 0 and self.d == self.d_pad <= 128

    def constexprs(self, cfg: PagedConfig, lens_2d: bool, clean: bool, kv_fnuz: bool,
                   tma: bool, prefetch: int, ptx: bool = False) -> dict[str, Any]:
        """``ptx``: an NVIDIA build (inline PTX prefetches allowed)."""
        return {"NEXT_N": self.next_n, "H": self.h, "H_PAD": self.h_pad, "D": self.d,
                "D_PAD": self.d_pad, "NG": self.ng, "NUM_GROUPS": self.groups,
                "BS": self.block_size, "TILE": self.tile, "SCHED": _SCHED,
                "PREFETCH": prefetch, "ROW_DOTS": cfg.row_dots and self.ng == 2,
                "LENS_2D": bool(lens_2d), "CLEAN": bool(clean),
                "KV_FNUZ": bool(kv_fnuz), "USE_TMA": bool(tma), "PIPE": cfg.pipe,
                "NEXT_PF": bool(ptx and cfg.pipe)}


def _kv_descriptor(kv_cache: torch.Tensor, dtype: torch.dtype, d: int, tile: int) -> Any:
    """A host TMA descriptor viewing the cache values as [blocks, block_size, D] (rows D bytes apart,
    blocks ``stride(0)`` bytes apart), boxes of [1, tile, D]. Plain arguments: the per-call paths hand
    them to ``BoundKernel.descriptor`` without building anything."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    blocks, block_size, stride = kv_cache.shape[0], kv_cache.shape[1], kv_cache.stride(0)
    values = kv_cache.as_strided((blocks, block_size, d), (stride, d, 1))
    return TensorDescriptor(values.view(dtype), [blocks, block_size, d], [stride, d, 1], [1, tile, d])


def _tma_usable(kv_cache: torch.Tensor, shape: _Shape, arch: str) -> bool:
    nvidia = arch == "cpu" or (arch.startswith("sm_") and int(arch[3:5]) >= 90)
    return (nvidia and shape.tma_ok() and kv_cache.data_ptr() % 16 == 0
            and kv_cache.stride(0) % 16 == 0)


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What a call signature needs at launch: the bound kernel (``launch.BoundKernel``: Triton's C
    launcher and constant arguments; it also keeps the encoded TMA descriptors), the grid, the
    constexprs, the stride arguments, and the variant it was built for."""

    bound: Any
    programs: int
    constexprs: tuple[Any, ...]
    tma: bool
    tile: int
    strides: tuple[int, ...]
    config: PagedConfig


#: Launch state per call signature (see _signature). Bounded: a caller whose strides change on
#: every call would otherwise grow it; the compiled kernels stay in Triton's own cache.
_LAUNCHES: dict[tuple[Any, ...], _Launch] = {}
_LAUNCHES_MAX = 256
#: The grid of signatures compiled but not bound (Triton's launch internals differ from those
#: ``launch.py`` knows): they launch through ``kernel[grid]``.
_GRIDS: dict[tuple[Any, ...], int] = {}
_LAUNCH_LOCK = threading.Lock()


def _signature(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, lens: torch.Tensor,
               tables: torch.Tensor, clean: bool, cfg: PagedConfig | None,
               logits_dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """Everything the compiled kernel and the grid depend on: dtypes, the constexpr sizes, the exact
    strides and the 16-byte alignment of every pointer (what Triton specialises on), and the variant
    asked for (None: the default one, itself a function of the device and the sizes here, so the
    common call hashes no config)."""
    return (q.device, q.dtype, q.shape[1:], kv_cache.shape[1:], kv_cache.stride(), q.stride(),
            weights.stride(), lens.stride(), tables.stride(), clean, cfg, q.data_ptr() % 16 == 0,
            kv_cache.data_ptr() % 16, weights.data_ptr() % 16 == 0, lens.data_ptr() % 16 == 0,
            tables.data_ptr() % 16 == 0, logits_dtype)


def _row(n: int, itemsize: int = 4) -> int:
    """The output's row stride for ``n`` columns of ``itemsize`` bytes: rows start 64-byte aligned
    (16 floats, 32 bf16); the Gluon paged kernel's outputs share it."""
    align = _ROW_BYTES // itemsize
    return -(-max(n, 1) // align) * align


def _new_output(m: int, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[m, n] logits (float32 or bfloat16) whose rows start 64-byte aligned (row stride :func:`_row`)."""
    return torch.empty_strided((m, n), (_row(n, dtype.itemsize), 1), dtype=dtype, device=device)


def _strides(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, lens: torch.Tensor,
             tables: torch.Tensor) -> tuple[int, ...]:
    """block_bytes ... stride_btb: fixed for a call signature (which includes every stride)."""
    stride0 = kv_cache.stride(0)
    stride_clb, stride_clj = (lens.stride(0), 0) if lens.dim() == 1 else lens.stride()
    return (stride0, stride0 // 4, *q.stride()[:3], weights.stride(0), stride_clb, stride_clj,
            tables.stride(0))


def _runtime_args(q: torch.Tensor, kv_cache: torch.Tensor, desc: Any, weights: torch.Tensor,
                  lens: torch.Tensor, tables: torch.Tensor, out: torch.Tensor, max_context_len: int,
                  programs: int, strides: tuple[int, ...]) -> tuple[Any, ...]:
    """The kernel's non-constexpr arguments in parameter order (shared by both launch paths)."""
    return (q, kv_cache, desc, weights, lens, tables, out,
            q.shape[0], max_context_len, min(max_context_len, tables.shape[1] * kv_cache.shape[1]),
            kv_cache.shape[0], programs, *strides, out.stride(0))


def _run(launch: _Launch, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
         lens: torch.Tensor, tables: torch.Tensor, max_context_len: int,
         logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The hot path: allocate the output, hand the arguments to the bound launcher (no argument
    binding; pointers as ints, the TMA descriptor encoded once per pool address and size)."""
    b, next_n = q.shape[:2]
    num_blocks, block_size = kv_cache.shape[:2]
    out = _new_output(b * next_n, max_context_len, q.device, logits_dtype)
    if not b or not max_context_len:  # next_n > 0: an empty output never reaches _prepare
        return out
    if not num_blocks:  # no block to read: every position is an out-of-range id
        return out.fill_(float("-inf"))
    kv_ptr = kv_cache.data_ptr()
    if launch.tma:  # everything else the descriptor depends on is part of the call signature
        desc = launch.bound.descriptor((0, kv_ptr, num_blocks), _kv_descriptor, kv_cache, q.dtype,
                                       q.shape[3], launch.tile)
    else:
        desc = (None,)
    args = (q.data_ptr(), kv_ptr, *desc, weights.data_ptr(), lens.data_ptr(), tables.data_ptr(),
            out.data_ptr(), b, max_context_len, min(max_context_len, tables.shape[1] * block_size),
            num_blocks, launch.programs, *launch.strides, out.stride(0), *launch.constexprs)
    _launch_on(launch.bound, launch.programs, q.device.index, args)
    return out


def _launch_on(bound: Any, programs: int, index: int | None, args: tuple[Any, ...]) -> None:
    """Launch on device ``index``'s current stream, switching to that device only when it is not the
    current one. (A device that holds tensors has CUDA initialised: ``torch._C._cuda_getDevice`` is
    ``torch.cuda.current_device`` without its lazy-init check.)"""
    if index is None or torch._C._cuda_getDevice() == index:
        bound(programs, 1, 1, _stream(index), args)
    else:
        with torch.cuda.device(index):
            bound(programs, 1, 1, _stream(index), args)


def _stream(index: int | None) -> int:
    return torch._C._cuda_getCurrentRawStream(index)


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """The launch of one full call signature, with everything that signature fixes worked out once.

    Valid for any call whose tensors have the types, shapes, strides, dtypes and device of the call
    it was prepared from, with the same ``max_context_len`` and ``clean_logits`` (``mqa_core.memo``'s
    paged signature); with the start addresses' residues modulo 16, checked per call, that is a
    superset of :func:`_signature`. Per call it reads five pointers, allocates the output and
    launches; with the interpreter on, a Triton launch hook set (the hook sees the launch) or
    pointers of other residues it takes the full path, as :func:`fp8_paged_mqa_logits_triton` would.
    """

    launch: _Launch
    #: The output's size (its rows padded to 16 floats by ``_new_output``).
    size: tuple[int, int]
    num_blocks: int
    index: int | None
    #: The kernel's arguments after the output pointer (B ... the constexprs), in parameter order.
    tail: tuple[Any, ...]
    shape: _Shape
    max_context_len: int
    clean_logits: bool
    #: The five start addresses modulo 16 it was prepared for (``launch.residues``; None: all 0).
    residues: tuple[int, ...] | None
    logits_dtype: torch.dtype = torch.float32

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_tables: torch.Tensor, schedule: Any = None, *,
                 logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The call; ``schedule`` (mqa-core's call hint) is not read: this kernel splits the batch itself.
        ``logits_dtype``: as for ``mqa_logits_triton.PreparedCall``."""
        ptrs = (q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), context_lens.data_ptr(),
                block_tables.data_ptr())
        other_dtype = logits_dtype is not None and logits_dtype is not self.logits_dtype
        if triton.knobs.runtime.interpret or hooks_active() or other_dtype or (
                (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15 if self.residues is None
                else residues(ptrs) != self.residues):
            return fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables,
                                               self.max_context_len, self.clean_logits,
                                               logits_dtype=logits_dtype or self.logits_dtype)
        out = _new_output(*self.size, q.device, self.logits_dtype)  # as every output here (the tests poison it)
        launch = self.launch
        kv_ptr = ptrs[1]
        if launch.tma:
            desc = launch.bound.descriptor((0, kv_ptr, self.num_blocks), _kv_descriptor, kv_cache, q.dtype,
                                           self.shape.d, self.shape.tile)
        else:
            desc = (None,)
        _launch_on(launch.bound, launch.programs, self.index,
                   (ptrs[0], kv_ptr, *desc, *ptrs[2:], out.data_ptr(), *self.tail))
        return out


def prepare(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
            block_tables: torch.Tensor, max_context_len: int, clean_logits: bool = True, *,
            config: PagedConfig | None = None, logits_dtype: torch.dtype = torch.float32) -> PreparedCall | None:
    """The :class:`PreparedCall` for calls like this one, once a call of its kernel signature has
    bound a launch; None where such calls do not take the bound launch (the interpreter, a Triton
    without direct launches, gfx942's converted q, inputs that need a copy, an empty output or pool).
    Arguments as for :func:`fp8_paged_mqa_logits_triton`, already checked by it on an earlier call."""
    if triton.knobs.runtime.interpret:
        return None
    launch = _LAUNCHES.get(_signature(q, kv_cache, weights, context_lens, block_tables, clean_logits, config,
                                      logits_dtype))
    b, next_n, h, d = q.shape
    num_blocks, block_size = kv_cache.shape[:2]
    if launch is None or not (b and max_context_len and num_blocks):
        return None
    row = _row(max_context_len, logits_dtype.itemsize)  # as _new_output
    covered = min(max_context_len, block_tables.shape[1] * block_size)
    tail = (b, max_context_len, covered, num_blocks, launch.programs, *launch.strides, row, *launch.constexprs)
    ptrs = (q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), context_lens.data_ptr(), block_tables.data_ptr())
    return PreparedCall(launch, (b * next_n, max_context_len), num_blocks, q.device.index, tail,
                        _Shape(next_n, h, d, block_size, launch.tile), max_context_len, clean_logits,
                        residues(ptrs), logits_dtype)


def _check(q: torch.Tensor, kv_cache: torch.Tensor, max_context_len: int) -> None:
    d = q.shape[3]
    if d % 16 or kv_cache.shape[-1] != d + 4:
        raise ValueError(f"fp8_paged_mqa_logits_triton needs D % 16 == 0 and kv_cache [..., D + 4]; "
                         f"got q {list(q.shape)}, kv_cache {list(kv_cache.shape)}")
    s = kv_cache.stride()
    block_bytes = kv_cache.shape[1] * (d + 4)
    if (kv_cache.shape[0] > 1 and s[0] < block_bytes) or s[0] % 4 or s[1] != d + 4 or s[3] != 1 \
            or kv_cache.data_ptr() % 4:
        raise ValueError(f"fp8_paged_mqa_logits_triton: kv_cache strides {tuple(s)} do not hold "
                         f"DeepGEMM's layout: need stride(0) >= block_size * (D + 4) = {block_bytes} "
                         f"and a multiple of 4, stride(1) == D + 4 = {d + 4}, stride(3) == 1, and a "
                         "4-byte aligned start")
    if max(max_context_len, kv_cache.shape[0], s[0]) >= 2**31:
        raise ValueError("fp8_paged_mqa_logits_triton: sizes and strides must stay below 2**31")


def _options(cfg: PagedConfig, nvidia: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg and nvidia:
        options["maxnreg"] = cfg.maxnreg
    return options


def _prepare(key: tuple[Any, ...], args: tuple[Any, ...], cfg: PagedConfig,
             constexprs: dict[str, Any], strides: tuple[int, ...], device: torch.device) -> int:
    """Compile for this signature (no launch), size the persistent grid to one resident wave, and
    keep a bound launcher for later calls where Triton's launch internals allow one. The grid."""
    with torch.cuda.device(device):
        compiled = kernel(interpret=False).warmup(*args, grid=(1,), **_options(cfg, torch.version.hip is None),
                                                  **constexprs)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
            compiled = compiled.result()
        bound = bind(compiled) if direct_launch_unsupported() is None else False
        compiled.run  # noqa: B018 (loads the module: n_regs is known after it)
        sms, regs_per_sm, smem_per_sm, threads_per_sm = _device_facts(device.index)
    if cfg.programs:
        programs = cfg.programs
    elif torch.version.hip is not None:  # AMD: no register model here; the configured count per CU
        programs = cfg.programs_per_sm * sms
    else:
        fit = resident_programs(compiled.n_regs, compiled.metadata.shared, cfg.num_warps,
                                regs_per_sm=regs_per_sm, shared_per_sm=smem_per_sm,
                                threads_per_sm=threads_per_sm)
        programs = min(cfg.programs_per_sm, fit) * sms
    if bound:
        launch = _Launch(bound, programs, tuple(constexprs.values()), constexprs["USE_TMA"], cfg.tile,
                         strides, cfg)
        with _LAUNCH_LOCK:
            if len(_LAUNCHES) >= _LAUNCHES_MAX:
                _LAUNCHES.clear()
            _LAUNCHES[key] = launch
    else:  # every call launches through Triton; remember the grid only
        with _LAUNCH_LOCK:
            if len(_GRIDS) >= _LAUNCHES_MAX:
                _GRIDS.clear()
            _GRIDS[key] = programs
    return programs


def fp8_paged_mqa_logits_triton(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                                context_lens: torch.Tensor, block_tables: torch.Tensor,
                                max_context_len: int, clean_logits: bool = True, *,
                                config: PagedConfig | None = None,
                                logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B * next_n, max_context_len]`` logits of ``logits_dtype`` over the paged cache (bfloat16:
    each logit rounded once to nearest even as it is stored).

    Row ``b * next_n + j`` sees positions ``p < context_lens[b] - next_n + j + 1`` (or
    ``p < context_lens[b, j]`` for 2-D lens, any values), capped by what ``block_tables`` covers;
    there ``out = scale[p] * sum_h weights[row, h] * relu(q[b, j, h] . k[p])``, elsewhere -inf when
    ``clean_logits`` (cells past a sequence's last computed tile are left unwritten otherwise).
    Positions whose block id is outside ``[0, num_blocks)`` are -inf and never read. ``kv_cache``
    may be a strided page pool (``stride(0) >= block_size * (D + 4)``). Inputs otherwise follow the
    op's contract (``mqa_core.validate``); the result is a view of rows padded to 16 floats.
    No host synchronisation: safe to capture in a CUDA graph.
    """
    interpret = bool(triton.knobs.runtime.interpret)
    if not interpret:  # a known signature has unit inner strides: the copies below are not needed
        launch = _LAUNCHES.get(_signature(q, kv_cache, weights, context_lens, block_tables, clean_logits,
                                          config, logits_dtype))
        if launch is not None and not hooks_active():
            return _run(launch, q, kv_cache, weights, context_lens, block_tables, max_context_len, logits_dtype)
    if q.stride(3) != 1:  # the kernel reads D contiguously; q, weights and tables are small
        q = q.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    cfg = config or _default_for(q.device, kv_cache.shape[1], q.shape[1], q.shape[2])
    key = () if interpret else _signature(q, kv_cache, weights, context_lens, block_tables, clean_logits,
                                          config, logits_dtype)
    return _launch_slow(q, kv_cache, weights, context_lens, block_tables, max_context_len, clean_logits,
                        cfg, key, interpret, logits_dtype)


@functools.lru_cache(maxsize=64)
def _default_for(device: torch.device, block_size: int, next_n: int, h: int) -> PagedConfig:
    return default_config(_arch_of(device), block_size, next_n, h)


def _launch_slow(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                 clean_logits: bool, cfg: PagedConfig, key: tuple[Any, ...],
                 interpret: bool, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first call of a signature (checks, compile, grid), the interpreter, gfx942's fnuz path,
    and launches with Triton's launch hooks set. (A signature holds the device, so a cached launch
    never meets CPU tensors: the device check runs here, once per signature.)"""
    if not interpret and _arch_of(q.device) == "cpu":
        raise RuntimeError(f"fp8_paged_mqa_logits_triton got tensors on {q.device}: CPU tensors "
                           "run only under the Triton interpreter (set TRITON_INTERPRET=1)")
    _check(q, kv_cache, max_context_len)
    b, next_n, h, d = q.shape
    block_size = kv_cache.shape[1]
    arch = _arch_of(q.device)
    kv_fnuz = q.dtype == torch.float8_e4m3fn and wants_fnuz(arch)
    if kv_fnuz:  # q is small: convert it; the cache bytes are re-labelled inside the kernel
        q, weights = e4m3fn_to_e4m3fnuz(q, weights)
    out = _new_output(b * next_n, max_context_len, q.device, logits_dtype)
    if out.numel() == 0:
        return out
    if kv_cache.shape[0] == 0:  # no block to read: every position is an out-of-range id
        return out.fill_(float("-inf"))
    shape = _Shape(next_n, h, d, block_size, cfg.tile)
    tma = cfg.tma and not kv_fnuz and _tma_usable(kv_cache, shape, arch)
    desc = _kv_descriptor(kv_cache, q.dtype, shape.d, shape.tile) if tma else None
    prefetch = cfg.prefetch if (not interpret and torch.version.hip is None) else 0  # PTX only
    ptx = not interpret and torch.version.hip is None
    constexprs = shape.constexprs(cfg, context_lens.dim() == 2, clean_logits, kv_fnuz, tma, prefetch, ptx)
    options = _options(cfg, nvidia=not interpret and torch.version.hip is None)
    strides = _strides(q, kv_cache, weights, context_lens, block_tables)
    if interpret:
        programs = cfg.programs or 3  # a few programs, so the interpreter exercises the split
        args = _runtime_args(q, kv_cache, desc, weights, context_lens, block_tables, out,
                             max_context_len, programs, strides)
        with _interpreting():
            kernel(True)[(programs,)](*args, **constexprs, **options)
        return out
    known = _LAUNCHES.get(key)
    if kv_fnuz:  # q converted per call: no cached launch
        programs = cfg.programs or cfg.programs_per_sm * _device_facts(q.device.index or 0)[0]
    elif known is not None:  # launch hooks are set: Triton's own launch path, the known grid
        programs = known.programs
    elif key in _GRIDS:
        programs = _GRIDS[key]
    else:
        args = _runtime_args(q, kv_cache, desc, weights, context_lens, block_tables, out,
                             max_context_len, 0, strides)
        programs = _prepare(key, args, cfg, constexprs, strides, q.device)
    args = _runtime_args(q, kv_cache, desc, weights, context_lens, block_tables, out, max_context_len,
                         programs, strides)
    with torch.cuda.device(q.device):
        kernel(False)[(programs,)](*args, **constexprs, **options)
    return out


def compile_for(target: Any, *, next_n: int = 2, h: int = 64, d: int = 128, block_size: int = 64,
                lens_2d: bool = False, clean_logits: bool = True,
                config: PagedConfig | None = None, out_dtype: str = "fp32") -> dict[str, Any]:
    """Compile ahead of time for a ``triton.backends.compiler.GPUTarget`` (no GPU needed) and return
    the asm dict (``ptx``/``cubin`` or ``amdgcn``) plus ``"metadata"``. The signature is what a real
    launch sees: 16-byte-aligned pointers and strides, unit inner strides of the lens."""
    from triton.compiler import ASTSource

    arch = f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch)
    cfg = config or default_config(arch, block_size, next_n, h)
    kv_fnuz = wants_fnuz(arch)
    fp8 = "*fp8e4b8" if kv_fnuz else "*fp8e4nv"
    fn = kernel(interpret=False)
    shape = _Shape(next_n, h, d, block_size, cfg.tile)
    tma = cfg.tma and target.backend == "cuda" and shape.tma_ok()
    prefetch = cfg.prefetch if target.backend == "cuda" else 0
    constexprs = {**shape.constexprs(cfg, lens_2d, clean_logits, kv_fnuz, tma, prefetch,
                                     target.backend == "cuda"), "stride_clj": 1}
    if not lens_2d:
        constexprs["stride_clj"] = 0
    if not tma:
        constexprs["kv_desc"] = None
    ptr_types = {"q_ptr": fp8, "kv_ptr": "*u8", "w_ptr": "*fp32", "cl_ptr": "*i32", "bt_ptr": "*i32",
                 "out_ptr": f"*{out_dtype}", "kv_desc": f"tensordesc<{fp8[1:]}[1,{cfg.tile},{shape.d_pad}]>"}
    signature = {a: ("constexpr" if a in constexprs else ptr_types.get(a, "i32")) for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if a.endswith("_ptr")] + [
        "block_bytes", "block_words", "stride_qb", "stride_qn", "stride_qh", "stride_wm", "stride_om",
        "stride_btb"]
    if (block_size * (d + 4)) % 64:  # block_words is divisible by 16 only then
        aligned.remove("block_words")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=target, options=_options(cfg, target.backend == "cuda"))
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm
