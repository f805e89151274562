"""fp8 MQA logits as a Gluon kernel for Hopper (sm_90), written against triton 3.6's Gluon API.

Mapping (why it is fast): one wgmma per key tile with M = keys (a K tile [BN, D] in shared memory,
K-major, operand A) and N = queries x heads of a query block (Q[m0:m0+BQ] viewed as [BQ*H, D], K-major,
operand B), K = D.  The head sum for one (key, query) is then a reduction over H adjacent accumulator
columns, which the wgmma accumulator layout keeps inside a thread plus two quad shuffles.

Kernels (both share one epilogue):
- ``_logits_kernel_simple``: one partition; TMA into a STAGES-deep ring guarded by mbarriers, synchronous
  wgmma.  Kept as the reference design and fallback (``config={"ws": False}``).
- ``_logits_kernel_ws``: warp specialised; a 1-warp TMA loader partition and two 4-warp math partitions
  that take alternate key tiles, so one warpgroup's epilogue (relu, weight FMA, head sum, k_scale, store)
  runs while the other warpgroup's wgmma is in flight.
- ``_logits_kernel_pws`` (``persistent=True``): the same partitions in a persistent grid (#SMs) walking
  (query block, key split) items in snake order, Q double-buffered, k_scale loaded before the wgmma wait,
  windows/weights hoisted per item, and (``banks=2``) each tile's wgmma issued as two async halves so the
  first half's epilogue overlaps the second half's MMA. Options: ``filler`` (a one-warp partition writes
  the -inf tiles while the math warpgroups compute), ``dynamic`` (items drawn from a grid-wide counter
  instead of the snake order), ``split`` (how rows' key tiles are cut into items). Without a config,
  :func:`shape_config` picks them from (M, N, H) (cb9ff2b:bench/notes_gluon.md, round 3).
- ``_filter_kernel_pws``: the persistent kernel with the fused indexer's epilogue instead of the store
  (``FILTER=1``: cells >= a per-row threshold appended to candidate lists through per-row counters,
  see ``_p_claim``); launched by :func:`fp8_mqa_filter_gluon` for ``mqa_topk_triton``'s
  ``scorer="gluon"``. It writes nothing of the [M, N] matrix.

Work split (non-persistent kernels): the grid is (key chunk, query block); a CTA handles CHUNK key
tiles of one query block and exits early when the chunk misses every window of the block, so the
hardware block scheduler balances causal windows. Tiles outside every window but inside [0, N) are
filled with -inf by the CTA (or item) that owns them (clean_logits), so the kernel alone writes every
output cell.

Gluon is imported lazily: importing this module never fails on another triton version;
``gluon_supported()`` says why the kernel cannot run here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

SUPPORTED_TRITON = "3.6"  # the Gluon API this file was written against (it changes between releases)

DEFAULT_CONFIG: dict[str, Any] = {
    "BN": 64,  # keys per tile (wgmma M; 64 = one warpgroup)
    "BQ": None,  # queries per block; None -> 256 // H (wgmma N = BQ*H <= 256)
    "STAGES": 8,  # depth of the K shared-memory ring (8 measured best with the persistent kernel)
    "CHUNK": 16,  # key tiles per CTA
    "ws": True,  # warp-specialised kernel (loader + 2 math warpgroups)
    "relu_abs": False,  # relu(x)*w as (x+|x|)*(w/2): two FFMA instead of FMNMX+FFMA
    "math_regs": 232,  # registers per thread of the second math partition (ws only)
    "loader_regs": 40,  # registers per thread of the loader partition (ws only)
    "maxnreg": None,  # kernel-wide register cap (ws only; the default partition gets what is left)
    # persistent warp-specialised kernel (grid = #SMs; ws must be True): the fastest measured on the
    # H200 (cb9ff2b:bench/notes_gluon.md, 2026-12-02: 850-968 TF/s against 759-838 for the best non-persistent)
    "persistent": True,
    "banks": 2,  # persistent only: the tile's wgmma as 2 async halves (queries split) or 1
    # persistent only: how each query block's key tiles are cut into work items. "items": the fewest
    # equal splits giving items_per_sm items per SM; "balanced": the split with the least modelled
    # time (rounds x (tiles per item + item_cost)), see persistent_split_balanced
    "split": "items",
    "items_per_sm": 4,  # persistent, split="items": split key ranges until there are this many items per SM
    "item_cost": 1,  # persistent, split="balanced": what starting an item costs, in key tiles
    # persistent only: registers of the second math partition (the first gets what is left of 168 x 12
    # warps); None: what compiles without spills (AOT sm_90, H=32 and 64, N % 16 == 0): 248; 240 with
    # the filler; 232 with the filler and dynamic (its loader group then holds 32 registers a thread)
    "p_math_regs": None,
    "p_loader_regs": 24,  # persistent only: registers of the loader warp
    "filler": False,  # persistent only: a fourth partition (one warp) writes the -inf tiles (clean_logits)
    # persistent only: registers of the filler warp (the loader's 4-warp group all get the larger of the
    # two); None: 24, or 32 with dynamic (its item ring state spills at 24, H=32)
    "p_fill_regs": None,
    # persistent only: programs draw items from a grid-wide counter (greedy: a packed batch's long rows do
    # not pile up on one program) instead of walking a static snake order
    "dynamic": False,
    "kernel": "gluon",  # "triton": serve the call with the portable Triton kernel (its default config)
}
#: Values a key may take, where they are a closed set.
_CHOICES = {"split": ("items", "balanced"), "kernel": ("gluon", "triton")}


def _triton_version_reason() -> str | None:
    try:
        import triton
    except Exception as exc:  # pragma: no cover - triton missing entirely
        return f"triton is not importable ({exc!r})"
    ver = getattr(triton, "__version__", "?")
    if not ver.startswith(SUPPORTED_TRITON + "."):
        return (f"mqa_logits_gluon_sm90 was written for triton {SUPPORTED_TRITON}.x's Gluon API; "
                f"installed triton is {ver}")
    return None


def gluon_supported(device: torch.device | int | None = None) -> str | None:
    """None when the kernel can run on ``device`` (default: current CUDA device), else the reason."""
    if isinstance(device, torch.device):
        device = device.index if device.type == "cuda" else -1
    return _supported_cached(-2 if device is None else device)


@functools.cache
def _supported_cached(device: int) -> str | None:
    if device == -1:
        return "the Gluon sm_90 kernel runs on CUDA tensors only"
    dev = None if device == -2 else device
    reason = _triton_version_reason()
    if reason:
        return reason
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.version.hip is not None:
        return "the Gluon sm_90 kernel needs an NVIDIA GPU (this is a ROCm build)"
    major, minor = torch.cuda.get_device_capability(dev)
    if (major, minor) != (9, 0):
        return f"the Gluon kernel targets sm_90 (wgmma); this device is sm_{major}{minor}"
    try:
        _kernels()
    except Exception as exc:  # an API mismatch shows up here, not at import of this module
        return f"Gluon kernels failed to build: {exc!r}"
    return None


try:  # guarded: the module must import on any triton; gluon_supported() reports what is missing
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.runtime.driver import driver as _driver

    from ..launch import bind, hooks_active, int_class, residues

    _jit, _constexpr_function = gluon.jit, gluon.constexpr_function
    # Sizes and split counts change per call: specialising on them (== 1, % 16) would compile a variant
    # per size class on first use. N and the row stride stay specialised: they make stores 16-byte wide.
    _jit_sizes = gluon.jit(do_not_specialize=["M", "num_splits", "tps"])
    # DYN=1: slots of the ring that hands drawn item indices from the loader to the other partitions. The
    # filler may lag the math warpgroups by a few items (one with a long fill, little compute): 4 slots
    # keep it from holding the loader back.
    ITEM_SLOTS = gl.constexpr(4)
    _GLUON_IMPORT_ERROR: str | None = None
except Exception as _exc:  # pragma: no cover - depends on the installed triton
    _GLUON_IMPORT_ERROR = repr(_exc)

    def _jit(fn):  # type: ignore[no-redef]
        return fn

    _constexpr_function = _jit_sizes = _jit

@_constexpr_function
def mma_layout(BN, NCOL, num_warps):
    # one warpgroup per 64 keys; the instruction takes all BQ*H columns (n <= 256)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, NCOL, 32])

@_constexpr_function
def out_layout(BN, num_warps):
    # keys are contiguous in the output: each thread stores BN//32 adjacent keys of one query
    return gl.BlockedLayout([BN // 32, 1], [32, 1], [1, num_warps], [0, 1])

@_jit
def _block_window(ks_ptr, ke_ptr, m0, M, N, BQ: gl.constexpr, layout: gl.constexpr):
    """Clamped per-query windows of the block and the key range [lo, hi) they cover."""
    offs = m0 + gl.arange(0, BQ, layout=layout)
    valid = offs < M
    ks = gl.maximum(gl.load(ks_ptr + offs, mask=valid, other=0), 0)
    ke = gl.minimum(gl.load(ke_ptr + offs, mask=valid, other=0), N)
    empty = ks >= ke
    lo = gl.min(gl.where(empty, N, ks), axis=0)
    hi = gl.max(gl.where(empty, 0, ke), axis=0)
    return ks, ke, lo, hi

@_jit
def _chunk_tiles(ks_ptr, ke_ptr, m0, M, N, BQ: gl.constexpr, BN: gl.constexpr, CHUNK: gl.constexpr,
                 num_warps: gl.constexpr):
    """Tile range [c0, c1) of this CTA's chunk and its sub-range [t0, t1) that meets a window."""
    lay1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    _, _, lo, hi = _block_window(ks_ptr, ke_ptr, m0, M, N, BQ, lay1)
    n_tiles = gl.cdiv(N, BN)
    c0 = gl.program_id(0) * CHUNK
    c1 = gl.minimum(c0 + CHUNK, n_tiles)
    t0 = gl.minimum(gl.maximum(lo // BN, c0), c1)  # stay inside the chunk: the fill must not cross it
    t1 = gl.maximum(gl.minimum(gl.cdiv(hi, BN), c1), t0)
    return c0, c1, t0, t1

@_jit
def _load_weights(w_ptr, m0, M, H: gl.constexpr, BQ: gl.constexpr, RELU_ABS: gl.constexpr,
                  layout: gl.constexpr):
    """weights[m0 + j // H, j % H] for the accumulator's columns j, as a [1, BQ*H] row."""
    cols = gl.arange(0, BQ * H, layout=gl.SliceLayout(0, layout))
    rows = m0 + cols // H
    w = gl.load(w_ptr + rows.to(gl.int64) * H + cols % H, mask=rows < M, other=0.0)
    if RELU_ABS:
        w = w * 0.5
    return gl.expand_dims(w, 0)

@_jit
def _epilogue(acc, w_row, ks_ptr, ke_ptr, ksc_ptr, out_ptr, out_stride, m0, n0, M, N,
              H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, CLEAN: gl.constexpr,
              RELU_ABS: gl.constexpr, num_warps: gl.constexpr):
    """relu, weight FMA, head sum, k_scale, window mask; store the [BQ, BN] logits tile."""
    if RELU_ABS:
        # relu(x)*w = x*(w/2) + |x|*(w/2): two separate sums contract to two FFMA chains (no FMNMX)
        s = gl.sum(gl.reshape(acc * w_row, [BN, BQ, H]), axis=2)
        s += gl.sum(gl.reshape(gl.abs(acc) * w_row, [BN, BQ, H]), axis=2)
    else:
        s = gl.sum(gl.reshape(gl.maximum(acc, 0.0) * w_row, [BN, BQ, H]), axis=2)  # [BN keys, BQ queries]
    olay: gl.constexpr = out_layout(BN, num_warps)
    s = gl.convert_layout(s, olay)
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, olay))
    offs_m = m0 + gl.arange(0, BQ, layout=gl.SliceLayout(0, olay))
    ksc = gl.load(ksc_ptr + offs_n, mask=offs_n < N, other=0.0)
    s = s * gl.expand_dims(ksc, 1)
    n2 = gl.expand_dims(offs_n, 1)
    m2 = gl.expand_dims(offs_m, 0)
    if CLEAN:
        qv = offs_m < M
        ks = gl.load(ks_ptr + offs_m, mask=qv, other=0)
        ke = gl.load(ke_ptr + offs_m, mask=qv, other=0)
        inwin = (n2 >= gl.expand_dims(ks, 0)) & (n2 < gl.expand_dims(ke, 0))
        s = gl.where(inwin, s, float("-inf"))
    ptrs = out_ptr + m2.to(gl.int64) * out_stride + n2
    gl.store(ptrs, s.to(out_ptr.dtype.element_ty), mask=(n2 < N) & (m2 < M))  # bf16 logits: rounded to nearest

