"""Exact, deterministic per-row top-k over given logits in portable Triton (sm_90, gfx942, gfx950).

Selection rule (DESIGN.md, the indexer step): row m keeps the ``topk`` largest logits of its window
``[lo, hi) = [max(ks[m], 0), min(ke[m], N))``; ties go to the smaller position; positions come out
ascending, -1 (value -inf) past the window's size. Floats compare through an order-preserving
uint32 key: -0.0 is made +0.0 first, -inf is an ordinary value, NaN maps to key 0 (below -inf).

Algorithm, per row (one program owns whole rows; a fixed grid of ``min(M, max_programs)`` programs
strides over the rows, so a row's result depends on nothing but its own data and window):

1. **Threshold guess from a sample** (windows longer than the candidate capacity ``CAP``): ``SAMPLE``
   keys in groups of 8 contiguous ones spread evenly over the window; three 8-bit radix-histogram
   passes over the sample (in registers) give a 24-bit key prefix ``t_lo`` that about ``AIM`` of the
   window's keys reach. ``AIM = sqrt(topk * CAP)``, the geometric middle of ``[topk, CAP]``, so an
   estimate off by ``sqrt(CAP / topk)`` either way still fits; ``SAMPLE`` (at most 8192 keys) puts
   enough sample keys above ``AIM`` that the estimate's spread, about ``1 / sqrt(sample keys
   above)``, keeps five standard deviations inside the range, and of the ``CAP`` values where it
   can, the one with the least histogram work is taken (see :func:`plan`).
2. **Filter** (one read of the window): keys >= ``t_lo`` are compacted, in position order
   (``tl.cumsum`` in a block plus a running offset), into this program's workspace: ``CAP``
   positions and ``CAP`` values. If the count lands in ``[K, CAP]`` (K = min(topk, window)) the
   candidates hold every key >= the K-th largest key, so the rest runs on them alone. Otherwise the
   guess was wrong (tie-heavy or adversarial rows) and the rest runs on the whole window: slower,
   just as exact.
   **Few rows** (decode: M below ``TopkConfig.split_target``): a separate filter kernel cuts each
   long window into ``split`` segments, one program each (same sample, same ``t_lo``), and writes
   each segment's candidates and count; the select kernel gathers the lists in segment order (the
   unsplit list, position order kept) and goes on as below. One row then streams through up to
   ``split`` SMs instead of one. ``TopkConfig.separate`` uses the filter kernel for every shape.
3. **Radix select** over the source (candidates or window): four 8-bit histogram passes
   (``tl.histogram``, masked to the prefix found so far) give the K-th largest key ``T`` and
   ``need``, how many keys equal to ``T`` to take. A source of only K keys (a window no longer
   than topk: packed requests, the first rows of a causal prefill) skips them: every key is taken.
4. **Ordered compaction** (one pass over the source): keys > T, and the first ``need`` keys == T, are
   written at their rank in position order (one packed cumsum of (gt, eq) per block), so the output is
   ascending without a sort. Then -1 / -inf fill ``[K, topk)``.

Predicted cost per row of window W and element size E (4 fp32, 2 bf16), CAP as :func:`plan` picks
it, when the guess holds (random-like rows always; tie-heavy rows fall back):
- HBM/L2 reads: ``W*E`` (filter) + ``SAMPLE*E`` (sample, whole 32-byte sectors) + ``5 * c * (E+4)``
  (radix passes and compaction over ``c ~ AIM`` candidates, L2-resident in the workspace);
- writes: ``c * (E+4)`` (workspace) + ``topk * 4`` (+ ``topk * 4`` with values).
  Prefill (W=128k, fp32, topk 2048): 512 KiB + 8 KiB + ~200 KiB (L2) per row, so HBM-bound near one
  read of the logits; the radix passes cost about ``2.5`` warp instructions per histogrammed element
  (Triton's ballot histogram) on ``4c + 2*SAMPLE`` elements.
- Fallback: ``5 * W * E`` read (4 radix passes + compaction over the window) plus the filter's read.

Workspace: ``programs * CAP * (4 + E)`` bytes, plus ``M * split * (CAP * (4 + E) + 4)`` with the
filter kernel (see :func:`workspace_bytes`), none when N <= CAP.
No atomics; no host sync; the grid depends only on (M, N, topk) and the launch knobs.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from .mqa_logits_triton import _interpreting, _on_device

__all__ = ["TopkConfig", "TopkPlan", "compile_for", "kernel", "plan", "topk_per_row_triton", "workspace_bytes"]

_TAIL = 1024  # elements per store when filling [K, topk) with -1
#: The select kernel's register cap on NVIDIA: two 8-warp programs per SM. Uncapped, ptxas gives it
#: about 180 (one program per SM); capped, it keeps a few per-row values in local memory (13-23
#: stores and loads, once a row, never inside a loop over elements: the sm_90 build test checks).
SELECT_MAXNREG = 128


@dataclasses.dataclass(frozen=True)
class TopkConfig:
    """Launch knobs. None of them changes the result, only the speed (and the workspace size)."""

    #: Elements per streamed block: 2048 with 8 warps keeps sm_90 at 128 registers (4096: 255).
    block: int = 2048
    num_warps: int = 8
    #: Programs in the grid at most; each strides over rows ``pid, pid + P, ...`` with its own workspace.
    max_programs: int = 512
    #: Programs the filter aims at when rows are few (decode): a window longer than CAP is cut into
    #: ``split = split_target // M`` segments (at most one per 4 filter blocks), each filtered by its own
    #: program, so a batch of 1-64 long rows streams through many SMs instead of 1-64.
    split_target: int = 256
    #: Filter every long window in the separate filter kernel (80 registers, three programs per SM),
    #: not only split ones: the select kernel then only gathers and selects.
    separate: bool = False
    #: Elements per filter step (both kernels): a thread loads 16 bytes a row of the [filter_block /
    #: VEC, VEC] tile, so 2048 fp32 with 8 warps is two loads a thread, and the next step's two in
    #: flight while one is compacted (H100: 4k x 128k in 1.89 ms against 2.36 with 1024).
    filter_block: int = 2048
    #: The candidate capacity CAP (0: :func:`plan`'s rule); a power of two >= 1024. A CAP below topk,
    #: or too small for the guess's spread, only sends rows to the slow fallback.
    cap: int = 0
    #: Filter blocks loaded ahead of the one being compacted (1 or 2): each is ``filter_block``
    #: elements more in flight per program, and 8 registers a thread more at 2048 fp32 and 8 warps.
    ahead: int = 2

    def __post_init__(self) -> None:
        for k in ("block", "num_warps", "max_programs", "split_target", "filter_block"):
            v = getattr(self, k)
            if v < 1 or (k not in ("max_programs", "split_target") and v & (v - 1)):
                raise ValueError(f"TopkConfig.{k} must be a positive power of two, got {v}")
        if not 256 <= self.block <= 32768:  # the compaction packs two block counts in an int32
            raise ValueError(f"TopkConfig.block must be in [256, 32768], got {self.block}")
        if not 64 <= self.filter_block <= 16384:
            raise ValueError(f"TopkConfig.filter_block must be in [64, 16384], got {self.filter_block}")
        if self.ahead not in (1, 2):
            raise ValueError(f"TopkConfig.ahead must be 1 or 2, got {self.ahead}")
        if self.cap and (self.cap < 1024 or self.cap & (self.cap - 1)):
            raise ValueError(f"TopkConfig.cap must be 0 (the plan's rule) or a power of two >= 1024, got {self.cap}")


_DEFAULT = TopkConfig()


class TopkPlan(NamedTuple):
    """The launch shape of a call; see :func:`plan`."""

    programs: int
    cap: int
    sample: int
    #: Segments the filter kernel cuts a long window into (0: the select kernel filters it).
    split: int
    #: How many candidates the threshold guess aims at: sqrt(topk * cap).
    aim: int


#: Sample keys the guess aims to have above its threshold (its relative error is about 1/sqrt of it).
_ABOVE = 64
#: The largest sample (registers: 32 keys a thread at 8 warps).
_SAMPLE_MAX = 8192
#: Standard deviations of the estimate that must fit inside [topk, CAP] on each side.
_SIGMAS = 5.0


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, asked twice a call (16 us each)
def plan(m: int, n: int, topk: int, config: TopkConfig = _DEFAULT) -> TopkPlan:
    """The launch shape for ``(M, N, topk)``: programs, candidate capacity CAP, sample size, split, aim.

    CAP is a power of two from 4*topk (>= 2048) to 16*topk; the guess aims at AIM = sqrt(topk * CAP)
    candidates, so an estimate off by rho = sqrt(CAP / topk) either way still fits. With ``a`` sample
    keys above the threshold the estimate's log spread is about 1/sqrt(a), so a CAP serves a window
    of N keys only if the largest sample (8192) puts a >= (5 / ln rho)^2 keys above AIM. SAMPLE (a
    power of two, 256..8192) then puts >= max(64, that) sample keys above AIM where it can. Of the
    CAPs that serve, the one with the least histogram work wins: about ``5 * AIM`` elements (four
    radix passes and the compaction over the candidates) plus ``3 * SAMPLE`` (the guess's passes).
    topk 2048 over 128k keys: CAP 8192, SAMPLE 2048; topk 512 over 128k: CAP 8192, SAMPLE 4096
    (CAP 2048 would need SAMPLE 8192, a third more work); a long window and a small topk (1M keys,
    topk 512) get the CAP that serves at all, since each miss reads its whole window five times.
    ``config.cap`` overrides the rule. ``split``: segments per long window when rows are fewer than
    ``config.split_target`` (each at least 4 blocks). None of these changes the result."""
    import math

    k, w = max(topk, 1), max(n, 1)
    best: tuple[int, int, int, int] | None = None  # (cost, cap, sample, aim)
    cap = max(2048, triton.next_power_of_2(4 * k))
    while True:
        aim = math.isqrt(k * cap)
        need = (_SIGMAS / math.log(math.sqrt(cap / k))) ** 2
        last = cap >= 16 * k
        sample = _sample(max(_ABOVE, need), w, aim)
        if aim * _SAMPLE_MAX >= need * w or (last and best is None):
            cost = 5 * aim + 3 * sample
            if best is None or cost < best[0]:
                best = (cost, cap, sample, aim)
        if last:
            break
        cap *= 2
    _, cap, sample, aim = best
    if config.cap:
        cap, aim = config.cap, math.isqrt(k * config.cap)
        sample = _sample(_ABOVE, w, aim)
    split = 0  # no filter kernel
    if m and n > cap:
        split = max(1, min(config.split_target // m, n // (4 * config.filter_block)))
        split = 0 if split == 1 and not config.separate else split
    return TopkPlan(max(1, min(m, config.max_programs)), cap, sample, split, aim)


def _sample(above: float, w: int, aim: int) -> int:
    """Sample keys (a power of two, 256..8192) that put ``above`` of them over a threshold that
    ``aim`` of ``w`` keys reach."""
    import math

    return max(256, min(_SAMPLE_MAX, triton.next_power_of_2(math.ceil(above * w / aim))))


def workspace_bytes(m: int, n: int, topk: int, dtype: torch.dtype = torch.float32,
                    config: TopkConfig = _DEFAULT) -> int:
    """Bytes of the workspace a call of shape ``(M, N, topk)`` over ``dtype`` logits uses (allocated
    inside the call unless passed as ``workspace``): 0 when N <= CAP (no window needs a filter),
    else ``programs * CAP * (4 + itemsize)`` for the select kernel's candidates, plus, when the
    filter is split, ``M * split * (CAP * (4 + itemsize) + 4)`` for each segment's candidates and count."""
    return sum(_layout(plan(m, n, topk, config), m, n, dtype))


def _layout(p: TopkPlan, m: int, n: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """Bytes of (select positions, segment positions, select values, segment values, segment
    counts): int32 parts first, the uneven counts last, so every part stays 16-byte aligned."""
    if m == 0 or n <= p.cap:
        return 0, 0, 0, 0, 0
    e = torch.empty((), dtype=dtype).element_size()
    seg = m * p.split
    return p.programs * p.cap * 4, seg * p.cap * 4, p.programs * p.cap * e, seg * p.cap * e, seg * 4


# ---- the kernel --------------------------------------------------------------------------------

def _keys(x):
    """Order-preserving uint32 keys of ``x`` (any float type): -0.0 == +0.0, NaN -> 0 (lowest)."""
    x = x.to(tl.float32)
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True)
    sign = (b >> 31).to(tl.uint32, bitcast=True)  # all ones for negatives, else 0
    k = b.to(tl.uint32, bitcast=True) ^ (sign | 0x80000000)
    return tl.where(x != x, k ^ k, k)


def _pick(hist, krem, DESC: tl.constexpr):
    """The digit holding the ``krem``-th largest element of a 256-bin histogram, and how many
    elements have a larger digit. Needs 1 <= krem <= sum(hist).

    ``DESC``: ``hist`` counts the digits xor 0xFF (bin j: digit 255 - j, the largest first), and the
    pick is one scan and one reduction, each a sync of the program's warps: ``ge``, the running count
    from the largest digit, rises with j, so the answer's bin j* is the first with ``ge >= krem`` and
    the count above it is ``ge[j* - 1]``, the largest ``ge`` below krem; one max over
    ``ge << 9 | (j + 1)`` of those bins gives both (the later bin where ``ge`` ties; 0, none: j* = 0,
    nothing above; int64, as a window may hold 2**22 keys or more). The radix passes take it (the
    sm_90 select kernel: 88 barriers, against 127 with the other form). Else ``hist`` counts the
    digits themselves and the pick is a scan and three sums: the threshold guess keeps that form,
    since the one-sync form there gave the segment filter kernel (bfloat16, topk 512) 153 registers,
    past two programs an SM."""
    if DESC:
        ge = tl.cumsum(hist, 0).to(tl.int64)
        top = tl.max(tl.where(ge < krem, (ge << 9) | (tl.arange(0, 256) + 1), 0), 0)
        return 255 - (top & 511).to(tl.int32), (top >> 9).to(tl.int32)
    incl = tl.cumsum(hist, 0)
    ge_up = tl.sum(hist, 0) - incl + hist  # elements in this bin or above
    b = tl.sum((ge_up >= krem).to(tl.int32), 0) - 1
    return b, tl.sum(tl.where(tl.arange(0, 256) == b, ge_up - hist, 0), 0)


def _guess(row, w, AIM: tl.constexpr, SAMPLE: tl.constexpr):
    """A 24-bit key prefix ``t_lo`` that about AIM of the window's ``w`` keys reach, from SAMPLE
    keys in groups of 8 contiguous ones spread evenly over the window (needs w > 8; a window shorter
    than SAMPLE is sampled with repeats, which keeps the estimate's density right)."""
    G: tl.constexpr = SAMPLE // 8
    offs_s = tl.arange(0, SAMPLE)
    grp = (offs_s // 8).to(tl.int64)
    at = (grp * (w - 8)) // (G - 1) + offs_s % 8
    sk = _keys(tl.load(row + at))
    r = tl.minimum(tl.maximum((AIM * SAMPLE) // w, 1), SAMPLE)
    b1, above = _pick(tl.histogram((sk >> 24).to(tl.int32), 256), r, False)
    in1 = (sk >> 24).to(tl.int32) == b1
    b2, above2 = _pick(tl.histogram(((sk >> 16) & 0xFF).to(tl.int32), 256, mask=in1), r - above, False)
    # a third byte: logits packed near one value (a sum over many heads: mean far above the spread)
    # put more than CAP keys in one 16-bit bucket, and 24 bits keep the guess near CAP/2
    in2 = in1 & (((sk >> 16) & 0xFF).to(tl.int32) == b2)
    b3, _ = _pick(tl.histogram(((sk >> 8) & 0xFF).to(tl.int32), 256, mask=in2), r - above - above2, False)
    return (b1.to(tl.uint32) << 24) | (b2.to(tl.uint32) << 16) | (b3.to(tl.uint32) << 8)


def _threshold(t_lo):
    """The float ``f`` with ``v >= f`` exactly when ``_keys(v) >= t_lo``, for every non-NaN ``v``
    (the key order is the float order, -0.0 == +0.0), and whether ``t_lo`` takes every key (0: NaN
    too). A float compare per element instead of a key: five instructions fewer in the filter."""
    bits = tl.where((t_lo >> 31) == 1, t_lo ^ 0x80000000, t_lo ^ 0xFFFFFFFF)  # the float whose key is t_lo
    f = bits.to(tl.float32, bitcast=True)
    f = tl.where(((t_lo >> 31) == 1) | (t_lo >= 0x00800000), f, float("-inf"))  # below -inf: NaN keys
    return f, t_lo == 0


def _compact(v, offs, ok, tf, every, cnt, wpos, wval, CAP: tl.constexpr, MASKED: tl.constexpr):
    """Append the elements of the tile ``v`` [R, VEC] (positions ``offs``; ``ok`` where MASKED) that
    reach the threshold to the lists at ``cnt``, in position order; returns the new count. A thread
    holds one row of VEC contiguous elements (one 16-byte load), so the prefix sum is VEC adds in a
    thread and one scan over the R row totals, instead of a scan over the whole block."""
    c = (v.to(tl.float32) >= tf) | every
    if MASKED:
        c = c & ok
    ci = c.to(tl.int32)
    rtot = tl.sum(ci, 1)
    slot = cnt + (tl.cumsum(rtot, 0) - rtot)[:, None] + tl.cumsum(ci, 1) - 1
    put = c & (slot < CAP)
    tl.store(wpos + slot, offs, mask=put)
    tl.store(wval + slot, v, mask=put)
    return cnt + tl.sum(rtot, 0)


def _filter(base, beg, end, t_lo, wpos, wval, CAP: tl.constexpr, BLOCK: tl.constexpr, AHEAD: tl.constexpr):
    """Keys >= ``t_lo`` at positions ``[beg, end)`` of the row whose position 0 is at ``base``,
    compacted in position order into ``wpos`` (their positions) / ``wval`` (values); returns how many
    there are (only the first CAP are written). Blocks start at 16-byte boundaries of the row, so
    the whole blocks between the first and the last load 16 bytes a thread per load."""
    VEC: tl.constexpr = 128 // base.dtype.element_ty.primitive_bitwidth
    R: tl.constexpr = BLOCK // VEC
    tile = tl.arange(0, R)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    tf, every = _threshold(t_lo)
    a0 = beg // VEC * VEC
    whole = (end - a0) // BLOCK  # blocks from a0 that end inside the range
    lim = a0 + whole * BLOCK
    offs = a0 + tile
    ok = (offs >= beg) & (offs < end)
    head = tl.load(base + offs, mask=ok, other=0.0)
    # each whole block is loaded AHEAD steps ahead (a uniform mask keeps the loads 16 bytes wide):
    # AHEAD + 1 blocks' reads in flight per thread while one is compacted. The compaction's scan
    # syncs the program's warps every step, so only reads issued earlier overlap it (ncu, one chunk
    # of 256 rows: 37% of warp samples waited on these loads at AHEAD 1).
    v = tl.load(base + a0 + BLOCK + tile, mask=a0 + BLOCK < lim, other=0.0)
    if AHEAD == 2:
        v2 = tl.load(base + a0 + 2 * BLOCK + tile, mask=a0 + 2 * BLOCK < lim, other=0.0)
    cnt = _compact(head, offs, ok, tf, every, 0, wpos, wval, CAP, True)
    for i0 in range(a0 + BLOCK, lim, BLOCK):
        v_next = tl.load(base + i0 + AHEAD * BLOCK + tile, mask=i0 + AHEAD * BLOCK < lim, other=0.0)
        cnt = _compact(v, i0 + tile, ok, tf, every, cnt, wpos, wval, CAP, False)
        if AHEAD == 2:
            v = v2
            v2 = v_next
        else:
            v = v_next
    i0 = a0 + tl.maximum(whole, 1) * BLOCK
    if i0 < end:
        offs = i0 + tile
        ok = offs < end
        cnt = _compact(tl.load(base + offs, mask=ok, other=0.0), offs, ok, tf, every, cnt, wpos, wval, CAP, True)
    return cnt


def _filter_kernel(
    x_ptr, ks_ptr, ke_ptr, spos_ptr, sval_ptr, scnt_ptr, M, N, stride_xm,
    CAP: tl.constexpr, AIM: tl.constexpr, SAMPLE: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
    AHEAD: tl.constexpr,
):
    """Program ``pid`` filters segment ``pid % SPLIT`` of row ``pid // SPLIT``'s window (when it is
    longer than CAP) into its own CAP slots, and writes its count; every segment of a row derives the
    same threshold from the same sample, so their lists, in segment order, are the unsplit filter's."""
    pid = tl.program_id(0)
    m = pid // SPLIT
    s = pid % SPLIT
    lo = tl.maximum(tl.load(ks_ptr + m), 0)
    hi = tl.minimum(tl.load(ke_ptr + m), N)
    w = tl.maximum(hi - lo, 0)
    cnt = 0
    if w > CAP:
        row = x_ptr + tl.cast(m, tl.int64) * stride_xm + lo
        t_lo = _guess(row, w, AIM, SAMPLE)
        seg = tl.cdiv(tl.cdiv(w, SPLIT), BLOCK) * BLOCK
        beg = tl.minimum(s * seg, w)
        end = tl.minimum(beg + seg, w)
        base = tl.cast(pid, tl.int64) * CAP
        cnt = _filter(x_ptr + tl.cast(m, tl.int64) * stride_xm, lo + beg, lo + end, t_lo, spos_ptr + base,
                      sval_ptr + base, CAP, BLOCK, AHEAD)
    tl.store(scnt_ptr + pid, cnt)


def _topk_kernel(
    x_ptr, ks_ptr, ke_ptr, out_ptr, val_ptr, wpos_ptr, wval_ptr, spos_ptr, sval_ptr, scnt_ptr,
    M, N, stride_xm, stride_om, stride_vm, topk,
    CAP: tl.constexpr, AIM: tl.constexpr, SAMPLE: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
    ABSOLUTE: tl.constexpr, VALUES: tl.constexpr, SPLIT: tl.constexpr, FBLOCK: tl.constexpr, AHEAD: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_b = tl.arange(0, BLOCK)
    wpos = wpos_ptr + tl.cast(pid, tl.int64) * CAP
    wval = wval_ptr + tl.cast(pid, tl.int64) * CAP
    for m in range(pid, M, nprog):
        lo = tl.maximum(tl.load(ks_ptr + m), 0)
        hi = tl.minimum(tl.load(ke_ptr + m), N)
        w = tl.maximum(hi - lo, 0)
        kk = tl.minimum(w, topk)
        m64 = tl.cast(m, tl.int64)
        row = x_ptr + m64 * stride_xm + lo  # the window's first element
        out_row = out_ptr + m64 * stride_om
        val_row = val_ptr + m64 * stride_vm

        # ---- 1-2: threshold guess from a sample, candidates compacted into the workspace (here, or
        # by _filter_kernel's SPLIT programs and gathered here in segment order)
        use_ws = w < 0
        n_src = w
        if w > CAP:
            if SPLIT == 0:
                cnt = _filter(x_ptr + m64 * stride_xm, lo, hi, _guess(row, w, AIM, SAMPLE), wpos, wval, CAP, FBLOCK,
                              AHEAD)
            else:
                cnt = 0
                for s in range(SPLIT):
                    seg = m64 * SPLIT + s
                    c = tl.load(scnt_ptr + seg)
                    for i in range(0, tl.minimum(c, CAP - cnt), TAIL):
                        offs = i + tl.arange(0, TAIL)
                        ok = offs < tl.minimum(c, CAP - cnt)
                        tl.store(wpos + cnt + offs, tl.load(spos_ptr + seg * CAP + offs, mask=ok), mask=ok)
                        tl.store(wval + cnt + offs, tl.load(sval_ptr + seg * CAP + offs, mask=ok), mask=ok)
                    cnt += c
            # the radix passes read the candidates in another thread layout than they were written
            # in: every thread's stores must be visible first (Triton orders shared memory between
            # warps, not global). The gather had no barrier after it when an sm_90 run at 16 warps
            # with the separate filter selected other keys than the default.
            tl.debug_barrier()
            use_ws = (cnt >= kk) & (cnt <= CAP)
            n_src = tl.where(use_ws, cnt, w)
        src = row
        if use_ws:
            src = wval

        if kk > 0:
            # ---- 3: radix select of the kk-th largest key over the source, 8 bits a pass. A source
            # of kk keys (a window no longer than topk: packed and early causal rows) is taken whole
            # with no pass: T = key 0 (the lowest) and need = kk take every key, in position order
            prefix = (kk * 0).to(tl.uint32)
            krem = kk
            if kk < n_src:
                for SHIFT in tl.static_range(24, -1, -8):
                    hist = tl.zeros([256], dtype=tl.int32)
                    for i in range(0, n_src, BLOCK):
                        offs = i + offs_b
                        ok = offs < n_src
                        k = _keys(tl.load(src + offs, mask=ok, other=0.0))
                        if SHIFT < 24:
                            ok = ok & ((k >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
                        hist += tl.histogram(((k >> SHIFT) & 0xFF).to(tl.int32) ^ 0xFF, 256, mask=ok)
                    b, above = _pick(hist, krem, True)
                    krem -= above
                    prefix = prefix | (b.to(tl.uint32) << SHIFT)

            # ---- 4: keys > T, then the first `need` keys == T, at their rank in position order
            need = krem
            eq_run = 0
            out_run = 0
            for i in range(0, n_src, BLOCK):
                offs = i + offs_b
                ok = offs < n_src
                v = tl.load(src + offs, mask=ok, other=0.0)
                k = _keys(v)
                gt = ok & (k > prefix)
                eq = ok & (k == prefix)
                c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), 0)
                eq_incl = eq_run + (c >> 16)
                take = gt | (eq & (eq_incl <= need))
                slot = out_run + (c & 0xFFFF) + tl.minimum(eq_incl, need) - tl.minimum(eq_run, need) - 1
                if use_ws:
                    pos = tl.load(wpos + offs, mask=take, other=0)
                else:
                    pos = lo + offs
                if not ABSOLUTE:
                    pos = pos - lo
                tl.store(out_row + slot, pos, mask=take)
                if VALUES:
                    tl.store(val_row + slot, v.to(tl.float32), mask=take)
                out_run += tl.sum(take.to(tl.int32), 0)
                eq_run += tl.sum(eq.to(tl.int32), 0)

        # ---- the tail [kk, topk): -1 and -inf
        offs_t = tl.arange(0, TAIL)
        for j in range(kk, topk, TAIL):
            offs = j + offs_t
            ok = offs < topk
            tl.store(out_row + offs, tl.full([TAIL], -1, tl.int32), mask=ok)
            if VALUES:
                tl.store(val_row + offs, tl.full([TAIL], float("-inf"), tl.float32), mask=ok)


@functools.lru_cache(maxsize=2)
def _jitted(interpret: bool) -> tuple[Any, Any]:
    """(select kernel, filter kernel) jitted for one mode, calling helpers jitted for the same mode;
    see ``mqa_logits_triton._jitted`` for why not at import."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        glb = dict(_topk_kernel.__globals__)
        # in call order: each sees the ones jitted before it
        for f in (_keys, _pick, _guess, _threshold, _compact, _filter):
            glb[f.__name__] = triton.jit(_rebound(f, glb))
        return tuple(triton.jit(_rebound(k, glb), do_not_specialize=["M", "N", "topk"])
                     for k in (_topk_kernel, _filter_kernel))


def _rebound(fn: Any, glb: dict[str, Any]) -> Any:
    """``fn`` with globals ``glb``, so that it calls the helpers jitted for the same mode."""
    rebound = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    rebound.__module__ = fn.__module__
    rebound.__qualname__ = fn.__qualname__
    # triton.jit reads constexpr parameters off the annotations, which FunctionType drops (the
    # interpreter does not care; a compiled launch then refuses tl.arange(0, BLOCK)).
    rebound.__annotations__ = dict(fn.__annotations__)
    return rebound


def kernel(interpret: bool | None = None, name: str = "select") -> Any:
    """The jitted ``"select"`` (or ``"filter"``) kernel for ``interpret`` (default: what
    TRITON_INTERPRET says now)."""
    which = {"select": 0, "filter": 1}[name]
    return _jitted(bool(triton.knobs.runtime.interpret) if interpret is None else interpret)[which]


# ---- the launcher ------------------------------------------------------------------------------

def topk_per_row_triton(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                        positions: str = "relative", out: torch.Tensor | None = None,
                        values: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                        config: TopkConfig | None = None) -> torch.Tensor:
    """Positions of the ``topk`` largest logits of each row's window, ascending; returns ``out``.

    :param logits: [M, N] float32 or bfloat16, unit last stride, any row stride.
    :param ks: int32 [M], window starts (clamped to >= 0).
    :param ke: int32 [M], window ends (clamped to <= N); an empty window yields only -1.
    :param topk: >= 1; may exceed the window or N (the tail is -1 / -inf).
    :param positions: ``"relative"`` (n - lo) or ``"absolute"`` (n).
    :param out: int32 [M, topk] with unit last stride, written in full; allocated when None.
    :param values: optional float32 [M, topk], unit last stride: the selected logits as fp32.
    :param workspace: optional uint8 tensor of >= :func:`workspace_bytes` bytes on the same device;
        allocated per call when None and needed (its size depends only on the shape, so CUDA-graph
        capture is fine either way).
    :param config: launch knobs (:class:`TopkConfig`); the result does not depend on them.
    """
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16) or (
            logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"topk_per_row_triton: logits must be 2-D float32/bfloat16 with unit last stride; "
                         f"got {tuple(logits.shape)} {logits.dtype} strides {logits.stride()}")
    m, n = logits.shape
    if topk < 1:
        raise ValueError(f"topk_per_row_triton: topk must be >= 1, got {topk}")
    if positions not in ("relative", "absolute"):
        raise ValueError(f"topk_per_row_triton: positions must be 'relative' or 'absolute', got {positions!r}")
    for name, t in (("ks", ks), ("ke", ke)):
        if t.dtype != torch.int32 or t.shape != (m,) or t.device != logits.device:
            raise ValueError(f"topk_per_row_triton: {name} must be int32 [{m}] on {logits.device}; got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if out is None:
        out = torch.empty((m, topk), dtype=torch.int32, device=logits.device)
    _check_out("out", out, torch.int32, m, topk, logits.device)
    if values is not None:
        _check_out("values", values, torch.float32, m, topk, logits.device)
    if m == 0:
        return out
    cfg = config or _DEFAULT
    p = plan(m, n, topk, cfg)
    parts = _layout(p, m, n, logits.dtype)
    need = sum(parts)
    wpos = spos = scnt = out
    wval = sval = logits
    if need:
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.uint8, device=logits.device)
        elif workspace.numel() * workspace.element_size() < need or workspace.device != logits.device:
            raise ValueError(f"topk_per_row_triton: workspace needs {need} bytes on {logits.device}; got "
                             f"{workspace.numel() * workspace.element_size()} on {workspace.device}")
        flat = workspace.view(torch.uint8).view(-1)
        ends = [sum(parts[:i + 1]) for i in range(5)]
        wpos, spos = flat[:ends[0]].view(torch.int32), flat[ends[0]:ends[1]].view(torch.int32)
        wval, sval = flat[ends[1]:ends[2]].view(logits.dtype), flat[ends[2]:ends[3]].view(logits.dtype)
        scnt = flat[ends[3]:ends[4]].view(torch.int32) if parts[4] else out
    split = p.split if parts[4] else 0
    interpret = bool(triton.knobs.runtime.interpret)
    capped = {} if interpret or torch.version.hip else {"maxnreg": SELECT_MAXNREG}
    if logits.device.type == "cpu" and not interpret:
        raise RuntimeError("topk_per_row_triton got CPU tensors: they run only under the Triton interpreter "
                           "(set TRITON_INTERPRET=1)")
    with _interpreting() if interpret else _on_device(logits.get_device()):
        if split:
            kernel(interpret, "filter")[(m * split,)](
                logits, ks, ke, spos, sval, scnt, m, n, logits.stride(0),
                CAP=p.cap, AIM=p.aim, SAMPLE=p.sample, BLOCK=cfg.filter_block, SPLIT=split, AHEAD=cfg.ahead,
                num_warps=cfg.num_warps)
        kernel(interpret)[(p.programs,)](
            logits, ks, ke, out, values if values is not None else out, wpos, wval, spos, sval, scnt,
            m, n, logits.stride(0), out.stride(0), values.stride(0) if values is not None else 0, topk,
            CAP=p.cap, AIM=p.aim, SAMPLE=p.sample, BLOCK=cfg.block, TAIL=_TAIL, ABSOLUTE=positions == "absolute",
            VALUES=values is not None, SPLIT=split, FBLOCK=cfg.filter_block, AHEAD=cfg.ahead, num_warps=cfg.num_warps,
            **capped,
        )
    return out


def _check_out(name: str, t: torch.Tensor, dtype: torch.dtype, m: int, topk: int, device: torch.device) -> None:
    if t.dtype != dtype or t.shape != (m, topk) or t.device != device or (topk > 1 and t.stride(1) != 1):
        raise ValueError(f"topk_per_row_triton: {name} must be {dtype} [{m}, {topk}] with unit last stride on "
                         f"{device}; got {t.dtype} {tuple(t.shape)} strides {t.stride()} on {t.device}")


def compile_for(target: str, *, dtype: torch.dtype = torch.float32, n: int = 131072, topk: int = 2048,
                values: bool = True, absolute: bool = False, config: TopkConfig | None = None,
                split: int = 0, name: str = "select") -> dict[str, Any]:
    """Build the ``"select"`` (or ``"filter"``) kernel ahead of time for ``target`` (``"sm_90"``,
    ``"gfx942"``, ``"gfx950"``, see ``mqa_provider_gluon.aot.TARGETS``) as a call of that shape
    would launch it; returns the asm dict with the compiled metadata under ``"metadata"``."""
    from triton.compiler import ASTSource

    from ..aot import TARGETS

    cfg = config or _DEFAULT
    p = plan(1, n, topk, cfg)
    fn = kernel(interpret=False, name=name)
    elem = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    consts = {"CAP": p.cap, "AIM": p.aim, "SAMPLE": p.sample,
              "BLOCK": cfg.filter_block if name == "filter" else cfg.block, "TAIL": _TAIL, "ABSOLUTE": absolute,
              "VALUES": values, "SPLIT": split, "FBLOCK": cfg.filter_block, "AHEAD": cfg.ahead}
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    types_ = {"x_ptr": f"*{elem}", "wval_ptr": f"*{elem}", "sval_ptr": f"*{elem}", "val_ptr": "*fp32"}
    signature = {a: ("constexpr" if a in consts else types_.get(a, "*i32" if a.endswith("_ptr") else "i32"))
                 for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if a.endswith("_ptr") or a.startswith("stride")]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    options: dict[str, Any] = {"num_warps": cfg.num_warps}
    if name == "select" and target.startswith("sm_"):
        options["maxnreg"] = SELECT_MAXNREG  # as the launcher passes it on NVIDIA
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                              target=TARGETS[target], options=options)
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm
