"""Fused prefill indexer: fp8 MQA logits and the exact top-k per row, without the [M, N] logits matrix.

The result is the exact top-k (DESIGN.md, "the indexer step") of the values one Triton kernel, the
*filter kernel*, computes per (query, key) cell: ties to the smaller position, positions ascending,
-1 (value -inf) padding where the window holds fewer than ``topk`` keys; -0.0 == +0.0 and NaN ranks
below everything. How it gets there, per chunk of query rows:

1. Rows whose window width W <= topk are all of their window (``arange``); the kernel scores them only
   when values are asked for.
2. A threshold per row from a strided sample (FlashTopK): every s-th key (``k[::s]``, a view) scored by
   the logits kernel of ``mqa_logits_triton`` with each row's window mapped to the sample, and
   ``tau[m]`` = the r-th largest sample value of row m. r is the least with ``r - a*sqrt(r) >= topk/s``
   (a = 4: the candidate count ~ (r +- sqrt(r)) * s for keys drawn like the sample falls short of
   topk only past four standard deviations), and the candidate capacity is
   ``C = r*s + b*s*sqrt(r)`` (b = 6). Rows with W <= C skip the sample: tau = -inf, all of their window.
   The stride s grows with sqrt(W/topk) (8 to 128): fewer sampled keys, a larger capacity.
   tau comes from one kernel (``row_steps._tau_kernel``: a bisection over the row in registers);
   sample rows wider than ``row_steps.TAU_COLS`` take ``torch.topk``.
3. The filter kernel is the logits kernel's loop body unchanged (same dot, relu*w, head sum, *scale,
   same config) with another epilogue: each in-window cell with ``value >= tau[m]`` is appended,
   (position, value), to row m's candidate buffer [C] through a per-row int32 atomic counter (a
   cumulative sum inside the tile gives each cell its slot). With tau = -inf a row is *dense*: every
   cell of its window goes to slot ``n - lo`` (no atomics, positions already in order), NaN included.
   ``filter="slices"`` finds the same candidates another way: the scorer's *logits* kernel over key
   slices ``[c0, c0 + S)`` (S: what the workspace has left, for the chunk's rows), and after each
   slice the one-warp slice filter kernel appends that slice's cells as the epilogue would. The
   logits make one round trip through HBM, but the logits kernel keeps its own speed (on sm_90 the
   epilogue doubled it), and the selection still runs once a row, over candidates, not over the
   window (the two-stage path's select reads every logit and runs per row chunk).
4. Rows with topk <= count <= C: ``select`` over the candidates as they lie, then the winners'
   positions sorted. The slots hand ties at the k-th value to the smaller slot, not the smaller
   position: in a row whose candidates hold more cells equal to its k-th value than were taken, the
   tie rule (``row_steps._resolve_ties``, which a row pays for only when it is tied) swaps the taken
   ones for the smallest positions among them (every such cell is a candidate). Sorting ``topk``
   winners instead of C candidates keeps the sort in registers and drops the gather of C values.
   Around the select, two kernels a chunk do the rest (``row_steps``: the bookkeeping before it;
   the slots to positions, the tie rule, the sort and the store after it), where ~75 torch calls
   once left the GPU waiting on their launches; topk past ``row_steps.FINISH_TOPK`` takes the torch
   steps and the ties kernel.
5. Rows the sample misjudged (count < topk or count > C): rescored by the same kernel, dense, in key
   pieces of width P: each piece's values are selected together with the best ``topk`` so far (kept
   before the piece, so index order is position order). One host sync, after every chunk is
   enqueued, finds them: the chunks run back to back on the GPU, never waiting on the host.
6. Every temporary lives inside ``workspace_bytes`` (see *Memory* below), for any N.

The threshold only decides the path, never the result: a candidate set holding every cell >= tau and
at least topk of them holds the top-k (the k-th largest value is >= tau), and a misjudged row is
rescored in full. Values are bitwise those of the filter kernel in every path (one compiled kernel;
tau is a runtime argument), so which path a row took cannot show in its result.

Determinism and batch invariance. A cell's value depends only on q[m], weights[m], k[n], k_scale[n]
and the launch config: the config comes from (arch, H) alone (``default_config``), never from M, N or
the windows; the dot computes each output cell from its own row and column, and the head sum and the
scale run in the same order whichever rows share a block or which program (key split) computes the
tile. The grid (splits) depends on M, but only decides who computes a tile. Candidate append order
varies between runs, but the selected set is every candidate above the k-th value plus the
smallest positions among those equal to it (the tie rule sees to that), and it is sorted by
position, so the result is a function of the row's own values: the same bits alone, in any batch,
in any chunk, with any sample stride or path (row chunking and the stride depend on the batch; the result does not).

Memory (the accounting ``plan`` does and the tests check). Beyond the inputs and the outputs
(int32 [M, topk] positions, fp32 [M, topk] values), every temporary is allocated through one
:class:`Workspace`, which counts live bytes, plus declared scratch for torch's own sort/topk
temporaries (:data:`SORT_SCRATCH`, a factor of the sorted bytes) and for ``select``
(:data:`SELECT_BYTES_PER_CELL`; a plugged-in ``select`` is assumed to need no more). Per row of a
fast-path chunk of Mc rows, with Ns = ceil(N / s) (rounded to 16) and C the capacity:

- sample stage: 4*Ns (sample logits) + Ns (NaN mask) + sort scratch of torch.topk + 12*r;
- candidate stage: 8*C (position, value) + 8*topk (the winners' slots and values) + the most of
  SELECT_BYTES_PER_CELL*C (while ``select`` runs) and the winners' position sort (12*topk,
  scratch, and the sorted copy);
- small per-row state (windows, tau, counters, row lists): 64 bytes.

The larger stage times Mc stays below the budget; Mc = budget // per-row bytes. A misjudged row is
rescored with a merge buffer of (topk + P) cells per row (8 bytes each, plus select's), its q, weights
and windows gathered (H*D + 4H + 64 bytes); P and the rows per rescoring chunk are chosen so that
fits, so neither N nor a window's width bounds what fits: at least ``topk`` cells per row must.
On gfx942 e4m3fn inputs are relabelled to e4m3fnuz once; those copies (M*H*D + N*D bytes, plus the
doubled weights and k_scale) are counted first. Examples at 256 MiB (``plan``): M=1024, N=2**20,
topk=2048: s = 64, r = 64, C = 7168, 240 KiB per fast-path row, chunks of <= 955 rows (the logits
matrix would be 4 GiB); a misjudged row there is rescored in one piece of 2**20 keys, 6 rows at a
time. M=4096, N=131072, topk=2048: s = 32, r = 105, C = 5328, 183 KiB per row, 4 chunks of <= 1256.

Predicted cost on an H200 (M=4096, N=131072, H=64, D=128, topk=2048, causal: ~N - M/2 keys per
row, ~5.3e8 scored cells; fp8 ~1100 TFLOP/s achievable, 4 TB/s HBM):

- logits FLOPs 2*H*D*cells = 8.7e12 -> ~7.9 ms at 1100 TFLOP/s (the same as the logits kernel);
- the sample (s = 32, r = 105): 1/32 of that, 2.7e11 FLOPs -> ~0.25 ms, plus its [M, 4096] fp32
  matrix (64 MiB written and read: ~0.03 ms) and a per-row top-105 over 4096 values;
- candidates: C = 5328 per row, ~3.4k filled on average (r*s): 4096 * 3.4k * 8 B = 110 MiB written
  plus the position sort and select over [4096, 5329] (a few 100 MiB of traffic: ~0.1-0.2 ms);
- the unfused path writes 2 GiB of fp32 logits and reads them back in the top-k kernel: 4 GiB of
  HBM traffic, ~1.1 ms at 4 TB/s, plus a top-k over 5.4e8 values (~1-2 ms for a radix select), and
  needs the 2 GiB buffer (or a chunking knob).
Predicted: ~8.5 ms fused vs ~7.9 + 1.1 + 1-2 = 10-11 ms unfused, the difference being the matrix
traffic and the full-width top-k; the filter's epilogue (a cumsum and an atomic per tile and row)
must stay hidden under the MMA for this to hold: measure before believing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import torch
import triton
import triton.language as tl

from mqa_core.composed import whole_windows
from mqa_core.selection import select_topk

from ..fp8 import conversions, e4m3fn_to_e4m3fnuz
from .mqa_logits_triton import (
    TritonConfig,
    _d_pad,
    _device_facts,
    _interpreting,
    _k_descriptor,
    _on_device,
    _tma_usable,
    constexprs,
    default_config,
    fp8_mqa_logits_triton,
)
from .row_steps import (
    BOOK_BLOCK,
    FINISH_TOPK,
    TAU_COLS,
    TIES_BLOCK,
    book_kernel,
    finish_kernel,
    finish_warps,
    table_kernel,
    tau_kernel,
    tau_warps,
    ties_kernel,
)
from .topk_triton import _rebound

__all__ = ["SELECT_BYTES_PER_CELL", "SORT_SCRATCH", "Select", "Tuning", "Workspace", "filter_constexprs",
           "filter_kernel", "fp8_mqa_topk_triton", "plan", "sample_plan", "select_topk_torch", "tuning"]

#: Bytes per input cell ``select_topk_torch`` allocates beyond its input (an int64 key, one int64
#: temporary, masks) and what torch.topk needs internally; a plugged-in ``select`` is held to it.
SELECT_BYTES_PER_CELL = 24
#: torch.sort / torch.topk scratch, as a multiple of the bytes they return. 3: an H100 measured the
#: candidates' int32 sort (``torch.sort(pos, dim=1)``, 72 rows x 5328) at 44 bytes a cell in six
#: allocations, 12 of them returned (``h200_indexer.py --memory triton``); with 1.0 the kit's 16 MiB
#: case peaked at 19.1 MiB.
SORT_SCRATCH = 3.0
#: Per-row bookkeeping: windows, tau, counters, row lists, kernel windows (a generous bound).
_ROW_BYTES = 64
#: The share of ``workspace_bytes`` the plan leaves unplanned, for what the byte counts above miss
#: (the caching allocator's rounding, torch.topk's internal buffers): planned to the full budget, an
#: H100 measured peaks 5% (M=4096, N=128k) and 9% (M=1024, N=1M) over it.
HEADROOM = 1 / 8



# ---- selection over a given logits matrix (the default ``select``) -------------------------------

class Select(Protocol):
    def __call__(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                 positions: str = ..., out: torch.Tensor | None = ..., values: torch.Tensor | None = ...
                 ) -> Any: ...


def select_topk_torch(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                      positions: str = "relative", out: torch.Tensor | None = None,
                      values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact top-k per row of ``logits`` [R, C] inside each row's window, in one step:
    :func:`mqa_core.selection.select_topk` (one unique int64 key per cell, one ``torch.topk``), whose
    temporaries the byte counts above describe."""
    return select_topk(logits, ks, ke, topk, positions=positions, out=out, values=values)


