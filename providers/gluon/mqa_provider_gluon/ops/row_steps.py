"""The fused indexer's per-row steps around the candidates, each one small kernel a chunk.

``mqa_topk_triton``'s orchestration once ran these steps as torch calls: about 75 kernels a chunk of
rows (the sample's ``torch.topk`` alone is a dozen, the bookkeeping a dozen elementwise ops, the
winners' gather, sort and masks twenty more). Each took the GPU 2-5 us and the host 10-20 us to
launch, so the host fell behind and an H100 sat idle for 5 of a 16 ms call (4k x 128k prefill,
sliced path: 11.2 ms of kernels). Here they are three launches:

- :func:`_tau_kernel`: a sampled row's threshold, the r-th largest value of its sample logits (NaN
  ranks as -inf), by a bisection over the float's order-preserving int32 key with the row held in
  registers (rows up to :data:`TAU_COLS` sample columns; wider ones go the torch way);
- :func:`_book_kernel`: from the filter's counts, which rows the sample misjudged, each row's
  candidate count for the select, and which rows keep their result (elementwise, one launch);
- :func:`_finish_kernel`: the winners' slots to positions, ties at the k-th value to the smaller
  positions (:func:`_resolve_ties`, which only a tied row pays for), the positions sorted with their
  values in registers (a sort of ``position << 32 | value bits``, a bitonic network: positions are unique in a
  row, so the value bits never decide the order), shifted to relative positions, and stored to the
  output where the row keeps its result (rows up to :data:`FINISH_TOPK`).

:func:`_ties_kernel` is the same tie rule alone, for the torch way (``topk`` past FINISH_TOPK).
:func:`_table_kernel`, first in a chunk, writes its rows' windows and paths for these kernels from
the windows on the device, where the host once built that table and copied it over.
"""

from __future__ import annotations

import functools
from typing import Any

import triton
import triton.language as tl

from .topk_triton import _rebound

__all__ = ["FINISH_TOPK", "TAU_COLS", "TIES_BLOCK", "book_kernel", "finish_kernel", "finish_warps", "table_kernel",
           "tau_kernel", "tau_warps", "ties_kernel"]

#: Cells a step of the tie rule takes, of the winners and of the candidates.
TIES_BLOCK = 1024
#: The widest sample row :func:`_tau_kernel` holds in registers (32 values a lane at 16 warps).
TAU_COLS = 16384
#: The largest ``topk`` :func:`_finish_kernel` sorts in registers (8 int64 keys a lane at 16 warps;
#: 8192 at 32 warps spills on sm_90, where 1024 threads get 64 registers each).
FINISH_TOPK = 4096
#: Rows a program of :func:`_book_kernel` (and of :func:`_table_kernel`) takes.
BOOK_BLOCK = 1024
#: A winner slot's position where the selection left padding: sorts after every real position.
_PAD: tl.constexpr = tl.constexpr(2**31 - 1)


def tau_warps(cols: int) -> int:
    """Warps for a sample row of ``cols`` columns: about 32 values a lane, 4 to 16 warps."""
    return max(4, min(16, triton.next_power_of_2(cols) // 1024))


def finish_warps(topk: int) -> int:
    """Warps for ``topk`` winners a row: 8 keys a lane from 1024 on (4 to 16 warps). On sm_90 with
    triton 3.6 the kernel takes 80 registers at 2048 and 8 warps (values asked for), no spills."""
    return max(4, min(16, triton.next_power_of_2(topk) // 256))


# ---- the threshold: the r-th largest sample value -------------------------------------------------

def _tau_kernel(x_ptr, stride_xm, flag_ptr, tau_ptr, ncols, r, BLOCK: tl.constexpr):
    """``tau[m]`` = the r-th largest of ``x[m, :ncols]`` (NaN as -inf) where ``flag[m]``, else -inf.

    A float's bits b map to the int32 key ``b ^ ((b >> 31) & 0x7fffffff)``, which orders as the
    floats do (-0.0 just below +0.0); the answer is the largest key t with at least r keys >= t, found
    by 32 halvings of [-2**31, 2**31) over the row in registers, and mapped back by the same xor (an
    involution). Fewer than r columns gives -inf; the plan never asks for it (a sampled row is wider
    than its capacity, over r*s keys, so its sample has more than r columns)."""
    m = tl.program_id(0)
    tau = tl.full([], float("-inf"), tl.float32)
    if (tl.load(flag_ptr + m) != 0) & (r <= ncols):
        cols = tl.arange(0, BLOCK)
        ok = cols < ncols
        x = tl.load(x_ptr + tl.cast(m, tl.int64) * stride_xm + cols, mask=ok, other=float("-inf"))
        x = tl.where(x == x, x, float("-inf"))
        b = x.to(tl.int32, bitcast=True)
        key = b ^ ((b >> 31) & 0x7FFFFFFF)
        lo = tl.full([], -(2**31), tl.int64)  # at least r keys >= lo (every column)
        hi = tl.full([], 2**31, tl.int64)  # fewer than r keys >= hi (none)
        for _ in range(32):
            mid = (lo + hi) >> 1
            c = tl.sum(((key >= mid.to(tl.int32)) & ok).to(tl.int32), 0)
            lo = tl.where(c >= r, mid, lo)
            hi = tl.where(c >= r, hi, mid)
        t = lo.to(tl.int32)
        tau = (t ^ ((t >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    tl.store(tau_ptr + m, tau)


# ---- the rows' table: each row's windows and path, from the windows on the device ----------------

def _table_kernel(ks_ptr, ke_ptr, table_ptr, stride_t, m, n, topk, cap, s, SCORE_ALL: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Rows of ``table`` [8, >= m] for rows ``[0, m)``: 0 the window start ``lo = clamp(ks, 0, n)``,
    1 its end ``max(min(ke, n), lo)``, 2-3 the filter's window (``lo, hi`` where scored, else empty),
    4-5 the sample's window over ``k[::s]`` (``ceil(lo / s), ceil(hi / s)`` where sampled, else
    empty), 6 sampled (``hi - lo > cap`` and ``s > 0``), 7 scored (``hi - lo > topk``, or every row
    with ``SCORE_ALL``). The host makes the same decisions from its copy of the windows; made here,
    the table needs no host arithmetic over every row, no pinned copy and no copy to the device
    (on an H100 those took 1.0-1.2 ms of host time while the GPU waited, at 4k rows)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < m
    lo = tl.minimum(tl.maximum(tl.load(ks_ptr + offs, mask=ok, other=0).to(tl.int64), 0), n)
    hi = tl.maximum(tl.minimum(tl.load(ke_ptr + offs, mask=ok, other=0).to(tl.int64), n), lo)
    w = hi - lo
    sampled = (w > cap) & (s > 0)
    if SCORE_ALL:
        scored = w >= 0
    else:
        scored = w > topk
    sd = tl.maximum(s, 1)
    tl.store(table_ptr + offs, lo.to(tl.int32), mask=ok)
    tl.store(table_ptr + stride_t + offs, hi.to(tl.int32), mask=ok)
    tl.store(table_ptr + 2 * stride_t + offs, tl.where(scored, lo, 0).to(tl.int32), mask=ok)
    tl.store(table_ptr + 3 * stride_t + offs, tl.where(scored, hi, 0).to(tl.int32), mask=ok)
    tl.store(table_ptr + 4 * stride_t + offs, tl.where(sampled, (lo + sd - 1) // sd, 0).to(tl.int32), mask=ok)
    tl.store(table_ptr + 5 * stride_t + offs, tl.where(sampled, (hi + sd - 1) // sd, 0).to(tl.int32), mask=ok)
    tl.store(table_ptr + 6 * stride_t + offs, sampled.to(tl.int32), mask=ok)
    tl.store(table_ptr + 7 * stride_t + offs, scored.to(tl.int32), mask=ok)


# ---- the bookkeeping: who kept their candidates ---------------------------------------------------

def _book_kernel(cnt_ptr, table_ptr, stride_t, counts_ptr, win_ptr, stride_w, mc, topk, cap, BLOCK: tl.constexpr):
    """For rows ``[0, mc)`` of a chunk, from the filter's counts ``cnt`` and the chunk's table (rows:
    0 window start, 1 window end, 6 sampled, 7 scored): ``counts[m]``, a sampled row's count (the
    caller's one sync reads it); and ``win`` rows 0-3: the select's window over the candidates
    (0, nvalid), whether the row keeps this chunk's result (scored, and not misjudged), and whether
    the tie rule applies (sampled, kept). A sampled row is misjudged when its count is below topk or
    past the capacity; a dense row's candidates are its whole window."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < mc
    lo = tl.load(table_ptr + offs, mask=ok, other=0)
    hi = tl.load(table_ptr + stride_t + offs, mask=ok, other=0)
    sampled = tl.load(table_ptr + 6 * stride_t + offs, mask=ok, other=0) != 0
    scored = tl.load(table_ptr + 7 * stride_t + offs, mask=ok, other=0) != 0
    c = tl.load(cnt_ptr + offs, mask=ok, other=0)
    bad = sampled & ((c < topk) | (c > cap))
    tl.store(counts_ptr + offs, tl.where(sampled, c, 0), mask=ok)
    nvalid = tl.where(sampled, tl.where(bad, 0, tl.minimum(c, cap)), tl.where(scored, hi - lo, 0))
    tl.store(win_ptr + offs, c * 0, mask=ok)
    tl.store(win_ptr + stride_w + offs, nvalid, mask=ok)
    tl.store(win_ptr + 2 * stride_w + offs, (scored & (bad == 0)).to(tl.int32), mask=ok)
    tl.store(win_ptr + 3 * stride_w + offs, (sampled & (bad == 0)).to(tl.int32), mask=ok)


# ---- ties at the k-th value: the smaller positions, on the device ----------------------------------

def _resolve_ties(pos_ptr, val_ptr, nv, got_ptr, v_ptr, crow, trow, topk, n, CBLOCK: tl.constexpr,
                  TBLOCK: tl.constexpr):
    """Step 4's tie rule for one row (a sampled row that kept its candidates: ``nv`` >= topk of them,
    all cells >= its tau); returns 1 if it rewrote the row, else 0. The selection took its winners
    (``got``: positions, ``v``: values, ``topk`` of each) by slot, and the atomics made slot order
    arbitrary, so where the candidates hold more cells equal to the k-th value (kth, the least
    winner) than were taken, the taken ones need not be the smallest positions. Such a row is
    rewritten: every winner above kth, then the ``need`` smallest positions among the candidates
    equal to kth (need: the winners equal to it). Every cell equal to kth is a candidate (kth >= tau),
    and positions are unique in a row, so the need-th smallest such position x is where the count of
    equal candidates at positions <= x first reaches need: a bisection over [0, n), one pass over the
    candidates a step, which a row pays only when it is tied. The winners come out unsorted."""
    tcols = tl.arange(0, TBLOCK)
    ccols = tl.arange(0, CBLOCK)
    kth = tl.full([], float("inf"), tl.float32)
    need = tl.full([], 0, tl.int32)
    for c0 in range(0, topk, TBLOCK):  # the least winner and how many winners equal it
        c = c0 + tcols
        inside = c < topk
        v = tl.load(v_ptr + trow + c, mask=inside, other=float("inf"))
        least = tl.min(v, 0)
        times = tl.sum(((v == least) & inside).to(tl.int32), 0)  # masks kept: a value may be +inf
        need = tl.where(least < kth, times, tl.where(least == kth, need + times, need))
        kth = tl.minimum(kth, least)
    equal = tl.full([], 0, tl.int32)
    for j0 in range(0, nv, CBLOCK):
        j = j0 + ccols
        x = tl.load(val_ptr + crow + j, mask=j < nv, other=float("inf"))
        equal += tl.sum(((x == kth) & (j < nv)).to(tl.int32), 0)
    fixed = tl.full([], 0, tl.int32)
    if equal > need:
        fixed = tl.full([], 1, tl.int32)
        above = tl.full([], 0, tl.int32)
        for c0 in range(0, topk, TBLOCK):  # the winners above kth, moved to the front (never rightwards)
            c = c0 + tcols
            inside = c < topk
            v = tl.load(v_ptr + trow + c, mask=inside, other=0.0)
            g = tl.load(got_ptr + trow + c, mask=inside, other=0)
            keep = inside & (v > kth)
            ki = keep.to(tl.int32)
            dst = above + tl.cumsum(ki, 0) - 1
            tl.debug_barrier()  # every load of the step before any store over it
            tl.store(got_ptr + trow + dst, g, mask=keep)
            tl.store(v_ptr + trow + dst, v, mask=keep)
            above += tl.sum(ki, 0)
        lo = tl.full([], 0, tl.int32)  # need, counted above, is topk - above: every winner is >= kth
        hi = tl.full([], 0, tl.int32) + n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            cnt = tl.full([], 0, tl.int32)
            for j0 in range(0, nv, CBLOCK):
                j = j0 + ccols
                ok = j < nv
                x = tl.load(val_ptr + crow + j, mask=ok, other=float("inf"))
                p = tl.load(pos_ptr + crow + j, mask=ok, other=0)
                cnt += tl.sum(((x == kth) & (p <= mid) & ok).to(tl.int32), 0)
            reached = cnt >= need
            hi = tl.where(reached, mid, hi)
            lo = tl.where(reached, lo, mid + 1)
        put = above
        for j0 in range(0, nv, CBLOCK):  # the equal candidates at positions <= lo: exactly need of them
            j = j0 + ccols
            ok = j < nv
            x = tl.load(val_ptr + crow + j, mask=ok, other=float("inf"))
            p = tl.load(pos_ptr + crow + j, mask=ok, other=0)
            take = (x == kth) & (p <= lo) & ok
            ti = take.to(tl.int32)
            dst = put + tl.cumsum(ti, 0) - 1
            tl.store(got_ptr + trow + dst, p, mask=take)
            tl.store(v_ptr + trow + dst, x, mask=take)
            put += tl.sum(ti, 0)
    return fixed


def _ties_kernel(pos_ptr, val_ptr, nvalid_ptr, flag_ptr, got_ptr, v_ptr, fixed_ptr, stride_cm, stride_tm, topk,
                 n, CBLOCK: tl.constexpr, TBLOCK: tl.constexpr):
    """:func:`_resolve_ties` for row m where ``flag[m]`` is set; ``fixed[m]`` says whether it
    rewrote the row (1, else 0). The caller sorts the winners by position after."""
    m = tl.program_id(0)
    fixed = tl.full([], 0, tl.int32)
    if tl.load(flag_ptr + m) != 0:
        fixed = _resolve_ties(pos_ptr, val_ptr, tl.load(nvalid_ptr + m), got_ptr, v_ptr,
                              tl.cast(m, tl.int64) * stride_cm, tl.cast(m, tl.int64) * stride_tm, topk, n,
                              CBLOCK, TBLOCK)
    tl.store(fixed_ptr + m, fixed)


# ---- the finish: winners to sorted positions in the output ------------------------------------------

def _pair_step(x, down, D: tl.constexpr, L: tl.constexpr):
    """One compare-exchange step of a bitonic network over the 2**L integers ``x``: each pair of
    lanes 2**D apart leaves the smaller value in the lower lane (the larger where ``down``). Triton
    has no lane shuffle, so each lane finds its partner through a [.., 2, 2**D] view: the xor of the
    pair (one reduction over the middle axis, broadcast back) xor its own value."""
    shape: tl.constexpr = [1 << (L - D - 1), 2, 1 << D]
    pair = tl.reshape(tl.broadcast_to(tl.xor_sum(tl.reshape(x, shape), 1)[:, None, :], shape), [1 << L])
    other = x ^ pair
    upper = ((tl.arange(0, 1 << L) >> D) & 1) != 0
    return tl.where((x > other) != (upper != down), other, x)


def _sort_ints(x, L: tl.constexpr):
    """The 2**L integers ``x`` in ascending order: a bitonic sorting network (blocks of 2, 4, ...
    sorted in alternating directions, each pair of neighbours merged), L(L+1)/2 steps. Written
    here, not ``tl.sort``: the interpreter cannot call Triton's library kernels when Triton was
    imported without it, and the tests run these kernels there."""
    lane = tl.arange(0, 1 << L)
    for S in tl.static_range(1, L + 1):
        down = ((lane >> S) & 1) != 0  # odd blocks of 2**S descend (none at the last stage)
        for J in tl.static_range(S):
            x = _pair_step(x, down, S - 1 - J, L)
    return x


def _finish_kernel(idx_ptr, v_ptr, pos_ptr, val_ptr, win_ptr, stride_w, lo_ptr, out_ptr, stride_om, vals_ptr,
                   stride_vm, fixed_ptr, stride_cm, stride_tm, topk, n, CBLOCK: tl.constexpr,
                   TBLOCK: tl.constexpr, LOG2: tl.constexpr, RELATIVE: tl.constexpr, VALUES: tl.constexpr):
    """Row m of a chunk, where ``win[2, m]`` (keep) is set: the selection's winners (``idx``: slots
    into the row's candidates, -1 padding; ``v``: their values) become positions in place, the tie
    rule runs where ``win[3, m]`` is set (``fixed[m]`` = 1 where it rewrote the row), and the
    positions, sorted with their values, go to ``out`` (``- lo[m]`` when RELATIVE; -1 padding) and
    ``vals`` (-inf padding). Rows not kept are left alone: whole windows or rescored by the caller."""
    m = tl.program_id(0)
    if tl.load(win_ptr + 2 * stride_w + m) != 0:
        crow = tl.cast(m, tl.int64) * stride_cm
        trow = tl.cast(m, tl.int64) * stride_tm
        tcols = tl.arange(0, TBLOCK)
        for c0 in range(0, topk, TBLOCK):  # slots to positions, in place (each lane its own cells)
            c = c0 + tcols
            inside = c < topk
            i = tl.load(idx_ptr + trow + c, mask=inside, other=-1)
            p = tl.load(pos_ptr + crow + tl.maximum(i, 0), mask=inside & (i >= 0), other=_PAD)
            tl.store(idx_ptr + trow + c, p, mask=inside)
        tl.debug_barrier()
        if tl.load(win_ptr + 3 * stride_w + m) != 0:
            fixed = _resolve_ties(pos_ptr, val_ptr, tl.load(win_ptr + stride_w + m), idx_ptr, v_ptr, crow, trow,
                                  topk, n, CBLOCK, TBLOCK)
            tl.store(fixed_ptr + m, fixed)
            tl.debug_barrier()
        cols = tl.arange(0, 1 << LOG2)
        inside = cols < topk
        g = tl.load(idx_ptr + trow + cols, mask=inside, other=_PAD)
        if VALUES:
            x = tl.load(v_ptr + trow + cols, mask=inside, other=float("-inf"))
            bits = x.to(tl.int32, bitcast=True).to(tl.uint32, bitcast=True).to(tl.int64)
            key = _sort_ints((g.to(tl.int64) << 32) | bits, LOG2)
            g = (key >> 32).to(tl.int32)
            x = key.to(tl.int32).to(tl.float32, bitcast=True)  # the low 32 bits
        else:
            g = _sort_ints(g, LOG2)
        real = g != _PAD
        shift = tl.load(lo_ptr + m) if RELATIVE else 0
        orow = tl.cast(m, tl.int64) * stride_om
        tl.store(out_ptr + orow + cols, tl.where(real, g - shift, -1), mask=inside)
        if VALUES:
            tl.store(vals_ptr + tl.cast(m, tl.int64) * stride_vm + cols, tl.where(real, x, float("-inf")),
                     mask=inside)


# ---- jitting -----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _jitted(name: str, interpret: bool) -> Any:
    """One kernel jitted for one mode, calling the tie rule jitted for the same mode
    (``topk_triton._jitted`` says why not at import)."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        glb = dict(_resolve_ties.__globals__)
        for f in (_resolve_ties, _pair_step, _sort_ints):  # in call order: each sees the ones before
            glb[f.__name__] = triton.jit(_rebound(f, glb))
        fn, dyn = {"tau": (_tau_kernel, ["ncols", "r"]), "book": (_book_kernel, ["mc", "topk", "cap"]),
                   "table": (_table_kernel, ["m", "n", "topk", "cap", "s"]),
                   "ties": (_ties_kernel, ["topk", "n"]), "finish": (_finish_kernel, ["topk", "n"])}[name]
        return triton.jit(_rebound(fn, glb), do_not_specialize=dyn)


def _mode(interpret: bool | None) -> bool:
    return bool(triton.knobs.runtime.interpret) if interpret is None else interpret


def tau_kernel(interpret: bool | None = None) -> Any:
    """The jitted :func:`_tau_kernel` (``interpret``: default what TRITON_INTERPRET says now)."""
    return _jitted("tau", _mode(interpret))


def table_kernel(interpret: bool | None = None) -> Any:
    """The jitted :func:`_table_kernel`."""
    return _jitted("table", _mode(interpret))


def book_kernel(interpret: bool | None = None) -> Any:
    """The jitted :func:`_book_kernel`."""
    return _jitted("book", _mode(interpret))


def ties_kernel(interpret: bool | None = None) -> Any:
    """The jitted :func:`_ties_kernel`."""
    return _jitted("ties", _mode(interpret))


def finish_kernel(interpret: bool | None = None) -> Any:
    """The jitted :func:`_finish_kernel`."""
    return _jitted("finish", _mode(interpret))