@_jit
def _fill_neg_inf(out_ptr, out_stride, m0, M, N, first, last, BQ: gl.constexpr, BN: gl.constexpr,
                  num_warps: gl.constexpr):
    """-inf into tiles [first, last) of the block's rows (tiles that meet no window)."""
    olay: gl.constexpr = out_layout(BN, num_warps)
    offs_m = m0 + gl.arange(0, BQ, layout=gl.SliceLayout(0, olay))
    m2 = gl.expand_dims(offs_m, 0)
    row = out_ptr + m2.to(gl.int64) * out_stride
    ninf = gl.full([BN, BQ], float("-inf"), out_ptr.dtype.element_ty, olay)
    for t in range(first, last):
        n2 = gl.expand_dims(t * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, olay)), 1)
        gl.store(row + n2, ninf, mask=(n2 < N) & (m2 < M))

# ---------------------------------------------------------------- stage (a): one partition
@_jit
def _logits_kernel_simple(q_desc, k_desc, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
                          H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                          CHUNK: gl.constexpr, CLEAN: gl.constexpr, RELU_ABS: gl.constexpr,
                          num_warps: gl.constexpr):
    m0 = gl.program_id(1) * BQ
    c0, c1, t0, t1 = _chunk_tiles(ks_ptr, ke_ptr, m0, M, N, BQ, BN, CHUNK, num_warps)
    if CLEAN:
        _fill_neg_inf(out_ptr, out_stride, m0, M, N, c0, t0, BQ, BN, num_warps)
        _fill_neg_inf(out_ptr, out_stride, m0, M, N, t1, c1, BQ, BN, num_warps)
    if t1 > t0:
        NCOL: gl.constexpr = BQ * H
        D: gl.constexpr = q_desc.block_type.shape[1]
        mlay: gl.constexpr = mma_layout(BN, NCOL, num_warps)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NCOL, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES + 1):
            mbarrier.init(bars.index(i), count=1)
        q_bar = bars.index(STAGES)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [m0 * H, 0], q_bar, q_smem)
        n_t = t1 - t0
        for i in gl.static_range(STAGES - 1):
            pre = i < n_t
            mbarrier.expect(bars.index(i), k_desc.block_type.nbytes, pred=pre)
            tma.async_copy_global_to_shared(k_desc, [(t0 + i) * BN, 0], bars.index(i), k_smem.index(i),
                                            pred=pre)
        w_row = _load_weights(w_ptr, m0, M, H, BQ, RELU_ABS, mlay)
        acc = gl.zeros([BN, NCOL], gl.float32, mlay)
        mbarrier.wait(q_bar, 0)
        for i in range(n_t):
            # refill the slot freed by the (synchronous) wgmma of the previous iteration
            j = i + STAGES - 1
            pre = j < n_t
            sj = j % STAGES
            mbarrier.expect(bars.index(sj), k_desc.block_type.nbytes, pred=pre)
            tma.async_copy_global_to_shared(k_desc, [(t0 + j) * BN, 0], bars.index(sj), k_smem.index(sj),
                                            pred=pre)
            s = i % STAGES
            mbarrier.wait(bars.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(k_smem.index(s), q_smem.permute((1, 0)), acc, use_acc=False)
            _epilogue(acc, w_row, ks_ptr, ke_ptr, ksc_ptr, out_ptr, out_stride, m0, (t0 + i) * BN, M, N, H,
                      BQ, BN, CLEAN, RELU_ABS, num_warps)
        for i in gl.static_range(STAGES + 1):
            mbarrier.invalidate(bars.index(i))

# ---------------------------------------------------------------- stage (b): warp specialised
@_jit
def _ws_loader(q_desc, k_desc, q_smem, k_smem, ready, empty, q_bar, m0, t0, n_t, H: gl.constexpr,
               BN: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [m0 * H, 0], q_bar, q_smem)
    for i in range(n_t):
        s = i % STAGES
        # slots start free: the first lap waits on the opposite parity, which passes at once
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [(t0 + i) * BN, 0], ready.index(s), k_smem.index(s))

@_jit
def _ws_math(q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
             M, N, m0, t0, n_t, WG: gl.constexpr, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr,
             STAGES: gl.constexpr, CLEAN: gl.constexpr, RELU_ABS: gl.constexpr):
    """One math warpgroup: key tiles t0+WG, t0+WG+2, ...; wgmma then epilogue, slot freed early."""
    NCOL: gl.constexpr = BQ * H
    mlay: gl.constexpr = mma_layout(BN, NCOL, 4)
    w_row = _load_weights(w_ptr, m0, M, H, BQ, RELU_ABS, mlay)
    acc = gl.zeros([BN, NCOL], gl.float32, mlay)
    mbarrier.wait(q_bar, 0)
    for i in range(WG, n_t, 2):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(k_smem.index(s), q_smem.permute((1, 0)), acc, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index(s), count=1)
        _epilogue(acc, w_row, ks_ptr, ke_ptr, ksc_ptr, out_ptr, out_stride, m0, (t0 + i) * BN, M, N, H, BQ,
                  BN, CLEAN, RELU_ABS, 4)

@_jit
def _ws_math0(q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
              m0, t0, n_t, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              CLEAN: gl.constexpr, RELU_ABS: gl.constexpr):
    _ws_math(q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
             m0, t0, n_t, 0, H, BQ, BN, STAGES, CLEAN, RELU_ABS)

@_jit
def _ws_math1(q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
              m0, t0, n_t, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              CLEAN: gl.constexpr, RELU_ABS: gl.constexpr):
    _ws_math(q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
             m0, t0, n_t, 1, H, BQ, BN, STAGES, CLEAN, RELU_ABS)

@_jit
def _logits_kernel_ws(q_desc, k_desc, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride, M, N,
                      H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                      CHUNK: gl.constexpr, CLEAN: gl.constexpr, RELU_ABS: gl.constexpr,
                      MATH_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4, "the default partition is one math warpgroup")
    m0 = gl.program_id(1) * BQ
    c0, c1, t0, t1 = _chunk_tiles(ks_ptr, ke_ptr, m0, M, N, BQ, BN, CHUNK, num_warps)
    if CLEAN:
        _fill_neg_inf(out_ptr, out_stride, m0, M, N, c0, t0, BQ, BN, num_warps)
        _fill_neg_inf(out_ptr, out_stride, m0, M, N, t1, c1, BQ, BN, num_warps)
    if t1 > t0:
        NCOL: gl.constexpr = BQ * H
        D: gl.constexpr = q_desc.block_type.shape[1]
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NCOL, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        mbarrier.init(q_bar, count=1)
        n_t = t1 - t0
        # the tuples are built inline: a tuple bound to a name would turn its constexprs into tensors
        gl.warp_specialize([
            (_ws_math0, (q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
                         M, N, m0, t0, n_t, H, BQ, BN, STAGES, CLEAN, RELU_ABS)),
            (_ws_math1, (q_smem, k_smem, ready, empty, q_bar, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
                         M, N, m0, t0, n_t, H, BQ, BN, STAGES, CLEAN, RELU_ABS)),
            (_ws_loader, (q_desc, k_desc, q_smem, k_smem, ready, empty, q_bar, m0, t0, n_t, H, BN, STAGES)),
        ], [4, 1], [MATH_REGS, LOADER_REGS])


# ---------------------------------------------------------------- stage (c): persistent, warp specialised
@_constexpr_function
def half_out_layout(BN, QH, num_warps):
    # [BN keys, QH queries] with no replicated threads when BN * QH >= 32 * num_warps
    wq = min(num_warps, QH)
    wn = num_warps // wq
    return gl.BlockedLayout([max(1, BN // (32 * wn)), 1], [32, 1], [wn, wq], [0, 1])

@_jit
def _p_rounds(M, num_splits, BQ: gl.constexpr):
    """How many work items each program of the persistent grid takes (the last round may be partial)."""
    return gl.cdiv(gl.cdiv(M, BQ) * num_splits, gl.num_programs(0))

@_jit
def _p_decode(idx, M, N, num_splits, tps, BQ: gl.constexpr, BN: gl.constexpr):
    """Item idx: its query block (heaviest first: in causal prefill ke grows with m) and key tiles [c0, c1)."""
    mb = gl.cdiv(M, BQ) - 1 - idx // num_splits
    c0 = (idx % num_splits) * tps
    c1 = gl.minimum(c0 + tps, gl.cdiv(N, BN))
    return mb * BQ, c0, c1

@_jit
def _p_item(r, M, N, num_splits, tps, BQ: gl.constexpr, BN: gl.constexpr):
    """Work item of round r for this program (DYN=0): snake order over the item indices.

    The loader, both math partitions and the filler call this with the same arguments, so they walk the
    same items."""
    G = gl.num_programs(0)
    p = gl.program_id(0)
    idx = r * G + gl.where(r % 2 == 0, p, G - 1 - p)
    m0, c0, c1 = _p_decode(idx, M, N, num_splits, tps, BQ, BN)
    return idx < gl.cdiv(M, BQ) * num_splits, m0, c0, c1

@_jit
def _p_publish(sched_ptr, items, item_ready, item_empty, n):
    """DYN=1, loader: draw the next item index from the grid-wide counter and hand it to the other
    partitions through the item ring; a slot is free once every one of them has read what it held."""
    s = n % ITEM_SLOTS
    mbarrier.wait(item_empty.index(s), ((n // ITEM_SLOTS) & 1) ^ 1)
    idx = gl.atomic_add(sched_ptr, 1)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    items.index(s).store(gl.zeros([1], gl.int32, lay) + idx)
    mbarrier.arrive(item_ready.index(s), count=1)
    return idx

@_jit
def _p_take(items, item_ready, item_empty, n, num_warps: gl.constexpr):
    """DYN=1, math and filler partitions: the n-th item index this program drew."""
    s = n % ITEM_SLOTS
    mbarrier.wait(item_ready.index(s), (n // ITEM_SLOTS) & 1)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    idx = gl.max(items.index(s).load(lay), axis=0)
    mbarrier.arrive(item_empty.index(s), count=1)  # after the partition's barrier: every warp has read it
    return idx

@_jit
def _p_tiles(ks_ptr, ke_ptr, m0, c0, c1, M, N, BQ: gl.constexpr, BN: gl.constexpr, num_warps: gl.constexpr):
    lay1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    _, _, lo, hi = _block_window(ks_ptr, ke_ptr, m0, M, N, BQ, lay1)
    t0 = gl.minimum(gl.maximum(lo // BN, c0), c1)
    t1 = gl.maximum(gl.minimum(gl.cdiv(hi, BN), c1), t0)
    return t0, t1

@_jit
def _p_load_item(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr, ke_ptr, M, N, m0, c0, c1,
                 g, q_use, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    t0, t1 = _p_tiles(ks_ptr, ke_ptr, m0, c0, c1, M, N, BQ, BN, 1)
    if t1 > t0:
        qs = q_use % 2
        # Q double buffer: the load for this item overlaps the math on the previous one
        mbarrier.wait(q_empty.index(qs), ((q_use // 2) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qs), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [m0 * H, 0], q_ready.index(qs), q_smem.index(qs))
        for i in range(t1 - t0):
            s = (g + i) % STAGES
            mbarrier.wait(empty.index(s), (((g + i) // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [(t0 + i) * BN, 0], ready.index(s), k_smem.index(s))
        g += t1 - t0
        q_use += 1
    return g, q_use

@_jit
def _p_loader(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr, ke_ptr, sched_ptr, items,
              item_ready, item_empty, M, N, num_splits, tps, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr, DYN: gl.constexpr):
    g = 0
    q_use = 0
    if DYN == 0:
        for r in range(_p_rounds(M, num_splits, BQ)):
            ok, m0, c0, c1 = _p_item(r, M, N, num_splits, tps, BQ, BN)
            if ok:
                g, q_use = _p_load_item(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr,
                                        ke_ptr, M, N, m0, c0, c1, g, q_use, H, BQ, BN, STAGES)
    else:
        total = gl.cdiv(M, BQ) * num_splits
        n = 0
        idx = _p_publish(sched_ptr, items, item_ready, item_empty, n)
        while idx < total:
            m0, c0, c1 = _p_decode(idx, M, N, num_splits, tps, BQ, BN)
            g, q_use = _p_load_item(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr,
                                    ke_ptr, M, N, m0, c0, c1, g, q_use, H, BQ, BN, STAGES)
            n += 1
            idx = _p_publish(sched_ptr, items, item_ready, item_empty, n)
        # Every program draws once past the end, then counts itself out; the last one re-arms the
        # counter for the next launch on this stream (no program draws from it any more).
        done = gl.atomic_add(sched_ptr + 1, 1)
        if done == gl.num_programs(0) - 1:
            gl.atomic_xchg(sched_ptr, 0)
            gl.atomic_xchg(sched_ptr + 1, 0)

@_jit
def _p_reduce(acc, w_row, BN: gl.constexpr, QH: gl.constexpr, H: gl.constexpr, olay: gl.constexpr):
    s = gl.sum(gl.reshape(gl.maximum(acc, 0.0) * w_row, [BN, QH, H]), axis=2)
    return gl.convert_layout(s, olay)

@_jit
def _p_store(s, ksc, n0, rows, ks, ke, mrow, N, BN: gl.constexpr, CLEAN: gl.constexpr, olay: gl.constexpr):
    s = s * gl.expand_dims(ksc, 1)
    n2 = gl.expand_dims(n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, olay)), 1)
    if CLEAN:
        s = gl.where((n2 >= ks) & (n2 < ke), s, float("-inf"))
    gl.store(rows + n2, s.to(rows.dtype.element_ty), mask=(n2 < N) & mrow)

@_jit
def _p_add(a, b):
    return a + b

@_jit
def _p_claim(s, ksc, n0, ks, ke, tau, cnts, mrow, N, BN: gl.constexpr, olay: gl.constexpr):
    """FILTER=1, first half: which cells of the [BN keys, QH queries] tile go to their row's
    candidate list (inside the window and >= the row's threshold ``tau``; every window cell where tau
    is -inf: a dense row), and their slots claimed from the row's counter: one atomic per row and
    tile, from the thread holding the row's last key (its inclusive prefix count is the tile's
    total), so no thread holds a copy of another's atomic. :func:`_p_place` reads the atomic's
    result: in between the caller computes the other bank, which hides its latency. NaN passes only
    in a dense row (NaN >= tau is false), as in the Triton filter kernel."""
    s = s * gl.expand_dims(ksc, 1)
    kidx = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, olay)), 1)
    n2 = n0 + kidx
    dense = tau == float("-inf")
    keep = (n2 >= ks) & (n2 < ke) & (n2 < N) & mrow & ((s >= tau) | dense)
    csum = gl.associative_scan(keep.to(gl.int32), 0, _p_add)
    last = (kidx == BN - 1) & (csum > 0) & (~dense) & mrow
    got = gl.atomic_add(cnts + kidx * 0, csum, mask=last, sem="relaxed")
    return s, n2, keep, csum, got, last

@_jit
def _p_place(s, n2, keep, csum, got, last, rows, vrows, ks, tau, cap):
    """FILTER=1, second half: the claimed cells' positions to ``rows`` and values to ``vrows`` at the
    row's slots (the tile's first slot reaches the column by a max); a dense row's cell n at ``n -
    ks`` (its list in position order). Slots past ``cap`` are counted, not written: the caller sees
    the count."""
    base = gl.expand_dims(gl.max(gl.where(last, got, 0), axis=0), 0)
    slot = gl.where(tau == float("-inf"), n2 - ks, base + csum - 1)
    ok = keep & (slot < cap)
    gl.store(rows + slot, n2 + csum * 0, mask=ok)
    gl.store(vrows + slot, s, mask=ok)

@_jit
def _p_math_item(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr,
                 out_stride, val_ptr, tau_ptr, cnt_ptr, cap, M, N, m0, c0, c1, g, q_use, WG: gl.constexpr,
                 H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CLEAN: gl.constexpr,
                 BANKS: gl.constexpr, FILL: gl.constexpr, FILTER: gl.constexpr):
    QH: gl.constexpr = BQ // BANKS
    NH: gl.constexpr = QH * H
    mlay: gl.constexpr = mma_layout(BN, NH, 4)
    olay: gl.constexpr = half_out_layout(BN, QH, 4)
    # per item, issued together so their latencies overlap: windows, weights, row pointers
    offs_a = m0 + gl.arange(0, QH, layout=gl.SliceLayout(0, olay))
    mrow_a = gl.expand_dims(offs_a < M, 0)
    rows_a = out_ptr + gl.expand_dims(offs_a.to(gl.int64) * out_stride, 0)
    ks_a = gl.expand_dims(gl.load(ks_ptr + offs_a, mask=offs_a < M, other=0), 0)
    ke_a = gl.expand_dims(gl.load(ke_ptr + offs_a, mask=offs_a < M, other=0), 0)
    w_a = _load_weights(w_ptr, m0, M, H, QH, False, mlay)
    vrows_a = rows_a
    tau_a = ks_a
    cnts_a = ks_ptr
    if FILTER:  # the candidate lists share the row offsets; a row past M has tau +inf (takes nothing)
        vrows_a = val_ptr + gl.expand_dims(offs_a.to(gl.int64) * out_stride, 0)
        tau_a = gl.expand_dims(gl.load(tau_ptr + offs_a, mask=offs_a < M, other=float("inf")), 0)
        cnts_a = gl.expand_dims(cnt_ptr + offs_a, 0)
    if BANKS == 2:
        offs_b = offs_a + QH
        mrow_b = gl.expand_dims(offs_b < M, 0)
        rows_b = out_ptr + gl.expand_dims(offs_b.to(gl.int64) * out_stride, 0)
        ks_b = gl.expand_dims(gl.load(ks_ptr + offs_b, mask=offs_b < M, other=0), 0)
        ke_b = gl.expand_dims(gl.load(ke_ptr + offs_b, mask=offs_b < M, other=0), 0)
        w_b = _load_weights(w_ptr, m0 + QH, M, H, QH, False, mlay)
        vrows_b = rows_b
        tau_b = ks_b
        cnts_b = ks_ptr
        if FILTER:
            vrows_b = val_ptr + gl.expand_dims(offs_b.to(gl.int64) * out_stride, 0)
            tau_b = gl.expand_dims(gl.load(tau_ptr + offs_b, mask=offs_b < M, other=float("inf")), 0)
            cnts_b = gl.expand_dims(cnt_ptr + offs_b, 0)
    t0, t1 = _p_tiles(ks_ptr, ke_ptr, m0, c0, c1, M, N, BQ, BN, 4)
    if CLEAN:  # the -inf fill of tiles outside every window: WG 0 before, WG 1 after
        if FILL == 0:
            if WG == 0:
                _fill_neg_inf(out_ptr, out_stride, m0, M, N, c0, t0, BQ, BN, 4)
            else:
                _fill_neg_inf(out_ptr, out_stride, m0, M, N, t1, c1, BQ, BN, 4)
    if t1 > t0:
        qs = q_use % 2
        mbarrier.wait(q_ready.index(qs), (q_use // 2) & 1)
        q_all = q_smem.index(qs)
        q_a = q_all.slice(0, NH).permute((1, 0))
        acc_a = gl.zeros([BN, NH], gl.float32, mlay)
        if BANKS == 2:
            q_b = q_all.slice(NH, NH).permute((1, 0))
            acc_b = gl.zeros([BN, NH], gl.float32, mlay)
        n_t = t1 - t0
        for i in range((g + WG) % 2, n_t, 2):
            n0 = (t0 + i) * BN
            offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, olay))
            ksc = gl.load(ksc_ptr + offs_n, mask=offs_n < N, other=0.0)  # in flight during the wgmma
            s = (g + i) % STAGES
            mbarrier.wait(ready.index(s), ((g + i) // STAGES) & 1)
            k_tile = k_smem.index(s)
            acc_a = warpgroup_mma(k_tile, q_a, acc_a, use_acc=False, is_async=True)
            if BANKS == 2:
                acc_b = warpgroup_mma(k_tile, q_b, acc_b, use_acc=False, is_async=True)
                acc_a = warpgroup_mma_wait(1, deps=(acc_a, ))
                r_a = _p_reduce(acc_a, w_a, BN, QH, H, olay)
                acc_b = warpgroup_mma_wait(0, deps=(acc_b, ))
                mbarrier.arrive(empty.index(s), count=1)
                if FILTER:  # both banks' atomics in flight before either's result is read
                    s_a, n_a, k_a, c_a, g_a, l_a = _p_claim(r_a, ksc, n0, ks_a, ke_a, tau_a, cnts_a, mrow_a, N, BN,
                                                            olay)
                    r_b = _p_reduce(acc_b, w_b, BN, QH, H, olay)
                    s_b, n_b, k_b, c_b, g_b, l_b = _p_claim(r_b, ksc, n0, ks_b, ke_b, tau_b, cnts_b, mrow_b, N, BN,
                                                            olay)
                    _p_place(s_a, n_a, k_a, c_a, g_a, l_a, rows_a, vrows_a, ks_a, tau_a, cap)
                    _p_place(s_b, n_b, k_b, c_b, g_b, l_b, rows_b, vrows_b, ks_b, tau_b, cap)
                else:
                    _p_store(r_a, ksc, n0, rows_a, ks_a, ke_a, mrow_a, N, BN, CLEAN, olay)
                    r_b = _p_reduce(acc_b, w_b, BN, QH, H, olay)
                    _p_store(r_b, ksc, n0, rows_b, ks_b, ke_b, mrow_b, N, BN, CLEAN, olay)
            else:
                acc_a = warpgroup_mma_wait(0, deps=(acc_a, ))
                mbarrier.arrive(empty.index(s), count=1)
                r_a = _p_reduce(acc_a, w_a, BN, QH, H, olay)
                if FILTER:
                    s_a, n_a, k_a, c_a, g_a, l_a = _p_claim(r_a, ksc, n0, ks_a, ke_a, tau_a, cnts_a, mrow_a, N, BN,
                                                            olay)
                    _p_place(s_a, n_a, k_a, c_a, g_a, l_a, rows_a, vrows_a, ks_a, tau_a, cap)
                else:
                    _p_store(r_a, ksc, n0, rows_a, ks_a, ke_a, mrow_a, N, BN, CLEAN, olay)
        mbarrier.arrive(q_empty.index(qs), count=1)
        g += n_t
        q_use += 1
    return g, q_use

@_jit
def _p_math(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
            val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps, WG: gl.constexpr,
            H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CLEAN: gl.constexpr,
            BANKS: gl.constexpr, FILL: gl.constexpr, DYN: gl.constexpr, FILTER: gl.constexpr):
    """One math warpgroup; tiles alternate between the two warpgroups by a global tile counter.

    With BANKS=2 the tile's wgmma is issued as two async halves (queries split in two): the first
    half's epilogue runs while the second half is still on the tensor cores. FILL=1: the filler
    warp writes the -inf tiles, so this warpgroup only computes. DYN=1: items come from the loader."""
    g = 0
    q_use = 0
    if DYN == 0:
        for r in range(_p_rounds(M, num_splits, BQ)):
            ok, m0, c0, c1 = _p_item(r, M, N, num_splits, tps, BQ, BN)
            if ok:
                g, q_use = _p_math_item(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr,
                                        ke_ptr, out_ptr, out_stride, val_ptr, tau_ptr, cnt_ptr, cap, M, N, m0, c0,
                                        c1, g, q_use, WG, H, BQ, BN, STAGES, CLEAN, BANKS, FILL, FILTER)
    else:
        total = gl.cdiv(M, BQ) * num_splits
        n = 0
        idx = _p_take(items, item_ready, item_empty, n, 4)
        while idx < total:
            m0, c0, c1 = _p_decode(idx, M, N, num_splits, tps, BQ, BN)
            g, q_use = _p_math_item(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr,
                                    ke_ptr, out_ptr, out_stride, val_ptr, tau_ptr, cnt_ptr, cap, M, N, m0, c0, c1,
                                    g, q_use, WG, H, BQ, BN, STAGES, CLEAN, BANKS, FILL, FILTER)
            n += 1
            idx = _p_take(items, item_ready, item_empty, n, 4)

@_jit
def _p_math0(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
             val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps, H: gl.constexpr,
             BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CLEAN: gl.constexpr, BANKS: gl.constexpr,
             FILL: gl.constexpr, DYN: gl.constexpr, FILTER: gl.constexpr):
    _p_math(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
            val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps, 0, H, BQ, BN,
            STAGES, CLEAN, BANKS, FILL, DYN, FILTER)

@_jit
def _p_math1(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
             val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps, H: gl.constexpr,
             BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CLEAN: gl.constexpr, BANKS: gl.constexpr,
             FILL: gl.constexpr, DYN: gl.constexpr, FILTER: gl.constexpr):
    _p_math(q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, out_stride,
            val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps, 1, H, BQ, BN,
            STAGES, CLEAN, BANKS, FILL, DYN, FILTER)

@_jit
def _fill_rows(out_ptr, out_stride, m0, M, N, first, last, BQ: gl.constexpr, BN: gl.constexpr):
    """-inf into key tiles [first, last) of the block's rows, by one warp: each row's run is
    contiguous, so it is stored 2 tiles at a time, 16 bytes a thread, from a scalar row pointer (4 tiles
    at a time spill the dynamic filler's 32 registers at H=32)."""
    CH: gl.constexpr = 2 * BN
    lay: gl.constexpr = gl.BlockedLayout([CH // 32], [32], [1], [0])
    offs = gl.arange(0, CH, layout=lay)
    ninf = gl.full([CH], float("-inf"), out_ptr.dtype.element_ty, lay)
    lim = gl.minimum(last * BN, N)
    for r in range(gl.minimum(BQ, M - m0)):
        row = out_ptr + (m0 + r).to(gl.int64) * out_stride
        for n0 in range(first * BN, lim, CH):
            n = n0 + offs
            gl.store(row + n, ninf, mask=n < lim)

@_jit
def _p_fill_item(ks_ptr, ke_ptr, out_ptr, out_stride, M, N, m0, c0, c1, BQ: gl.constexpr, BN: gl.constexpr):
    t0, t1 = _p_tiles(ks_ptr, ke_ptr, m0, c0, c1, M, N, BQ, BN, 1)
    _fill_rows(out_ptr, out_stride, m0, M, N, c0, t0, BQ, BN)
    _fill_rows(out_ptr, out_stride, m0, M, N, t1, c1, BQ, BN)

@_jit
def _p_filler(ks_ptr, ke_ptr, out_ptr, out_stride, items, item_ready, item_empty, M, N, num_splits, tps,
              BQ: gl.constexpr, BN: gl.constexpr, DYN: gl.constexpr):
    """FILL=1: one warp walks this program's items as the others do and writes the -inf tiles of each
    (those outside every window of the block), while the math warpgroups compute. The cells it writes
    are exactly the ones the math warpgroups skip, so it needs no synchronisation with them."""
    if DYN == 0:
        for r in range(_p_rounds(M, num_splits, BQ)):
            ok, m0, c0, c1 = _p_item(r, M, N, num_splits, tps, BQ, BN)
            if ok:
                _p_fill_item(ks_ptr, ke_ptr, out_ptr, out_stride, M, N, m0, c0, c1, BQ, BN)
    else:
        total = gl.cdiv(M, BQ) * num_splits
        n = 0
        idx = _p_take(items, item_ready, item_empty, n, 1)
        while idx < total:
            m0, c0, c1 = _p_decode(idx, M, N, num_splits, tps, BQ, BN)
            _p_fill_item(ks_ptr, ke_ptr, out_ptr, out_stride, M, N, m0, c0, c1, BQ, BN)
            n += 1
            idx = _p_take(items, item_ready, item_empty, n, 1)

@_jit
def _p_shared(q_desc, k_desc, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              FILL: gl.constexpr):
    """The persistent kernels' shared memory: the Q double buffer, the K ring, their mbarriers and the
    item ring (DYN=1), initialised."""
    NCOL: gl.constexpr = BQ * H
    D: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, NCOL, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    items = gl.allocate_shared_memory(gl.int32, [ITEM_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    item_ready = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
    item_empty = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both math warpgroups release the Q slot
    for i in gl.static_range(ITEM_SLOTS):
        mbarrier.init(item_ready.index(i), count=1)
        mbarrier.init(item_empty.index(i), count=2 + FILL)  # read by both math warpgroups (and the filler)
    return q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty

@_jit_sizes
def _logits_kernel_pws(q_desc, k_desc, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, sched_ptr, out_stride, M, N,
                       num_splits, tps, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       CLEAN: gl.constexpr, BANKS: gl.constexpr, MATH_REGS: gl.constexpr,
                       LOADER_REGS: gl.constexpr, FILL: gl.constexpr, FILL_REGS: gl.constexpr, DYN: gl.constexpr,
                       num_warps: gl.constexpr):
    """Persistent: grid <= #SMs; program p walks work items (query block, split of tps key tiles), so
    one CTA per SM keeps its mbarrier rings, prefetches the next item's Q while the math warpgroups
    finish the current one, and pays the prologue once. DYN=0: a static snake order over the items.
    DYN=1: each program's loader draws the next item from a grid-wide counter at ``sched_ptr`` (two
    int32, zero at launch and left zero) when it is ready for one: greedy, so long items (a packed
    batch's long requests) do not pile up on one program. Otherwise ``sched_ptr`` is not read."""
    gl.static_assert(num_warps == 4, "the default partition is one math warpgroup")
    q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty = _p_shared(
        q_desc, k_desc, H, BQ, BN, STAGES, FILL)
    # the math partitions' candidate arguments (val_ptr, tau_ptr, cnt_ptr, cap) are never read (FILTER=0)
    if FILL == 1:  # a fourth partition, one warp, writes the -inf tiles
        gl.warp_specialize([
            (_p_math0, (q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr,
                        out_stride, out_ptr, out_ptr, out_ptr, N, items, item_ready, item_empty, M, N, num_splits,
                        tps, H, BQ, BN, STAGES, CLEAN, BANKS, FILL, DYN, 0)),
            (_p_math1, (q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr,
                        out_stride, out_ptr, out_ptr, out_ptr, N, items, item_ready, item_empty, M, N, num_splits,
                        tps, H, BQ, BN, STAGES, CLEAN, BANKS, FILL, DYN, 0)),
            (_p_loader, (q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr, ke_ptr, sched_ptr,
                         items, item_ready, item_empty, M, N, num_splits, tps, H, BQ, BN, STAGES, DYN)),
            (_p_filler, (ks_ptr, ke_ptr, out_ptr, out_stride, items, item_ready, item_empty, M, N, num_splits, tps,
                         BQ, BN, DYN)),
        ], [4, 1, 1], [MATH_REGS, LOADER_REGS, FILL_REGS])
    else:
        _p_run(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty,
               w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr, sched_ptr, out_stride, out_ptr, out_ptr, out_ptr, N, M, N,
               num_splits, tps, H, BQ, BN, STAGES, CLEAN, BANKS, MATH_REGS, LOADER_REGS, DYN, 0)

@_jit
def _p_run(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty, w_ptr,
           ksc_ptr, ks_ptr, ke_ptr, out_ptr, sched_ptr, out_stride, val_ptr, tau_ptr, cnt_ptr, cap, M, N,
           num_splits, tps, H: gl.constexpr, BQ: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
           CLEAN: gl.constexpr, BANKS: gl.constexpr, MATH_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
           DYN: gl.constexpr, FILTER: gl.constexpr):
    """The two math warpgroups and the loader (no filler warp)."""
    gl.warp_specialize([
        (_p_math0, (q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr,
                    out_stride, val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps,
                    H, BQ, BN, STAGES, CLEAN, BANKS, 0, DYN, FILTER)),
        (_p_math1, (q_smem, k_smem, ready, empty, q_ready, q_empty, w_ptr, ksc_ptr, ks_ptr, ke_ptr, out_ptr,
                    out_stride, val_ptr, tau_ptr, cnt_ptr, cap, items, item_ready, item_empty, M, N, num_splits, tps,
                    H, BQ, BN, STAGES, CLEAN, BANKS, 0, DYN, FILTER)),
        (_p_loader, (q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, ks_ptr, ke_ptr, sched_ptr,
                     items, item_ready, item_empty, M, N, num_splits, tps, H, BQ, BN, STAGES, DYN)),
    ], [4, 1], [MATH_REGS, LOADER_REGS])

@_jit_sizes
def _filter_kernel_pws(q_desc, k_desc, w_ptr, ksc_ptr, ks_ptr, ke_ptr, pos_ptr, sched_ptr, val_ptr, tau_ptr,
                       cnt_ptr, out_stride, M, N, num_splits, tps, cap, H: gl.constexpr, BQ: gl.constexpr,
                       BN: gl.constexpr, STAGES: gl.constexpr, BANKS: gl.constexpr, MATH_REGS: gl.constexpr,
                       LOADER_REGS: gl.constexpr, DYN: gl.constexpr, num_warps: gl.constexpr):
    """The persistent kernel with the filter epilogue (:func:`_p_append`): row m's cells >= tau[m]
    inside its window go, (position, value), to row m of ``pos_ptr`` / ``val_ptr`` (row stride
    ``out_stride``, ``cap`` slots), counted in ``cnt_ptr[m]`` (zero at launch); tau[m] = -inf: every
    window cell, at slot n - ks[m]. The cells' values are the logits kernel's arithmetic (same
    partitions, same reduce); nothing of the [M, N] matrix is written."""
    gl.static_assert(num_warps == 4, "the default partition is one math warpgroup")
    q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty = _p_shared(
        q_desc, k_desc, H, BQ, BN, STAGES, 0)
    _p_run(q_desc, k_desc, q_smem, k_smem, ready, empty, q_ready, q_empty, items, item_ready, item_empty,
           w_ptr, ksc_ptr, ks_ptr, ke_ptr, pos_ptr, sched_ptr, out_stride, val_ptr, tau_ptr, cnt_ptr, cap, M, N,
           num_splits, tps, H, BQ, BN, STAGES, False, BANKS, MATH_REGS, LOADER_REGS, DYN, 1)


def _kernels() -> dict[str, Any]:
    """The kernels by name; raises when triton's Gluon did not import."""
    if _GLUON_IMPORT_ERROR is not None:
        raise RuntimeError(f"triton.experimental.gluon is unusable: {_GLUON_IMPORT_ERROR}")
    return {"simple": _logits_kernel_simple, "ws": _logits_kernel_ws, "pws": _logits_kernel_pws,
            "filter": _filter_kernel_pws}


def resolve_config(H: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """DEFAULT_CONFIG overridden by ``config``; BQ defaults to 256 // H (wgmma N = BQ*H <= 256)."""
    cfg = dict(DEFAULT_CONFIG)
    if config:
        unknown = set(config) - set(cfg)
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update(config)
    if cfg["BQ"] is None:
        cfg["BQ"] = max(1, 256 // H)
    for key, allowed in _CHOICES.items():
        if cfg[key] not in allowed:
            raise ValueError(f"config {key!r} must be one of {allowed}, got {cfg[key]!r}")
    bq, bn = cfg["BQ"], cfg["BN"]
    if bq * H > 256 or (bq * H) % 8 or bq & (bq - 1):
        raise ValueError(f"BQ*H must be a multiple of 8 and <= 256 with BQ a power of two (BQ={bq}, H={H})")
    if bn != 64:
        raise ValueError(f"BN must be 64 (one warpgroup's wgmma M), got {bn}")
    if (cfg["filler"] or cfg["dynamic"]) and not cfg["persistent"]:
        raise ValueError("filler and dynamic are options of the persistent kernel (persistent=True)")
    if cfg["items_per_sm"] < 1 or cfg["item_cost"] < 0:
        raise ValueError(f"items_per_sm must be >= 1 and item_cost >= 0, got {cfg['items_per_sm']}, "
                         f"{cfg['item_cost']}")
    if cfg["persistent"]:
        if not cfg["ws"] or cfg["relu_abs"]:
            raise ValueError("the persistent kernel is warp specialised and has no relu_abs variant")
        if cfg["banks"] not in (1, 2) or bq % cfg["banks"] or (bq * H // cfg["banks"]) % 8:
            raise ValueError(f"banks must be 1 or 2 and divide BQ into wgmma N multiples of 8 (BQ={bq}, H={H})")
        if cfg["STAGES"] % 2:
            # the two math warpgroups alternate tiles: an even ring keeps each slot with one warpgroup,
            # which is what makes the single-parity ready-barrier wait safe
            raise ValueError(f"the persistent kernel needs an even STAGES, got {cfg['STAGES']}")
    return cfg


def kernel_launch_args(cfg: dict[str, Any], H: int, clean_logits: bool) -> tuple[str, dict[str, Any]]:
    """Which kernel and its constexpr / launch options for a resolved config."""
    common = dict(H=H, BQ=cfg["BQ"], BN=cfg["BN"], STAGES=cfg["STAGES"], CHUNK=cfg["CHUNK"],
                  CLEAN=bool(clean_logits), RELU_ABS=bool(cfg["relu_abs"]), num_warps=4)
    if cfg["persistent"]:
        del common["CHUNK"], common["RELU_ABS"]
        fill = int(bool(cfg["filler"] and clean_logits))  # nothing to fill without clean_logits
        dyn = int(bool(cfg["dynamic"]))
        math_regs = cfg["p_math_regs"] or (232 if fill and dyn else 240 if fill else 248)
        fill_regs = (cfg["p_fill_regs"] or (32 if dyn else 24)) if fill else 0
        common.update(BANKS=cfg["banks"], MATH_REGS=math_regs, LOADER_REGS=cfg["p_loader_regs"], FILL=fill,
                      FILL_REGS=fill_regs, DYN=dyn)
        return "pws", common
    if cfg["ws"]:
        common.update(MATH_REGS=cfg["math_regs"], LOADER_REGS=cfg["loader_regs"])
        if cfg["maxnreg"] is not None:
            common["maxnreg"] = cfg["maxnreg"]
        return "ws", common
    return "simple", common


def filter_launch_args(kw: dict[str, Any]) -> dict[str, Any]:
    """The filter kernel's constexprs from the persistent logits kernel's (:func:`kernel_launch_args`):
    no -inf to write, so no CLEAN and no filler warp."""
    return {k: v for k, v in kw.items() if k not in ("CLEAN", "FILL", "FILL_REGS")}


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a call signature needs, decided on its first call: the kernel and its constexprs, the
    grid's sizing, the shared-memory layouts of the two TMA descriptors, and which operands need a
    copy (none, when they arrive in the layout the kernel reads)."""

    device: torch.device
    cfg: dict[str, Any]
    name: str
    kw: dict[str, Any]
    fn: Any
    sms: int
    q_layout: Any
    k_layout: Any
    prepare: bool
    #: The constexprs in parameter order: the C launcher skips them, but counts them.
    tail: tuple[Any, ...]
    direct: bool
    #: Persistent kernel: (M, N) -> (splits, tiles per split), the config's split policy.
    split: Callable[[int, int], tuple[int, int]] | None = None


#: Plans and bound kernels per call signature. Bounded: a process sees a handful of signatures.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_BOUND: dict[tuple[Any, ...], Any] = {}
_CACHE_SIZE = 256
#: The runtime parameters that precede the constexprs, per kernel.
_RUNTIME = {"pws": 13, "ws": 10, "simple": 10}
#: Scheduler counters of the dynamic persistent kernel, per (device, stream): two int32 that each launch
#: leaves zero. Launches on one stream run one after another; two streams get two counters.
_SCHED: dict[tuple[int, int], torch.Tensor] = {}
#: SMs per device index.
_SMS: dict[int, int] = {}


def clear_caches() -> None:
    """Forget every plan and bound kernel (tests that fake a device use this)."""
    _PLANS.clear()
    _BOUND.clear()
    _SCHED.clear()
    _SMS.clear()


def _remember(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)), None)  # oldest first; a steady workload never gets here
    cache[key] = value


def _multiprocessors(index: int) -> int:
    """SMs of a CUDA device (0 for the CPU, -1), asked once: a device does not change what it has."""
    sms = _SMS.get(index)
    if sms is None:
        sms = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count if index >= 0 else 0
    return sms


def _split_policy(cfg: dict[str, Any], sms: int) -> Callable[[int, int], tuple[int, int]]:
    bq, bn = cfg["BQ"], cfg["BN"]
    if cfg["split"] == "balanced":
        cost = cfg["item_cost"]
        return lambda M, N: persistent_split_balanced(M, N, bq, bn, sms, cost)
    items = sms * cfg["items_per_sm"]
    return lambda M, N: persistent_split(M, N, bq, bn, items)


def _make_plan(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
               ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool, config: dict[str, Any] | None,
               ptrs: tuple[int, ...]) -> _Plan:
    from triton.experimental.gluon import language as gl

    from ..launch import direct_launch_unsupported

    M, H, D = q.shape
    cfg = resolve_config(H, config)
    if cfg["kernel"] == "triton":  # served by the portable kernel, which decides the rest itself
        return _Plan(device=q.device, cfg=cfg, name="triton", kw={}, fn=None, sms=0, q_layout=None,
                     k_layout=None, prepare=False, tail=(), direct=False)
    reason = gluon_supported(q.device)
    if reason:
        raise RuntimeError(reason)
    if q.dtype != torch.float8_e4m3fn or k.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q and k must be float8_e4m3fn, got {q.dtype} and {k.dtype}")
    if k.shape[1] != D or D % 16 or D > 256:
        raise ValueError(f"need k [N, D] with q's D, D a multiple of 16 and <= 256; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    name, kw = kernel_launch_args(cfg, H, clean_logits)
    fn = _kernels()[name]
    params = fn.arg_names[_RUNTIME[name]:]
    sms = _multiprocessors(q.get_device())
    # TMA reads q as [M*H, D] rows and k as [N, D] rows: 16-byte aligned bases and row strides,
    # unit inner strides. The kernel indexes weights as [M, H] rows and the rest as vectors.
    q_ok = q.stride() == (H * D, D, 1) and ptrs[0] % 16 == 0
    k_ok = k.stride(1) == 1 and k.stride(0) % 16 == 0 and ptrs[1] % 16 == 0
    vec_ok = all(t.stride(0) == 1 for t in (k_scale, ks, ke)) and weights.stride() == (H, 1)
    dtypes_ok = (k_scale.dtype == weights.dtype == torch.float32 and ks.dtype == ke.dtype == torch.int32)
    return _Plan(device=q.device, cfg=cfg, name=name, kw=kw, fn=fn, sms=sms,
                 q_layout=gl.NVMMASharedLayout.get_default_for([cfg["BQ"] * H, D], gl.float8e4nv),
                 k_layout=gl.NVMMASharedLayout.get_default_for([cfg["BN"], D], gl.float8e4nv),
                 prepare=not (q_ok and k_ok and vec_ok and dtypes_ok), tail=tuple(kw[p] for p in params),
                 direct=direct_launch_unsupported() is None,
                 split=_split_policy(cfg, sms) if name == "pws" else None)


def _prepare(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
             ks: torch.Tensor, ke: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The operands in the layouts the kernel reads; each copied only where it is not already so."""
    M, H, D = q.shape
    if q.stride() != (H * D, D, 1):
        q = q.contiguous()
    if k.stride(1) != 1 or k.stride(0) % 16:
        k = k.contiguous()
    k_scale = k_scale.reshape(-1)
    if k_scale.dtype != torch.float32 or k_scale.stride(0) != 1:
        k_scale = k_scale.float().contiguous()
    if weights.dtype != torch.float32 or weights.stride() != (H, 1):
        weights = weights.float().contiguous()
    ks = ks if ks.dtype == torch.int32 and ks.stride(0) == 1 else ks.to(torch.int32).contiguous()
    ke = ke if ke.dtype == torch.int32 and ke.stride(0) == 1 else ke.to(torch.int32).contiguous()
    return _aligned(q), _aligned(k), k_scale, weights, ks, ke


def _row(N: int, dtype: torch.dtype) -> int:
    """The output's row stride: N rounded up to 16 bytes (as TMA and vector stores want)."""
    per = 16 // dtype.itemsize
    return (N + per - 1) // per * per


def _new_output(M: int, N: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[M, N] logits (float32 or bfloat16) with rows padded to 16 bytes."""
    return torch.empty_strided((M, N), (_row(N, dtype), 1), dtype=dtype, device=device)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its base is 16-byte aligned (as TMA requires), else an aligned copy."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def fp8_mqa_logits_gluon(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                         ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool = True, *,
                         config: dict[str, Any] | None = None, direct: bool = True,
                         logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) inside [ks[m], ke[m]).

    Returns an [M, N] view of ``logits_dtype`` (float32, or bfloat16: each logit rounded once to
    nearest even as it is stored) whose row stride is N rounded up to 16 bytes (for TMA); 64 bytes
    when ``config`` sends the call to the Triton kernel (``kernel="triton"``).
    Without ``config``, :func:`shape_config` picks one from (M, N, H) and the device's SM count.
    The first call of a signature (devices, dtypes, strides, alignments, config) decides the kernel,
    its constexprs and any copies, and launches through Triton; later ones, with ``direct`` (the
    default), launch the kernel Triton compiled then, with TMA descriptors encoded once per tensor
    (see ``mqa_provider_gluon.launch``). Nothing is copied when the operands are already laid out as
    the kernel reads them.
    """
    clean_logits = bool(clean_logits)
    M = q.shape[0]
    N = k.shape[0]
    ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
    kst = k.stride()
    dev = q.get_device()
    key = _signature(q, k, k_scale, weights, ks, ke, clean_logits, config, ptrs, logits_dtype)
    plan = _PLANS.get(key)
    if plan is None:
        if len(set(key[:6])) != 1:
            raise ValueError("fp8_mqa_logits_gluon: all tensors must be on one device; got "
                             f"{[str(t.device) for t in (q, k, k_scale, weights, ks, ke)]}")
        plan = _make_plan(q, k, k_scale, weights, ks, ke, clean_logits, dict(key[7]), ptrs)
        _remember(_PLANS, key, plan)
    if plan.name == "triton":
        from .mqa_logits_triton import fp8_mqa_logits_triton

        return fp8_mqa_logits_triton(q, k, k_scale, weights, ks, ke, clean_logits, direct=direct,
                                     logits_dtype=logits_dtype)
    if plan.prepare:
        q, k, k_scale, weights, ks, ke = _prepare(q, k, k_scale, weights, ks, ke)
        ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(),
                ke.data_ptr())
        kst = k.stride()
    out = _new_output(M, N, plan.device, logits_dtype)
    n_pad = out.stride(0)
    if M == 0 or N == 0:
        return out.fill_(float("-inf")) if clean_logits else out
    grid, ints = _grid(plan, M, N, n_pad)
    sched: tuple[torch.Tensor, ...] = ()
    if plan.name == "pws":
        sched = (_scheduler(dev, q.device) if plan.cfg["dynamic"] else out,)  # not read unless dynamic
    # Triton specialises these ints (== 1, % 16, 64-bit): they pick the compiled kernel too.
    bkey = (key, *map(int_class, ints))
    if direct and plan.direct:
        bound = _BOUND.get(bkey)
        if bound and not hooks_active():
            _launch_bound(bound, plan, grid, ptrs, q, k, kst[0], (out.data_ptr(), *(t.data_ptr() for t in sched)),
                          ints)
            return out
    with _on_device(key[0]):
        compiled = plan.fn[grid](_q_descriptor(q, plan), _k_descriptor(k, plan), weights, k_scale, ks, ke, out,
                                 *sched, *ints, **plan.kw)
        if direct and plan.direct and bkey not in _BOUND:
            _remember(_BOUND, bkey, bind(compiled))
    return out


def fp8_mqa_filter_gluon(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                         ks: torch.Tensor, ke: torch.Tensor, tau: torch.Tensor, cnt: torch.Tensor, pos: torch.Tensor,
                         val: torch.Tensor, cap: int, *, config: dict[str, Any] | None = None) -> None:
    """The fused indexer's filter on sm_90: the persistent logits kernel with the candidate epilogue
    (``_filter_kernel_pws``). Row m's cells inside ``[ks[m], ke[m])`` whose logit is >= ``tau[m]``
    are appended, (position, value), to row m of ``pos`` (int32) and ``val`` (float32), both
    ``[M, >= cap]`` with one row stride, through the int32 counter ``cnt[m]`` (zero before the
    call; it ends at the row's full count, which may pass ``cap``: slots past it are not written);
    ``tau[m] = -inf`` writes every window cell at slot ``n - ks[m]``, no counter. The same contract
    as ``mqa_topk_triton``'s Triton filter kernel, so its orchestration (sample, selection, rescoring)
    serves both. A cell's value is the logits kernel's arithmetic for the same config; the config
    (``shape_config``, as for the logits) changes only who computes a tile, so the values depend on
    nothing but the cell's own inputs."""
    M, H, D = q.shape
    N = k.shape[0]
    if M == 0 or N == 0:
        return
    if pos.stride() != val.stride() or pos.stride(1) != 1 or pos.dtype != torch.int32 or val.dtype != torch.float32:
        raise ValueError("fp8_mqa_filter_gluon: pos (int32) and val (float32) need one row stride and unit columns")
    ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
    chosen = dict(shape_config(M, N, H, _multiprocessors(q.get_device())))
    plan = _make_plan(q, k, k_scale, weights, ks, ke, False, {**chosen, **(config or {})}, ptrs)
    if plan.name != "pws":
        raise ValueError("fp8_mqa_filter_gluon: the filter is the persistent kernel's epilogue; the config gives "
                         f"{plan.name!r}")
    if plan.prepare:
        q, k, k_scale, weights, ks, ke = _prepare(q, k, k_scale, weights, ks, ke)
    splits, tps = plan.split(M, N)  # type: ignore[misc]
    grid = (min(plan.sms, triton_cdiv(M, plan.cfg["BQ"]) * splits), 1)
    sched = _scheduler(q.get_device(), q.device) if plan.cfg["dynamic"] else cnt
    with _on_device(q.get_device()):
        _kernels()["filter"][grid](_q_descriptor(q, plan), _k_descriptor(k, plan), weights, k_scale, ks, ke, pos,
                                   sched, val, tau, cnt, pos.stride(0), M, N, splits, tps, cap,
                                   **filter_launch_args(plan.kw))


def _signature(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
               ke: torch.Tensor, clean_logits: bool, config: dict[str, Any] | None,
               ptrs: tuple[int, ...], logits_dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """The key of plans (and, with the launch ints' classes, of bound kernels): devices, the config
    (``config``, else the one :func:`shape_config` picks), dtypes, H, D, strides, and each data pointer
    (``ptrs``) only as far as its 16-byte alignment."""
    M, H, D = q.shape
    dev = q.get_device()
    chosen = tuple(sorted(config.items())) if config else shape_config(M, k.shape[0], H, _multiprocessors(dev))
    misaligned = (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15
    return (dev, k.get_device(), k_scale.get_device(), weights.get_device(), ks.get_device(),
            ke.get_device(), clean_logits, chosen, q.dtype, k.dtype,
            k_scale.dtype, weights.dtype, ks.dtype, ke.dtype, H, D, q.stride(), k.stride(), k_scale.stride(),
            weights.stride(), ks.stride(), ke.stride(), misaligned and tuple(p & 15 == 0 for p in ptrs), logits_dtype)


def _grid(plan: _Plan, M: int, N: int, n_pad: int) -> tuple[tuple[int, int], tuple[int, ...]]:
    """The grid and the launch ints: the output's row stride, M, N (then the persistent kernel's
    split counts, from the config's split policy)."""
    cfg = plan.cfg
    bq = cfg["BQ"]
    if plan.name == "pws":
        splits, tps = plan.split(M, N)  # type: ignore[misc]
        return (min(plan.sms, triton_cdiv(M, bq) * splits), 1), (n_pad, M, N, splits, tps)
    return (triton_cdiv(triton_cdiv(N, cfg["BN"]), cfg["CHUNK"]), triton_cdiv(M, bq)), (n_pad, M, N)


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """The bound launch of one full call signature, with the plan, grid, launch ints and k's row
    stride worked out once: mqa-core's prepared call (its signature holds every tensor's type, shape,
    strides, dtype and device; with the start addresses' residues modulo 16, checked per call, that
    is a superset of :func:`_signature` and the ints). Per call it reads six pointers, allocates the
    output (and finds the dynamic kernel's counters for the current stream) and launches, with TMA
    descriptors cached per pointer as the launcher does; with a Triton launch hook set, or pointers
    of other residues, it takes the full launcher instead."""

    bound: Any
    plan: _Plan
    size: tuple[int, int]
    n_pad: int
    grid: tuple[int, int]
    ints: tuple[int, ...]
    skn: int
    clean_logits: bool
    #: The six start addresses modulo 16 it was prepared for (``launch.residues``; None: all 0).
    residues: tuple[int, ...] | None
    logits_dtype: torch.dtype = torch.float32

    def __call__(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                 ks: torch.Tensor, ke: torch.Tensor, *, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``logits_dtype``: as for ``mqa_logits_triton.PreparedCall``."""
        k, k_scale = kv
        ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
        other_dtype = logits_dtype is not None and logits_dtype is not self.logits_dtype
        # a profiler's hook sees every launch (Triton's own path); other alignments, another kernel
        if hooks_active() or other_dtype or (
                (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15
                if self.residues is None else residues(ptrs) != self.residues):
            return fp8_mqa_logits_gluon(q, k, k_scale, weights, ks, ke, self.clean_logits,
                                        logits_dtype=logits_dtype or self.logits_dtype)
        plan = self.plan
        out = torch.empty_strided(self.size, (self.n_pad, 1), dtype=self.logits_dtype, device=plan.device)
        out_ptrs: tuple[int, ...] = (out.data_ptr(),)
        if plan.name == "pws":  # the counters are read only by the dynamic kernel
            sched = _scheduler(plan.device.index, plan.device) if plan.cfg["dynamic"] else out
            out_ptrs = (out_ptrs[0], sched.data_ptr())
        _launch_bound(self.bound, plan, self.grid, ptrs, q, k, self.skn, out_ptrs, self.ints)
        return out


def prepare(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
            ke: torch.Tensor, clean_logits: bool = True, logits_dtype: torch.dtype = torch.float32) -> Any:
    """The :class:`PreparedCall` for calls like this one (the default config), once a call of its
    signature has bound a launch; the Triton kernel's (``mqa_logits_triton.prepare``) where the config
    sends the call there; None where such calls do not take the bound launch (a Triton without
    direct launches, operands that need a copy, an empty output). Arguments as for
    :func:`fp8_mqa_logits_gluon`, already checked by it on an earlier call."""
    clean_logits = bool(clean_logits)
    ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
    key = _signature(q, k, k_scale, weights, ks, ke, clean_logits, None, ptrs, logits_dtype)
    plan = _PLANS.get(key)
    if plan is not None and plan.name == "triton":
        from .mqa_logits_triton import prepare as prepare_triton

        return prepare_triton(q, k, k_scale, weights, ks, ke, clean_logits, logits_dtype=logits_dtype)
    M, N = q.shape[0], k.shape[0]
    if plan is None or plan.prepare or not plan.direct or not (M and N):
        return None
    n_pad = _row(N, logits_dtype)  # as _new_output
    grid, ints = _grid(plan, M, N, n_pad)
    bound = _BOUND.get((key, *map(int_class, ints)))
    if not bound:
        return None
    return PreparedCall(bound, plan, (M, N), n_pad, grid, ints, k.stride(0), clean_logits, residues(ptrs),
                        logits_dtype)


def _q_descriptor(q: torch.Tensor, plan: _Plan) -> Any:
    """q [M, H, D] as TMA sees it: [M*H, D] rows, one [BQ*H, D] box per query block."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, H, D = q.shape
    return TensorDescriptor(q, [M * H, D], [D, 1], [plan.cfg["BQ"] * H, D], plan.q_layout)


def _k_descriptor(k: torch.Tensor, plan: _Plan) -> Any:
    """k [N, D] (any 16-byte aligned row stride), one [BN, D] box per key tile."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    N, D = k.shape
    return TensorDescriptor(k, [N, D], [k.stride(0), 1], [plan.cfg["BN"], D], plan.k_layout)


def _on_device(index: int) -> Any:
    """Triton launches on the current device: make it ``index`` unless it already is."""
    if index < 0 or _driver.active.get_current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _launch_bound(bound: Any, plan: _Plan, grid: tuple[int, int], ptrs: tuple[int, ...], q: torch.Tensor,
                  k: torch.Tensor, skn: int, out_ptrs: tuple[int, ...], ints: tuple[int, ...]) -> None:
    """The arguments ``kernel[grid](...)`` would pass, straight to the bound kernel's launcher:
    pointers as ints, TMA descriptors encoded once per (pointer, shape, strides). ``out_ptrs``: the
    output's (then the persistent kernel's scheduler counters'); ``ints``: the output's row stride, M,
    N (then the split counts of the persistent kernel)."""
    M, N = ints[1], ints[2]
    q_desc = bound.descriptor((0, ptrs[0], M), _q_descriptor, q, plan)
    k_desc = bound.descriptor((1, ptrs[1], N, skn), _k_descriptor, k, plan)
    args = (*q_desc, *k_desc, ptrs[3], ptrs[2], ptrs[4], ptrs[5], *out_ptrs, *ints, *plan.tail)
    index = plan.device.index
    drv = _driver.active
    if index is None or drv.get_current_device() == index:
        bound(grid[0], grid[1], 1, drv.get_current_stream(index), args)
    else:
        with torch.cuda.device(index):
            bound(grid[0], grid[1], 1, drv.get_current_stream(index), args)


def _scheduler(index: int, device: torch.device) -> torch.Tensor:
    """The dynamic kernel's counters for the current stream of a device: zeroed once, left zero by
    every launch (its last program re-arms them). A CUDA graph captures the counters of its capture
    stream; replaying one graph on two streams at once would share them."""
    key = (index, _driver.active.get_current_stream(index))
    buf = _SCHED.get(key)
    if buf is None:
        buf = torch.zeros(2, dtype=torch.int32, device=device)
        _remember(_SCHED, key, buf)
    return buf


def persistent_split(M: int, N: int, bq: int, bn: int, items: int) -> tuple[int, int]:
    """(splits, tiles per split): each query block's key tiles cut into the fewest equal splits that give
    at least ``items`` work items (long rows stay whole: one Q load per row, as in the Triton kernel)."""
    n_tiles = triton_cdiv(N, bn)
    splits = max(1, min(n_tiles, triton_cdiv(items, triton_cdiv(M, bq))))
    tps = triton_cdiv(n_tiles, splits)
    return triton_cdiv(n_tiles, tps), tps


@functools.lru_cache(maxsize=1024)
def persistent_split_balanced(M: int, N: int, bq: int, bn: int, sms: int, item_cost: float = 1) -> tuple[int, int]:
    """(splits, tiles per split) with the least modelled time when every row sees every key.

    The persistent grid walks ``cdiv(M, bq) * splits`` items in rounds of ``sms``: its busiest program
    takes ``ceil(items / sms)`` items of ``tps`` tiles, each costing ``item_cost`` tiles more to start
    (window loads, the pipeline turning over). The "items" rule can leave a partial last round of
    large items: at M=256, N=64k, H=64 it makes 576 items of 114 tiles, 5 rounds with 48 of 132
    programs busy in the last (575 tiles for the busiest, 496 on average); this picks 128 items of
    512 tiles, one round (513). Ties go to fewer splits: fewer Q loads. Only distinct ``tps`` values
    are tried (O(sqrt(tiles)) of them); memoised, as engines repeat their shapes.
    """
    num_mb, n_tiles = triton_cdiv(M, bq), triton_cdiv(N, bn)
    best = (float("inf"), 1, n_tiles)
    s = 1
    while s <= n_tiles:
        tps = triton_cdiv(n_tiles, s)
        splits = triton_cdiv(n_tiles, tps)
        cost = triton_cdiv(num_mb * splits, sms) * (tps + item_cost)
        if cost < best[0]:
            best = (cost, splits, tps)
        if tps == 1:
            break
        s = triton_cdiv(n_tiles, tps - 1)  # the fewest splits that make the items shorter
    return best[1], best[2]


#: A call is "large" above this many key tiles per SM when every row sees every key (about 0.4 ms of
#: work on an H200): large calls keep the config measured on the large benchmark shapes.
LARGE_TILES_PER_SM = 768
#: What :func:`shape_config` gives small and mid calls, and large ones (today's defaults).
SMALL_CONFIG: tuple[tuple[str, Any], ...] = (("filler", True), ("split", "balanced"))
LARGE_CONFIG: tuple[tuple[str, Any], ...] = ()
#: A large call whose default ("items") split leaves the busiest program this far above the mean (a
#: partial last round of long items) takes the balanced split instead. On the H200 (2026-12-03,
#: cb9ff2b:bench/README.md, round 7) gluon ran suffix 1500 x 40000 at H=32 14% behind DeepGEMM: 564 items of 209
#: tiles over 132 SMs, 5 rounds with 36 programs busy in the last (1.17x the mean); the balanced split
#: makes 1316 items of 90 tiles, 1.003x. The packed and square large shapes sit at <= 1.10 and keep
#: their measured config.
UNEVEN_ITEMS = 1.12
LARGE_UNEVEN_CONFIG: tuple[tuple[str, Any], ...] = (("split", "balanced"),)


@functools.lru_cache(maxsize=1024)
def shape_config(M: int, N: int, H: int, sms: int) -> tuple[tuple[str, Any], ...]:
    """The config of a call that names none, as (key, value) pairs over DEFAULT_CONFIG.

    Small and mid calls (<= LARGE_TILES_PER_SM dense key tiles per SM) are where the launch shape
    decides: a balanced key split (no partial last round of long items) and the filler warp (the -inf
    tiles written while the math warpgroups compute, not between their tiles). Large calls keep
    today's config, unless its split leaves a partial last round of long items (``UNEVEN_ITEMS``):
    then the balanced split alone. Only (M, N, H) and the SM count are known on the host without a sync, so windows
    (causal, packed, sliding) cannot enter the rule. Pure and memoised: one lookup per call.
    """
    if sms <= 0:
        return LARGE_CONFIG
    bq = max(1, 256 // H)
    dense = triton_cdiv(M, bq) * triton_cdiv(N, 64) / sms
    if dense <= LARGE_TILES_PER_SM:
        return SMALL_CONFIG
    return LARGE_UNEVEN_CONFIG if items_imbalance(M, N, bq, sms) > UNEVEN_ITEMS else LARGE_CONFIG


def items_imbalance(M: int, N: int, bq: int, sms: int) -> float:
    """The busiest program's tiles over the mean under the default "items" split, every row seeing
    every key (what the host knows without a sync): > 1 when the last round of items is partial."""
    splits, _ = persistent_split(M, N, bq, DEFAULT_CONFIG["BN"], DEFAULT_CONFIG["items_per_sm"] * sms)
    items = triton_cdiv(M, bq) * splits  # all of equal length: the ratio is in rounds, not tiles
    return triton_cdiv(items, sms) * sms / items


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def compile_sm90(H: int = 64, D: int = 128, clean_logits: bool = True, config: dict[str, Any] | None = None,
                 divisible: tuple[str, ...] = (), out_dtype: str = "fp32", candidates: bool = False):
    """Compile the kernel ahead of time for sm_90 (no GPU needed); returns triton's CompiledKernel.

    ``.asm["cubin"]`` holds the binary; disassemble it with the cuobjdump shipped with triton.
    ``divisible``: int parameters to compile as multiples of 16, as Triton specialises them at run
    time when they are (e.g. ``("out_stride", "N")`` for N % 16 == 0). ``out_dtype``: the logits'
    Triton type, ``"fp32"`` or ``"bf16"``. ``candidates``: the filter kernel (``_filter_kernel_pws``,
    persistent configs only) instead of the logits kernel.
    """
    reason = _triton_version_reason()
    if reason:
        raise RuntimeError(reason)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = resolve_config(H, config)
    name, kw = kernel_launch_args(cfg, H, clean_logits)
    if candidates:
        name, kw = "filter", filter_launch_args(kw)
    fn = _kernels()[name]
    lay = gl.NVMMASharedLayout.get_default_for([cfg["BQ"] * H, D], gl.float8e4nv)
    klay = gl.NVMMASharedLayout.get_default_for([cfg["BN"], D], gl.float8e4nv)

    def desc(shape, layout):
        return f"tensordesc<fp8e4nv[{shape[0]}, {shape[1]}],{layout!r}>"

    sig = {"q_desc": desc([cfg["BQ"] * H, D], lay), "k_desc": desc([cfg["BN"], D], klay), "w_ptr": "*fp32",
           "ksc_ptr": "*fp32", "ks_ptr": "*i32", "ke_ptr": "*i32", "out_ptr": f"*{out_dtype}", "out_stride": "i32",
           "M": "i32", "N": "i32"}
    if name == "pws":
        sig = {**{k: v for k, v in sig.items() if k not in ("out_stride", "M", "N")}, "sched_ptr": "*i32",
               "out_stride": "i32", "M": "i32", "N": "i32", "num_splits": "i32", "tps": "i32"}
    if name == "filter":
        sig = {**{k: v for k, v in sig.items() if k not in ("out_ptr", "out_stride", "M", "N")}, "pos_ptr": "*i32",
               "sched_ptr": "*i32", "val_ptr": "*fp32", "tau_ptr": "*fp32", "cnt_ptr": "*i32", "out_stride": "i32",
               "M": "i32", "N": "i32", "num_splits": "i32", "tps": "i32", "cap": "i32"}
    options = {"num_warps": kw.pop("num_warps")}
    if "maxnreg" in kw:
        options["maxnreg"] = kw.pop("maxnreg")
    constexprs = {}
    for key, val in kw.items():
        sig[key] = "constexpr"
        constexprs[(fn.arg_names.index(key), )] = val
    sig["num_warps"] = "constexpr"
    constexprs[(fn.arg_names.index("num_warps"), )] = options["num_warps"]
    aligned = ("pos_ptr", "val_ptr", "tau_ptr", "cnt_ptr") if name == "filter" else ("out_ptr", )
    attrs = {(fn.arg_names.index(p), ): [["tt.divisibility", 16]] for p in ("w_ptr", "ksc_ptr", "ks_ptr", "ke_ptr",
                                                                            *aligned, *divisible)}
    src = GluonASTSource(fn, sig, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