# ---- the filter kernel ------------------------------------------------------------------------

def _mqa_topk_filter_kernel(
    q_ptr, k_ptr, k_desc, kscale_ptr, w_ptr, ks_ptr, ke_ptr, tau_ptr, cnt_ptr, pos_ptr, val_ptr,
    M, N, stride_qm, stride_qh, stride_kn, stride_kscale, stride_wm, stride_cm, cap,
    num_splits, tiles_per_split,
    H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
):
    # Prologue and loop body as in mqa_logits_triton._mqa_logits_kernel: the same cell arithmetic.
    pid = tl.program_id(0)
    num_mb = tl.cdiv(M, BLOCK_M)
    split = pid % num_splits
    mb = num_mb - 1 - pid // num_splits
    m0 = mb * BLOCK_M

    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    ks = tl.maximum(tl.load(ks_ptr + offs_m, mask=m_ok, other=0), 0)
    ke = tl.minimum(tl.load(ke_ptr + offs_m, mask=m_ok, other=0), N)
    nonempty = ks < ke
    width = tl.maximum(ke - ks, 0).to(tl.uint32, bitcast=True)
    lo = tl.min(tl.where(nonempty, ks, N), axis=0)
    hi = tl.max(tl.where(nonempty, ke, 0), axis=0)
    # tau = -inf: a dense row (every window cell to slot n - ks, no counter); else append if >= tau.
    tau = tl.load(tau_ptr + offs_m, mask=m_ok, other=float("inf"))
    dense = tau == float("-inf")

    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, tl.cdiv(N, BLOCK_N))
    c_begin = tl.minimum(tl.maximum(t_begin, lo // BLOCK_N), t_end)
    c_end = tl.maximum(tl.minimum(t_end, tl.cdiv(hi, BLOCK_N)), c_begin)

    ROWS: tl.constexpr = BLOCK_M * H_PAD
    offs_r = tl.arange(0, ROWS)
    r_m = m0 + offs_r // H_PAD
    r_h = offs_r % H_PAD
    r_ok = (r_m < M) & (r_h < H)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    q = tl.load(q_ptr + r_m[:, None].to(tl.int64) * stride_qm + r_h[:, None] * stride_qh + offs_d[None, :],
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    q_t = tl.trans(q)
    w = tl.load(w_ptr + r_m.to(tl.int64) * stride_wm + r_h, mask=r_ok, other=0.0)

    offs_n0 = tl.arange(0, BLOCK_N)
    cand_rows = offs_m[None, :].to(tl.int64) * stride_cm
    k_ptrs = (k_ptr + (c_begin * BLOCK_N + offs_n0)[:, None].to(tl.int64) * stride_kn
              + offs_d[None, :])
    for t in range(c_begin, c_end):
        offs_n = t * BLOCK_N + offs_n0
        n_ok = offs_n < N
        if USE_TMA:
            k = k_desc.load([t * BLOCK_N, 0])
        else:
            k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            k_ptrs += BLOCK_N * stride_kn
        s = tl.dot(k, q_t)  # [BLOCK_N, ROWS] fp32
        s = tl.maximum(s, 0.0) * w[None, :]
        logits = tl.sum(tl.reshape(s, (BLOCK_N, BLOCK_M, H_PAD)), axis=2)  # [BLOCK_N, BLOCK_M]
        scale = tl.load(kscale_ptr + offs_n * stride_kscale, mask=n_ok, other=0.0)
        logits = logits * scale[:, None]

        # The epilogue: append (position, value) of the cells that pass, per row.
        rel = (offs_n[:, None] - ks[None, :]).to(tl.uint32, bitcast=True)
        keep = (rel < width[None, :]) & ((logits >= tau[None, :]) | dense[None, :])
        keep_i = keep.to(tl.int32)
        total = tl.sum(keep_i, axis=0)  # [BLOCK_M]
        base = tl.atomic_add(cnt_ptr + offs_m, total, mask=m_ok & (total > 0) & (dense == 0), sem="relaxed")
        slot = tl.where(dense[None, :], rel.to(tl.int32, bitcast=True), base[None, :] + tl.cumsum(keep_i, axis=0) - 1)
        ok = keep & (slot < cap)
        dst = cand_rows + slot
        tl.store(pos_ptr + dst, offs_n[:, None] + tl.zeros((BLOCK_N, BLOCK_M), tl.int32), mask=ok)
        tl.store(val_ptr + dst, logits, mask=ok)


_jit_cache: dict[bool, Any] = {}


def _jitted(interpret: bool) -> Any:
    """The filter kernel jitted for one mode (see mqa_logits_triton._jitted)."""
    if interpret not in _jit_cache:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = interpret
            _jit_cache[interpret] = triton.jit(
                _mqa_topk_filter_kernel, do_not_specialize=["M", "N", "cap", "num_splits", "tiles_per_split"])
    return _jit_cache[interpret]


def filter_kernel(interpret: bool | None = None) -> Any:
    """The jitted filter kernel for ``interpret`` (default: what TRITON_INTERPRET says now)."""
    return _jitted(bool(triton.knobs.runtime.interpret) if interpret is None else interpret)


def filter_constexprs(cfg: TritonConfig, h: int, d: int, tma: bool = False) -> dict[str, Any]:
    """The filter kernel's compile-time arguments: the logits kernel's, less CLEAN."""
    consts = constexprs(cfg, h, d, True, tma=tma)
    del consts["CLEAN"]
    return consts


# ---- the slice filter: candidates from logits a logits kernel wrote (``filter="slices"``) ------------

#: Columns of a logits slice per slice-filter program, and per step of its loop. A step ends in one
#: atomic on the row's counter, whose result the step's stores wait for: the warp's loads ahead cover
#: the wait only as far as they reach. At 128 keys (one 16-byte load a lane, 64 registers) an H100
#: streamed the logits at 1.5-2.3 TB/s, about what 32 one-warp programs an SM (the block limit) moving
#: 512 bytes a round trip of that atomic give. At 256 (two loads a lane, 72 registers: 28 programs an
#: SM; 7% fewer instructions a key) the filter took 0.95 ms against 1.07 at 4k x 128k and 1.75 against
#: 1.84 at 1M (H100, 2026-12-08, kernel totals of one call): less than the 1.4x predicted, so the
#: atomic is not all of the wait. ``Tuning.slice_block`` sets another step.
SLICE_SEG = 4096
SLICE_BLOCK = 256
#: On AMD's 64-lane waves: 4 keys a lane, one 16-byte load (never measured on AMD hardware).
SLICE_BLOCK_AMD = 256
#: Whole steps whose loads are in flight while one is appended (1 or 2).
SLICE_AHEAD = 2
#: Slices start and grow in multiples of this many keys (k and k_scale slices stay 16-byte aligned).
SLICE_ALIGN = 256


def _slice_append(v, offs, ok, tau, dense, a, m, cnt_ptr, pos_ptr, val_ptr, crow, cap, c0, MASKED: tl.constexpr):
    """Append the cells of one step, a [R, 4] tile (``ok``: in the window, where MASKED), that reach
    ``tau``: a lane holds one row of 4 consecutive keys, so the prefix sum is 3 adds in the lane and
    one warp scan over the row totals (see the kernel)."""
    keep = (v >= tau) | dense
    if MASKED:
        keep = keep & ok
    ki = keep.to(tl.int32)
    rtot = tl.sum(ki, 1)
    incl = tl.cumsum(rtot, 0)
    total = tl.sum(rtot, 0)
    base = tl.atomic_add(cnt_ptr + m, total, mask=(total > 0) & (tau != float("-inf")), sem="relaxed")
    slot = tl.where(dense, offs - a, base + (incl - rtot)[:, None] + tl.cumsum(ki, 1) - 1)
    put = keep & (slot < cap)
    tl.store(pos_ptr + crow + slot, offs + c0, mask=put)
    tl.store(val_ptr + crow + slot, v, mask=put)


def _slice_filter_kernel(x_ptr, stride_xm, ks_ptr, ke_ptr, tau_ptr, cnt_ptr, pos_ptr, val_ptr, stride_cm, cap, c0,
                         ncols, SEG: tl.constexpr, BLOCK: tl.constexpr, AHEAD: tl.constexpr):
    """Program (m, j) appends the cells of columns ``[j*SEG, (j+1)*SEG)`` of row m of ``x`` (the logits
    of keys ``[c0, c0 + ncols)``) that lie in the row's window ``[ks, ke)`` (slice columns, ``ks`` the
    window start less c0) and reach ``tau[m]``, as the filter kernel's epilogue does: to slot
    ``col - ks`` for a dense row (tau = -inf), else to the row's counter (one atomic a step).

    One warp a program, a step of BLOCK keys a [BLOCK / 4, 4] tile: a lane holds BLOCK / 128 rows of
    4 keys (NVIDIA's 32 lanes: two at the default 256), so the step's scans and total are warp
    shuffles with no shared memory (only the atomic's result is broadcast through it), and programs
    keep their loads in flight instead of waiting on each other's barriers (the radix select's
    filter, 8 warps a program, streams at a third of HBM's rate). Steps are aligned to BLOCK
    columns; the steps wholly inside the window load unmasked, 16 bytes a lane a row, AHEAD steps
    ahead, and only a partial first and last step are masked."""
    m = tl.program_id(0)
    j = tl.program_id(1)
    a = tl.load(ks_ptr + m)
    b = tl.load(ke_ptr + m)
    tau = tl.load(tau_ptr + m)
    dense = tau == float("-inf")
    beg = tl.maximum(a, j * SEG)
    end = tl.minimum(tl.minimum(b, ncols), (j + 1) * SEG)
    row = x_ptr + tl.cast(m, tl.int64) * stride_xm
    crow = tl.cast(m, tl.int64) * stride_cm
    step = tl.arange(0, BLOCK // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
    first = tl.cdiv(beg, BLOCK) * BLOCK  # the first whole step
    last = end // BLOCK * BLOCK  # where the whole steps end
    if beg < tl.minimum(first, end):  # a partial first step (or the window inside one step)
        offs = beg // BLOCK * BLOCK + step
        ok = (offs >= beg) & (offs < end)
        _slice_append(tl.load(row + offs, mask=ok, other=0.0), offs, ok, tau, dense, a, m, cnt_ptr, pos_ptr, val_ptr,
                      crow, cap, c0, True)
    # each whole step's load is issued AHEAD steps ahead (a uniform mask keeps it 16 bytes wide)
    v = tl.load(row + first + step, mask=first < last, other=0.0)
    if AHEAD == 2:
        v2 = tl.load(row + first + BLOCK + step, mask=first + BLOCK < last, other=0.0)
    for i in range(first, last, BLOCK):
        offs = tl.multiple_of(i, BLOCK) + step
        nxt = tl.load(row + offs + AHEAD * BLOCK, mask=i + AHEAD * BLOCK < last, other=0.0)
        _slice_append(v, offs, None, tau, dense, a, m, cnt_ptr, pos_ptr, val_ptr, crow, cap, c0, False)
        if AHEAD == 2:
            v = v2
            v2 = nxt
        else:
            v = nxt
    if (last >= first) & (last < end):  # a partial last step
        offs = last + step
        ok = offs < end
        _slice_append(tl.load(row + offs, mask=ok, other=0.0), offs, ok, tau, dense, a, m, cnt_ptr, pos_ptr, val_ptr,
                      crow, cap, c0, True)


@functools.lru_cache(maxsize=2)
def slice_filter_kernel(interpret: bool | None = None) -> Any:
    """The jitted slice filter kernel for ``interpret`` (default: what TRITON_INTERPRET says now),
    calling its helper jitted for the same mode (``topk_triton._jitted`` says why)."""
    if interpret is None:
        return slice_filter_kernel(bool(triton.knobs.runtime.interpret))
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        glb = dict(_slice_filter_kernel.__globals__)
        glb["_slice_append"] = triton.jit(_rebound(_slice_append, glb))
        return triton.jit(_rebound(_slice_filter_kernel, glb), do_not_specialize=["cap", "c0", "ncols"])


# ---- workspace: every temporary through one allocator -------------------------------------------

class Workspace:
    """Allocates the temporaries and counts their live bytes (and declared scratch); ``peak`` is the
    most ever live. With ``poison`` every buffer starts as garbage (NaN, -7), so a cell read before
    it is written shows."""

    def __init__(self, device: torch.device, poison: bool = False) -> None:
        self.device = device
        self.poison = poison
        self.live = 0
        self.peak = 0

    def _count(self, t: torch.Tensor) -> torch.Tensor:
        nbytes = t.untyped_storage().nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._release, nbytes)
        return t

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def empty(self, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=self.device)
        if self.poison:
            t.fill_(float("nan") if dtype.is_floating_point else -7)
        return self._count(t)

    def adopt(self, t: torch.Tensor) -> torch.Tensor:
        """Count a tensor something else allocated (a sort's result, the sample's logits)."""
        return self._count(t)

    @contextlib.contextmanager
    def scratch(self, nbytes: int) -> Iterator[None]:
        """Declared temporaries of a torch call (sort, topk, select) while it runs."""
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        try:
            yield
        finally:
            self.live -= nbytes


# ---- planning -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tuning:
    """Test hooks: fix the sample stride, rank or capacity, or the kernel config (None: the rule)."""

    stride: int | None = None
    rank: int | None = None
    capacity: int | None = None
    config: TritonConfig | None = None
    #: Rescoring piece width cap (None: as wide as the workspace allows).
    piece: int | None = None
    poison: bool = False
    #: ``filter="slices"``: the widest logits slice, keys (None: what the workspace leaves).
    slice: int | None = None
    #: ``filter="slices"``: keys a slice filter step takes, a power of two >= 16 (None: the target's
    #: :data:`SLICE_BLOCK`); a launch knob, never a result.
    slice_block: int | None = None
    #: Called with the call's Workspace when it finishes (tests read its peak).
    report: Callable[[Workspace, dict[str, Any]], None] | None = None
    #: Run the per-row steps around the candidates as torch calls (the way rows too wide for
    #: ``row_steps``' kernels go) instead of those kernels; tests compare the two.
    glue: bool = False


_TUNING = Tuning()


@contextlib.contextmanager
def tuning(**kw: Any) -> Iterator[None]:
    """``with tuning(stride=4, rank=2): ...`` overrides the planning rule (tests force each path)."""
    global _TUNING
    before = _TUNING
    _TUNING = dataclasses.replace(before, **kw)
    try:
        yield
    finally:
        _TUNING = before


def sample_plan(topk: int, w_max: int, tun: Tuning | None = None) -> tuple[int, int, int]:
    """(stride s, rank r, capacity C) for rows of width up to ``w_max``; s == 0: no sample (every row
    with W > topk is dense, C = w_max)."""
    tun = tun or _TUNING
    ratio = w_max / max(topk, 1)
    if tun.stride is not None:
        s = tun.stride
    else:
        s = 1 << int(math.floor(math.log2(max(4 * math.sqrt(ratio), 1))))
        s = min(s, 128)
    if s < 8 and tun.stride is None:
        return 0, 0, max(w_max, topk)
    t = topk / s
    a, b = 4.0, 6.0
    r = tun.rank if tun.rank is not None else math.ceil(((a + math.sqrt(a * a + 4 * t)) / 2) ** 2)
    cap = tun.capacity if tun.capacity is not None else -(-int(math.ceil(r * s + b * s * math.sqrt(r))) // 16) * 16
    cap = max(cap, topk)
    if cap >= w_max and tun.stride is None:
        return 0, 0, max(w_max, topk)
    return s, r, cap


def _round16(x: int) -> int:
    return -(-x // 16) * 16


def _sort_bytes(cells: int, elem: int) -> int:
    """A sort of ``cells`` elements of ``elem`` bytes returning values and int64 indices, plus scratch."""
    return int(cells * (elem + 8) * (1 + SORT_SCRATCH))


def plan(m: int, n: int, h: int, d: int, topk: int, w_max: int, workspace_bytes: int,
         tun: Tuning | None = None) -> dict[str, int]:
    """Chunk sizes and per-row byte counts for a call (see the module docstring, *Memory*)."""
    s, r, cap = sample_plan(topk, w_max, tun)
    ns = _round16(-(-n // s)) if s else 0
    sample_row = (4 * ns + ns + _sort_bytes(r, 4) + 4 * r + _sort_bytes(ns, 4) // 8) if s else 0
    # Candidate stage, the larger of its moments: pos + val + the select (with its outputs), then
    # the winners' position sort (outputs and scratch).
    cand_row = 8 * cap + 8 * topk + max(SELECT_BYTES_PER_CELL * cap, 8 * topk + _sort_bytes(topk, 4))
    per_row = max(sample_row, cand_row) + _ROW_BYTES
    return {"stride": s, "rank": r, "capacity": cap, "sample_cols": ns, "sample_row_bytes": sample_row,
            "candidate_row_bytes": cand_row, "row_bytes": per_row,
            "rows": max(0, min(m, workspace_bytes // per_row)) if m else 0}


def _rescore_plan(rows: int, w_max: int, topk: int, h: int, d: int, budget: int,
                  tun: Tuning | None = None) -> tuple[int, int]:
    """(piece width P, rows per rescoring chunk) so that (topk + P)-cell merge buffers fit."""
    tun = tun or _TUNING
    fixed = h * d + 4 * h + _ROW_BYTES + 32 * topk  # gathered q, w; windows; select's outputs
    per_cell = 8 + SELECT_BYTES_PER_CELL
    p_max = (budget - fixed) // per_cell - topk
    if p_max < 1:
        raise ValueError(f"fp8_mqa_topk_triton: workspace_bytes={budget} cannot hold one row's rescoring "
                         f"({fixed + per_cell * (topk + 1)} bytes for topk={topk}, H={h}, D={d})")
    p = min(w_max, p_max, 1 << 20)
    if tun.piece is not None:
        p = min(p, tun.piece)
    p = max(p, 1)
    per_row = fixed + per_cell * (topk + p)
    return p, max(1, min(rows, budget // per_row))


# ---- the launcher -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Launch:
    arch: str
    programs: int
    cfg: TritonConfig
    tma: bool
    consts: dict[str, Any]
    interpret: bool
    index: int
    #: Whose kernels score: "triton" (the filter kernel above, on any arch) or "gluon" (the sm_90
    #: Gluon logits kernel for the sample, its candidate epilogue for the filter).
    scorer: str = "triton"
    #: How candidates are found: "epilogue" (the scorer's filter kernel, logits never stored) or
    #: "slices" (the scorer's logits kernel over key slices that fit the workspace, each slice then
    #: filtered by :func:`_slice_filter_kernel`).
    filter: str = "epilogue"
    #: The call's workspace budget (bytes): a logits slice takes what the workspace has left.
    budget: int = 0
    #: :attr:`Tuning.glue`: the per-row steps as torch calls, whatever the shape.
    glue: bool = False

    def launching(self) -> contextlib.AbstractContextManager[Any]:
        """Where this call's kernels launch: the interpreter, or the call's device."""
        return _interpreting() if self.interpret else _on_device(self.index)


def _launch_filter(lp: _Launch, ws: Workspace, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
                   w: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, tau: torch.Tensor, cnt: torch.Tensor,
                   pos: torch.Tensor, val: torch.Tensor, cap: int, span: tuple[int, int]) -> None:
    """The candidates of rows [0, len(ks)) (windows clamped to [0, N)) into ``pos``/``val`` (rows of
    stride ``pos.stride(0)``), counted in ``cnt``; ``span``: the keys their windows cover, on the host."""
    m, n = ks.shape[0], k.shape[0]
    if m == 0 or n == 0 or span[0] >= span[1]:
        return
    assert pos.stride() == val.stride() and pos.stride(1) == 1
    if lp.filter == "slices":
        _launch_slices(lp, ws, q, k, k_scale, w, ks, ke, tau, cnt, pos, val, cap, span)
        return
    if lp.scorer == "gluon":
        from .mqa_logits_gluon_sm90 import fp8_mqa_filter_gluon

        fp8_mqa_filter_gluon(q, k, k_scale, w, ks, ke, tau, cnt, pos, val, cap)
        return
    cfg = lp.cfg
    num_mb = -(-m // cfg.block_m)
    num_tiles = -(-n // cfg.block_n)
    splits = max(1, min(num_tiles, -(-lp.programs // num_mb)))
    tiles_per_split = -(-num_tiles // splits)
    splits = -(-num_tiles // tiles_per_split)
    k_desc = _k_descriptor(k, cfg, lp.arch) if lp.tma else None
    with lp.launching():
        filter_kernel(lp.interpret)[(num_mb * splits,)](
            q, k, k_desc, k_scale, w, ks, ke, tau, cnt, pos, val,
            m, n, q.stride(0), q.stride(1), k.stride(0), k_scale.stride(0), w.stride(0), pos.stride(0), cap,
            splits, tiles_per_split, **lp.consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _launch_slices(lp: _Launch, ws: Workspace, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
                   w: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, tau: torch.Tensor, cnt: torch.Tensor,
                   pos: torch.Tensor, val: torch.Tensor, cap: int, span: tuple[int, int]) -> None:
    """``filter="slices"``: the scorer's logits kernel over keys ``[c0, c0 + S)`` for each slice of
    ``span`` (S: what the workspace has left, in steps of :data:`SLICE_ALIGN` keys, or of 16 where
    less is left, so slices of k and k_scale start 16-byte aligned), each slice
    filtered before the next is scored. The values are the logits kernel's own, which the sample
    and every rescoring read too, so a cell has one value whatever path its row takes."""
    m = ks.shape[0]
    n = k.shape[0]
    room = lp.budget - ws.live
    width = room // (4 * m)
    width = width // SLICE_ALIGN * SLICE_ALIGN if width >= SLICE_ALIGN else max(16, width // 16 * 16)
    if _TUNING.slice is not None:
        width = min(width, _TUNING.slice)
    first = span[0] // SLICE_ALIGN * SLICE_ALIGN
    starts = list(range(first, span[1], width))
    # every slice's windows in its own columns, made in one step (two small kernels, not two a slice);
    # the starts made on the device: a copy from pageable host memory would sync the stream
    c0s = torch.arange(first, first + len(starts) * width, width, dtype=torch.int32, device=q.device)
    shifted = ws.adopt(torch.stack((ks[None, :] - c0s[:, None], ke[None, :] - c0s[:, None])))  # [2, slices, m]
    kernel = slice_filter_kernel(lp.interpret)
    for i, c0 in enumerate(starts):
        c1 = min(c0 + width, n)
        a, b = shifted[0, i], shifted[1, i]
        x = ws.adopt(_logits(lp, q, k[c0:c1], k_scale[c0:c1], w, a, b, clean=False))
        with lp.launching():
            kernel[(m, -(-(c1 - c0) // SLICE_SEG))](
                x, x.stride(0), a, b, tau, cnt, pos, val, pos.stride(0), cap, c0, c1 - c0,
                SEG=SLICE_SEG, BLOCK=_slice_block(lp.arch), AHEAD=SLICE_AHEAD, num_warps=1)
        del x


def _slice_block(arch: str) -> int:
    """Keys a slice filter step takes on the target (the interpreter: as NVIDIA); ``Tuning.slice_block``
    overrides it (a benchmark's A/B, tests)."""
    if _TUNING.slice_block is not None:
        return _TUNING.slice_block
    return SLICE_BLOCK_AMD if arch.startswith("gfx") else SLICE_BLOCK


def _logits(lp: _Launch, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor,
            ks: torch.Tensor, ke: torch.Tensor, clean: bool = True) -> torch.Tensor:
    """The logits over ``k`` (the sampled keys ``k[::s]``, or a slice), by the scorer's logits kernel."""
    if lp.scorer == "gluon":
        from .mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon

        return fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, clean)
    return fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, clean, config=lp.cfg)


def _check(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
           ke: torch.Tensor, topk: int, positions: str) -> None:
    problems = []
    if q.dim() != 3 or k.dim() != 2 or q.shape[2] != k.shape[1]:
        problems.append(f"q must be [M, H, D] and k [N, D]; got {tuple(q.shape)} and {tuple(k.shape)}")
    elif weights.shape != q.shape[:2]:
        problems.append(f"weights must be [M, H] = {tuple(q.shape[:2])}; got {tuple(weights.shape)}")
    if k_scale.numel() != k.shape[0]:
        problems.append(f"k_scale must hold N = {k.shape[0]} scales; got {tuple(k_scale.shape)}")
    if ks.shape != (q.shape[0],) or ke.shape != (q.shape[0],):
        problems.append(f"ks/ke must be [M]; got {tuple(ks.shape)}, {tuple(ke.shape)}")
    if topk < 1:
        problems.append(f"topk must be >= 1; got {topk}")
    if positions not in ("relative", "absolute"):
        problems.append(f"positions must be 'relative' or 'absolute'; got {positions!r}")
    if problems:
        raise ValueError("fp8_mqa_topk_triton: " + "; ".join(problems))


def fp8_mqa_topk_triton(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                        ks: torch.Tensor, ke: torch.Tensor, topk: int, *, positions: str = "relative",
                        return_values: bool = False, workspace_bytes: int = 256 << 20,
                        select: Select | None = None, scorer: str = "triton", filter: str = "epilogue"
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The positions (int32 [M, topk]) of the ``topk`` largest logits in each row's window
    [max(ks, 0), min(ke, N)), ascending, -1 padded; with ``return_values`` also their fp32 values
    (-inf padding). ``positions``: "relative" (n - lo) or "absolute" (n). Ties go to the smaller
    position. Inputs as for ``fp8_mqa_logits`` (DESIGN.md). ``select`` is any exact top-k per row
    over a logits matrix with :func:`select_topk_torch`'s contract (the default). Every temporary
    fits ``workspace_bytes`` (module docstring, *Memory*). Syncs twice: the windows, then the counts.
    ``scorer="gluon"`` scores with the sm_90 Gluon kernels (``mqa_logits_gluon_sm90``: its logits
    for the sample, ``fp8_mqa_filter_gluon`` for the candidates), the rest unchanged.
    ``filter="slices"`` takes the candidates from the scorer's logits kernel in key slices, each
    filtered by :func:`_slice_filter_kernel` (module docstring, step 3), instead of its epilogue.
    """
    _check(q, k, k_scale, weights, ks, ke, topk, positions)
    if scorer not in ("triton", "gluon"):
        raise ValueError(f"fp8_mqa_topk_triton: scorer must be 'triton' or 'gluon'; got {scorer!r}")
    if filter not in ("epilogue", "slices"):
        raise ValueError(f"fp8_mqa_topk_triton: filter must be 'epilogue' or 'slices'; got {filter!r}")
    sel: Select = select or select_topk_torch
    tun = _TUNING
    interpret = bool(triton.knobs.runtime.interpret)
    m, h, d = q.shape
    n = k.shape[0]
    dev = q.device
    index = q.get_device()
    arch, programs = _device_facts(index)
    if arch == "cpu" and not interpret:
        raise RuntimeError(f"fp8_mqa_topk_triton got tensors on {dev}: CPU tensors run only under the "
                           "Triton interpreter (set TRITON_INTERPRET=1)")
    ws = Workspace(dev, poison=tun.poison)
    out = torch.empty((m, topk), dtype=torch.int32, device=dev)
    vals = torch.empty((m, topk), dtype=torch.float32, device=dev) if return_values else None
    if tun.poison:
        out.fill_(-7)
        if vals is not None:
            vals.fill_(float("nan"))
    if m == 0:
        return out, vals

    # Operands in the kernel's format (each touched only where needed; copies are workspace).
    k_scale = k_scale.reshape(-1)
    convert_q, convert_k = conversions(arch, q.dtype, k.dtype)
    if convert_q:
        q, weights = e4m3fn_to_e4m3fnuz(q, weights)
        ws.adopt(q), ws.adopt(weights)
    if convert_k:
        k, k_scale = e4m3fn_to_e4m3fnuz(k, k_scale)
        ws.adopt(k), ws.adopt(k_scale)
    if q.stride(2) != 1:
        q = ws.adopt(q.contiguous())
    if k.stride(1) != 1:
        k = ws.adopt(k.contiguous())
    if k_scale.dtype != torch.float32:
        k_scale = ws.adopt(k_scale.float())
    if weights.dtype != torch.float32 or weights.stride(1) != 1:
        weights = ws.adopt(weights.float().contiguous())
    # every row's candidate count, kept across chunks: the misjudged rows are found with one sync
    # after the last chunk is enqueued, not one per chunk (the GPU would wait on the host each time)
    # (and, in row 1, which rows had their ties at the k-th value resolved on the device)
    counts = ws.empty(2, m, dtype=torch.int32)
    counts[1].zero_()
    budget = int(workspace_bytes * (1 - HEADROOM)) - ws.live
    cfg = tun.config or default_config(arch, h)
    tma = cfg.tma and _tma_usable(arch, d, k.data_ptr(), k.stride())
    lp = _Launch(arch, programs, cfg, tma, filter_constexprs(cfg, h, d, tma), interpret, index, scorer, filter,
                 budget, tun.glue)

    # Windows on the host (one sync, one copy): widths decide each row's path. numpy, not torch: the
    # host's arithmetic here is on the GPU's critical path (nothing is enqueued yet), and a torch op
    # on a CPU tensor costs 3-10 us of dispatch where numpy's costs 1-2.
    wins = torch.stack((ks, ke.to(ks.dtype))).cpu().numpy().astype(np.int64)
    lo_h = np.minimum(np.maximum(wins[0], 0), n)
    hi_h = np.maximum(np.minimum(wins[1], n), lo_h)
    w_h = hi_h - lo_h
    w_max = int(w_h.max())
    p = plan(m, n, h, d, topk, w_max, budget, tun)
    if p["rows"] < 1:
        raise ValueError(f"fp8_mqa_topk_triton: workspace_bytes={workspace_bytes} cannot hold one row "
                         f"({p['row_bytes']} bytes; topk={topk}, N={n})")
    s, r, cap = p["stride"], p["rank"], p["capacity"]
    ctx: dict[str, Any] = {"plan": p, "fallback_rows": 0, "undercount_rows": 0, "overflow_rows": 0, "sampled_rows": 0,
                           "dense_rows": 0, "chunks": 0}
    small = w_h <= topk  # all of the window
    if not return_values and small.all():
        # every row is its whole window (a packed batch of requests no longer than topk): one fill,
        # no chunk (the chunk loop's host work cost 3.7 ms for 16k such rows on an H100)
        whole_windows(out, ks, ke, n, positions)
        if tun.report is not None:
            tun.report(ws, ctx)
        return out, vals
    # Every row's path and windows: the same decisions on the host (masks, for the chunks' host
    # choices) and on the device (a chunk's table, which its kernels read, made by one kernel: built
    # on the host and copied over, it kept an H100 idle 1.0-1.2 ms at 4k rows).
    sampled = (w_h > cap) & (s > 0)  # a threshold from the sample
    scored = ~small | return_values  # the filter kernel runs on it (tau = -inf unless sampled)
    ks_d, ke_d = ks.contiguous(), ke.contiguous()  # the table kernel reads a chunk's windows as one run
    # the sampled keys' scales in one run, made once a call: a strided view made the Gluon logits
    # launcher copy them for every chunk (a kernel, and host work before the chunk's first long kernel)
    sample_k = (k[::s], ws.adopt(k_scale[::s].contiguous())) if s and sampled.any() else None
    step = -(-m // -(-m // p["rows"]))  # as many chunks as the plan needs, of equal size (no small tail)
    for m0 in range(0, m, step):
        m1 = min(m, m0 + step)
        ctx["chunks"] += 1
        part = scored[m0:m1]
        span = (int(np.where(part, lo_h[m0:m1], n).min()), int(np.where(part, hi_h[m0:m1], 0).max())) \
            if part.any() else (0, 0)
        table = ws.empty(8, m1 - m0, dtype=torch.int32)
        with lp.launching():
            table_kernel(lp.interpret)[(-(-(m1 - m0) // BOOK_BLOCK),)](
                ks_d[m0:], ke_d[m0:], table, table.stride(0), m1 - m0, n, topk, cap, s,
                SCORE_ALL=return_values, BLOCK=BOOK_BLOCK)
        rows = _Rows(table, sampled[m0:m1], part, span)
        _chunk(lp, ws, sel, q[m0:m1], k, k_scale, weights[m0:m1], rows, topk, sample_k, r, cap, positions,
               out[m0:m1], None if vals is None else vals[m0:m1], counts[:, m0:m1])
        del rows, table

    # The one sync after the windows': the counts say which rows the sample misjudged.
    count, fixed = counts.cpu().numpy().astype(np.int64)
    del counts, sample_k
    bad = sampled & ((count < topk) | (count > cap))
    if tun.report is not None:  # the path counts, for tests and profiles only (host work after the GPU's)
        ctx["fallback_rows"] = int(bad.sum())
        ctx["tie_rows"] = int((sampled & (fixed == 1)).sum())
        ctx["undercount_rows"] = int((sampled & (count < topk)).sum())
        ctx["overflow_rows"] = int((sampled & (count > cap)).sum())
        ctx["sampled_rows"] = int(sampled.sum())
        ctx["dense_rows"] = int((~small & ~sampled).sum())
    if bad.any():
        _rescore(lp, ws, sel, q, k, k_scale, weights, torch.from_numpy(np.flatnonzero(bad)), torch.from_numpy(lo_h),
                 torch.from_numpy(hi_h), topk, positions, out, vals, budget - ws.live)
    if tun.report is not None:
        tun.report(ws, ctx)
    return out, vals


@dataclasses.dataclass(frozen=True)
class _Rows:
    """A chunk's rows: on the device (int32 rows of ``table``: window start and end, the filter's
    windows, the sample's windows, sampled, scored) and, for host-side decisions, the two masks and
    the keys the filter's windows span."""

    table: torch.Tensor
    sampled: np.ndarray
    scored: np.ndarray
    span: tuple[int, int]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.table[i]


def _chunk(lp: _Launch, ws: Workspace, sel: Select, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
           w: torch.Tensor, rows: _Rows, topk: int, sample_k: tuple[torch.Tensor, torch.Tensor] | None, r: int,
           cap: int, positions: str, out: torch.Tensor, vals: torch.Tensor | None, counts: torch.Tensor) -> None:
    """Steps 1-4 of the module docstring for one chunk of rows, with no host sync: each sampled row's
    candidate count goes to ``counts[0]``, and ``counts[1]`` marks the rows whose ties at the k-th
    value the tie rule (``row_steps._resolve_ties``) resolved; a misjudged row's result here is not
    kept, and the caller rescores it (step 5) once every chunk is enqueued."""
    mc = q.shape[0]
    n = k.shape[0]
    sampled, scored = rows.sampled, rows.scored
    lo_d = rows[0]

    # 1. Rows of width <= topk: arange (values, if asked, from the kernel below). Every row gets it
    #    here where some row is not scored; the scored ones are overwritten below (or rescored).
    if not scored.all():
        with ws.scratch(mc * topk + 16 * mc):
            whole_windows(out, lo_d, rows[1], n, positions)
        if not scored.any():
            return

    # 2. Thresholds: -inf (dense) unless sampled; the r-th largest sample value by one kernel
    #    (:func:`row_steps._tau_kernel`) where the sample row fits it.
    tau = ws.empty(mc, dtype=torch.float32)
    if sampled.any():
        assert sample_k is not None
        sample = ws.adopt(_logits(lp, q, sample_k[0], sample_k[1], w, rows[4], rows[5]))
        ns = sample.shape[1]
        if lp.glue or ns > TAU_COLS:
            nan = ws.adopt(torch.isnan(sample))
            sample.masked_fill_(nan, float("-inf"))
            del nan
            with ws.scratch(_sort_bytes(r, 4) + _sort_bytes(ns, 4) // 8):
                th = torch.topk(sample, r, dim=1, sorted=False).values.amin(dim=1)
            tau.copy_(torch.where(rows[6].bool(), th, float("-inf")))
            del th
        else:
            with lp.launching():
                tau_kernel(lp.interpret)[(mc,)](sample, sample.stride(0), rows[6], tau, ns, r,
                                                BLOCK=triton.next_power_of_2(ns), num_warps=tau_warps(ns))
        del sample
    else:
        tau.fill_(float("-inf"))

    # 3. The filter kernel: candidates of every scored row.
    cnt = ws.empty(mc, dtype=torch.int32)
    cnt.zero_()
    pos = ws.empty(mc, cap, dtype=torch.int32)
    val = ws.empty(mc, cap, dtype=torch.float32)
    _launch_filter(lp, ws, q, k, k_scale, w, rows[2], rows[3], tau, cnt, pos, val, cap, rows.span)

    # Which sampled rows the sample misjudged, on the device (their results here are not kept), and
    # each row's candidates for the select: ``win`` rows (0, nvalid, keep, tie rule applies).
    win = ws.empty(4, mc, dtype=torch.int32)
    with lp.launching():
        book_kernel(lp.interpret)[(-(-mc // BOOK_BLOCK),)](cnt, rows.table, rows.table.stride(0), counts[0], win,
                                                           win.stride(0), mc, topk, cap, BLOCK=BOOK_BLOCK)
    del cnt

    # 4. Exact selection over the candidates as they lie (in slot order, which the atomics made
    #    arbitrary for sampled rows), then only the winners sorted by position. The slot order breaks
    #    ties at the k-th value, so a sampled row whose candidates hold more cells equal to it than
    #    were taken gets the smallest positions among them (``row_steps._resolve_ties``). Dense
    #    rows' slots are their positions already. One kernel finishes a row where topk fits it.
    idx = ws.empty(mc, topk, dtype=torch.int32)
    v = ws.empty(mc, topk, dtype=torch.float32)
    with ws.scratch(SELECT_BYTES_PER_CELL * mc * cap):
        sel(val, win[0], win[1], topk, positions="relative", out=idx, values=v)
    if not lp.glue and topk <= FINISH_TOPK:
        with lp.launching():
            finish_kernel(lp.interpret)[(mc,)](
                idx, v, pos, val, win, win.stride(0), lo_d, out, out.stride(0), v if vals is None else vals,
                0 if vals is None else vals.stride(0), counts[1], pos.stride(0), idx.stride(0), topk, n,
                CBLOCK=TIES_BLOCK, TBLOCK=TIES_BLOCK, LOG2=(topk - 1).bit_length(),
                RELATIVE=positions == "relative", VALUES=vals is not None, num_warps=finish_warps(topk))
        return
    got = pos.gather(1, idx.clamp(min=0).long())
    got.masked_fill_(idx < 0, 2**31 - 1)  # the padding sorts last
    del idx
    if sampled.any():
        with lp.launching():
            ties_kernel(lp.interpret)[(mc,)](pos, val, win[1], win[3], got, v, counts[1], pos.stride(0), v.stride(0),
                                             topk, n, CBLOCK=TIES_BLOCK, TBLOCK=TIES_BLOCK, num_warps=4)
    del pos, val
    with ws.scratch(_sort_bytes(mc * topk, 4)):
        got, order = torch.sort(got, dim=1)
    got = torch.where(got != 2**31 - 1, got - (lo_d[:, None] if positions == "relative" else 0), -1).int()
    g = win[2].bool()[:, None]
    out.copy_(torch.where(g, got, out))
    if vals is not None:
        vals.copy_(torch.where(g, v.gather(1, order), vals))
    del got, order, v


def _rescore(lp: _Launch, ws: Workspace, sel: Select, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
             w: torch.Tensor, rows: torch.Tensor, lo_h: torch.Tensor, hi_h: torch.Tensor, topk: int,
             positions: str, out: torch.Tensor, vals: torch.Tensor | None, budget: int) -> None:
    dev = q.device
    h, d = q.shape[1], q.shape[2]
    w_all = hi_h - lo_h
    piece, per = _rescore_plan(rows.numel(), int(w_all[rows].max()), topk, h, d, budget)
    width = topk + piece
    for i in range(0, rows.numel(), per):
        rr = rows[i:i + per]
        rd = rr.to(dev)
        nr = rr.numel()
        qr = ws.adopt(q.index_select(0, rd))
        wr = ws.adopt(w.index_select(0, rd))
        lo, hi = lo_h[rr], hi_h[rr]
        mval = ws.empty(nr, width, dtype=torch.float32)
        mpos = ws.empty(nr, width, dtype=torch.int32)
        tau = ws.empty(nr, dtype=torch.float32)
        tau.fill_(float("-inf"))
        cnt = ws.empty(nr, dtype=torch.int32)
        held = torch.zeros(nr, dtype=torch.int64)  # valid entries of the best-so-far, right-aligned
        idx = ws.empty(nr, topk, dtype=torch.int32)
        v = ws.empty(nr, topk, dtype=torch.float32)
        got = None
        npieces = int(-(-(hi - lo).max() // piece))
        for j in range(npieces):
            plo = torch.minimum(lo + j * piece, hi)
            phi = torch.minimum(plo + piece, hi)
            pw = phi - plo
            kks = ws.adopt(plo.to(device=dev, dtype=torch.int32))
            kke = ws.adopt(phi.to(device=dev, dtype=torch.int32))
            _launch_filter(lp, ws, qr, k, k_scale, wr, kks, kke, tau, cnt, mpos[:, topk:], mval[:, topk:], piece,
                           (int(plo.min()), int(phi.max())))
            wlo = (topk - held).to(dev)
            whi = (topk + pw).to(dev)
            with ws.scratch(SELECT_BYTES_PER_CELL * nr * width):
                sel(mval, wlo, whi, topk, positions="relative", out=idx, values=v)
            got = mpos.gather(1, (idx.long() + wlo[:, None]).clamp(max=width - 1))
            got = torch.where(idx >= 0, got, -1)
            held = torch.clamp(held + pw, max=topk)
            # The best so far, right-aligned in columns [topk - held, topk): valid ones first in idx.
            hd = held.to(dev)
            src = torch.arange(topk, device=dev)[None, :] - (topk - hd)[:, None]
            ok = src >= 0
            srcc = src.clamp(min=0)
            mpos[:, :topk] = torch.where(ok, got.gather(1, srcc), -1)
            mval[:, :topk] = torch.where(ok, v.gather(1, srcc), float("-inf"))
            del kks, kke
        assert got is not None
        lo_d = lo.to(dev)
        res = torch.where(got >= 0, got - (lo_d[:, None] if positions == "relative" else 0), -1).to(torch.int32)
        out[rd] = res
        if vals is not None:
            vals[rd] = torch.where(got >= 0, v, float("-inf"))
        del qr, wr, mval, mpos, got, res


# ---- ahead-of-time builds (as mqa_provider_gluon.aot does for the logits kernel) ----------------

_AOT_ALIGNED = ("q_ptr", "k_ptr", "kscale_ptr", "w_ptr", "ks_ptr", "ke_ptr", "tau_ptr", "cnt_ptr", "pos_ptr",
                "val_ptr", "stride_qm", "stride_qh", "stride_kn", "stride_wm", "stride_cm")


def compile_filter_for(target: str, *, h: int = 64, d: int = 128, config: TritonConfig | None = None
                       ) -> dict[str, Any]:
    """Build the filter kernel for ``target`` ("sm_90", "gfx942", "gfx950") on this machine, with
    the fp8 flavour the launcher hands it there (e4m3fnuz on gfx942); returns the asm dict plus
    ``"metadata"``, for ``aot.sass_facts`` / ``aot.mfma_formats`` / ``aot.amd_facts``."""
    import inspect

    from triton.compiler import ASTSource

    from .. import aot
    from ..fp8 import wants_fnuz

    tgt = aot._target(target)
    arch = target if target in aot.TARGETS else next(k for k, v in aot.TARGETS.items() if v == tgt)
    cfg = config or default_config(arch, h)
    fp8 = aot.TRITON_FP8["float8_e4m3fnuz" if wants_fnuz(arch) else "float8_e4m3fn"]
    fn = filter_kernel(interpret=False)
    tma = cfg.tma and tgt.backend == "cuda"
    consts: dict[str, Any] = {"stride_kscale": 1, **filter_constexprs(cfg, h, d, tma=tma)}
    if not tma:
        consts["k_desc"] = None
    types = {"q_ptr": f"*{fp8}", "k_ptr": f"*{fp8}", "k_desc": f"tensordesc<{fp8}[{cfg.block_n},{_d_pad(d)}]>",
             "kscale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32", "ke_ptr": "*i32", "tau_ptr": "*fp32",
             "cnt_ptr": "*i32", "pos_ptr": "*i32", "val_ptr": "*fp32"}
    for p in fn.params:
        if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty:
            consts[p.name] = p.default
    signature = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in _AOT_ALIGNED}
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=tgt, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm


def compile_small_kernel_for(target: str, kernel: str = "slices", *, topk: int = 2048,
                             sample_cols: int = 4096) -> dict[str, Any]:
    """Build one of the small kernels for ``target`` ("sm_90", "gfx942", "gfx950") on this machine, as
    the launcher calls it: ``"slices"``, the slice filter (a 16-byte-aligned logits slice of float32,
    one warp); ``"ties"``, the tie rule alone (four warps); or one of ``row_steps``' kernels:
    ``"tau"`` (a sample row of ``sample_cols``), ``"book"``, ``"table"``, ``"finish"`` (``topk`` winners,
    values asked for, relative positions). Returns the asm dict plus ``"metadata"``."""
    from triton.compiler import ASTSource

    from .. import aot

    consts: dict[str, Any]
    if kernel == "slices":
        fn = slice_filter_kernel(interpret=False)
        consts = {"SEG": SLICE_SEG, "BLOCK": _slice_block(target), "AHEAD": SLICE_AHEAD}
        floats, warps = ("x_ptr", "tau_ptr", "val_ptr"), 1
    elif kernel == "ties":
        fn = ties_kernel(interpret=False)
        consts, floats, warps = {"CBLOCK": TIES_BLOCK, "TBLOCK": TIES_BLOCK}, ("val_ptr", "v_ptr"), 4
    elif kernel == "tau":
        fn = tau_kernel(interpret=False)
        consts = {"BLOCK": triton.next_power_of_2(sample_cols)}
        floats, warps = ("x_ptr", "tau_ptr"), tau_warps(sample_cols)
    elif kernel == "book":
        fn, consts, floats, warps = book_kernel(interpret=False), {"BLOCK": BOOK_BLOCK}, (), 4
    elif kernel == "table":
        fn, consts, floats, warps = table_kernel(interpret=False), {"BLOCK": BOOK_BLOCK, "SCORE_ALL": False}, (), 4
    elif kernel == "finish":
        fn = finish_kernel(interpret=False)
        consts = {"CBLOCK": TIES_BLOCK, "TBLOCK": TIES_BLOCK, "LOG2": (topk - 1).bit_length(), "RELATIVE": True,
                  "VALUES": True}
        floats, warps = ("v_ptr", "val_ptr", "vals_ptr"), finish_warps(topk)
    else:
        raise ValueError(f"compile_small_kernel_for: kernel must be 'slices', 'ties', 'tau', 'book', 'table' or "
                         f"'finish'; got {kernel!r}")
    signature = {a: "constexpr" if a in consts else "*fp32" if a in floats else "*i32" if a.endswith("_ptr")
                 else "i32" for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if a.endswith("_ptr") or a.startswith("stride")]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=aot._target(target), options={"num_warps": warps})
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm
