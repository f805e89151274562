"""fp8 paged MQA logits (the decode op) in portable Triton, over DeepGEMM's paged cache layout.

Decode is memory-bound: every visible cache byte is read once and each is used by all ``next_n * H``
query rows of its sequence. So a program owns one sequence and a contiguous range of position tiles:
it keeps that sequence's ``next_n * H`` query rows as the loop-invariant operand of one fp8 dot per
tile, ``k[TILE, D] x q^T[D, next_n*H]``, and streams the tiles, each found through the block table
(a tile lies inside one cache block whenever ``block_size % TILE == 0``; otherwise each row looks its
block up). Keys sit on the MMA's M side and the query heads on its N side, so the head reduction of
``relu(s) * w`` stays mostly inside each thread, as in the prefill kernel. Tiles past the sequence's
context are never loaded; with ``clean_logits`` the same program fills them with -inf.

Cache block ``b`` holds ``block_size * D`` fp8 bytes (token-major) and then ``block_size`` float32
scales, so the kernel reads values through an fp8 view of the cache and scales through a float32
view of the same bytes. On gfx942 (whose MFMA reads fp8 as e4m3fnuz) e4m3fn cache bytes are
re-labelled in registers (same byte = half the value, see ``fp8.py``) and the scale doubled, because
converting the whole cache per call would cost more than the op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
from typing import Any

import torch
import triton
import triton.language as tl

from ..fp8 import e4m3fn_to_e4m3fnuz, wants_fnuz
from .mqa_logits_triton import _interpreting  # the interpreter fixes of Triton 3.6, shared

__all__ = ["PagedConfig", "compile_for", "default_config", "fp8_paged_mqa_logits_triton", "kernel"]

#: Output rows are padded to this many floats (64 bytes), the layout torch.ops.mqa declares.
_ROW_ALIGN = 16
#: At most this many query rows (next_n * padded H) per program: the accumulator is TILE x ROWS fp32.
_MAX_ROWS = 128


@dataclasses.dataclass(frozen=True)
class PagedConfig:
    """Launch shape: ``tile`` positions per dot, ``programs_per_sm`` sets how finely the context is split."""

    tile: int = 64
    num_warps: int = 4
    num_stages: int = 6
    programs_per_sm: int = 4
    #: Load key tiles with TMA (NVIDIA sm_90+, block_size % tile == 0, D in {64, 128}; else plain loads).
    tma: bool = False

    def __post_init__(self) -> None:
        for k in ("tile", "num_warps"):
            v = getattr(self, k)
            if v < 1 or v & (v - 1):
                raise ValueError(f"PagedConfig.{k} must be a power of two, got {v}")
        if self.tile < 16:
            raise ValueError(f"PagedConfig.tile must be >= 16 (an MMA tile), got {self.tile}")
        if self.num_stages < 1 or self.programs_per_sm < 1:
            raise ValueError("PagedConfig.num_stages and programs_per_sm must be >= 1")

    def __str__(self) -> str:
        tma = "tma" if self.tma else ""
        return f"t{self.tile}w{self.num_warps}s{self.num_stages}p{self.programs_per_sm}{tma}"


def default_config(arch: str, block_size: int) -> PagedConfig:
    """64-position tiles (one block of DeepGEMM's 64-token layout; smaller blocks are gathered per
    row). On sm_90 six stages give three key buffers, so two tiles stay in flight while one is
    multiplied: the block-id load ahead of each key load costs the pipeline half its depth."""
    if arch.startswith("gfx"):
        return PagedConfig(tile=64, num_warps=4, num_stages=2)
    return PagedConfig(tile=64, num_warps=4, num_stages=6)


def _paged_kernel(
    q_ptr, kv_ptr, kv_desc, kvs_ptr, w_ptr, cl_ptr, bt_ptr, out_ptr,
    max_ctx, covered, block_bytes, block_words, num_splits, tiles_per_split,
    stride_qb, stride_qn, stride_qh, stride_wm, stride_clb, stride_clj, stride_btb, stride_om,
    NEXT_N: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    NG: tl.constexpr, NUM_GROUPS: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr,
    LENS_2D: tl.constexpr, CLEAN: tl.constexpr, KV_FNUZ: tl.constexpr, USE_TMA: tl.constexpr,
):
    # Program order: query-row group fastest (the groups of one tile run together and share its
    # cache bytes through L2), then the splits of a sequence, then the sequence.
    pid = tl.program_id(0)
    g = pid % NUM_GROUPS
    rest = pid // NUM_GROUPS
    split = rest % num_splits
    b = rest // num_splits

    # Visible length of each query row of the group: lens[b] - next_n + j + 1, or lens[b, j].
    offs_j = g * NG + tl.arange(0, NG)
    j_ok = offs_j < NEXT_N
    if LENS_2D:
        lens = tl.load(cl_ptr + b * stride_clb + offs_j * stride_clj, mask=j_ok, other=0)
    else:
        lens = tl.load(cl_ptr + b * stride_clb) - NEXT_N + offs_j + 1
    lens = tl.where(j_ok, tl.minimum(lens, covered), 0)
    hi = tl.maximum(tl.max(lens, axis=0), 0)

    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, tl.cdiv(max_ctx, TILE))
    c_end = tl.maximum(tl.minimum(t_end, tl.cdiv(hi, TILE)), t_begin)

    # The dot's N side: r = query row * H_PAD + head; padded rows and heads load q = 0, weight 0.
    ROWS: tl.constexpr = NG * H_PAD
    offs_r = tl.arange(0, ROWS)
    r_j = g * NG + offs_r // H_PAD
    r_h = offs_r % H_PAD
    r_ok = (r_j < NEXT_N) & (r_h < H)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    q = tl.load(q_ptr + b * stride_qb + r_j[:, None] * stride_qn + r_h[:, None] * stride_qh
                + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    q_t = tl.trans(q)
    w = tl.load(w_ptr + (b * NEXT_N + r_j).to(tl.int64) * stride_wm + r_h, mask=r_ok, other=0.0)

    offs_t = tl.arange(0, TILE)
    out_rows = out_ptr + (b * NEXT_N + offs_j).to(tl.int64)[None, :] * stride_om
    table = bt_ptr + b.to(tl.int64) * stride_btb
    # The compiler pipelines the loads that feed the dot (block id, then keys) but not the scales,
    # so they are fetched one tile ahead by hand, from block ids fetched two tiles ahead; the
    # scale path's id loads are its own (carrying ids out of the loop would stop the pipelining).
    scale_next = _scales(kvs_ptr, _block_ids(table, t_begin, offs_t, hi, BS, TILE), t_begin, offs_t,
                         hi, block_words, BS, D, TILE)
    sblk_next = _block_ids(table, t_begin + 1, offs_t, hi, BS, TILE)
    for t in range(t_begin, c_end):
        pos = t * TILE + offs_t
        p_ok = pos < hi
        scale = scale_next
        scale_next = _scales(kvs_ptr, sblk_next, t + 1, offs_t, hi, block_words, BS, D, TILE)
        sblk_next = _block_ids(table, t + 2, offs_t, hi, BS, TILE)
        if USE_TMA:  # one block per tile: a [1, TILE, D] box of the [blocks, BS, D] values
            blk = tl.load(table + (t * TILE) // BS)
            k = tl.reshape(kv_desc.load([blk, (t * TILE) % BS, 0]), (TILE, D_PAD))
        else:
            row = _block_ids(table, t, offs_t, hi, BS, TILE) * block_bytes + (pos % BS) * D
            k_ptrs = kv_ptr + row[:, None] + offs_d[None, :]
            k_mask = p_ok[:, None] & d_ok[None, :]
            if not KV_FNUZ:
                k = tl.load(k_ptrs, mask=k_mask, other=0.0)
            else:  # e4m3fn bytes -> e4m3fnuz bytes of half the value (-0 -> +0, NaN -> NaN)
                k = tl.load(k_ptrs, mask=k_mask, other=0)
                k = tl.where(k == 0x80, tl.full((TILE, D_PAD), 0, tl.uint8), k)
                k = tl.where((k & 0x7F) == 0x7F, tl.full((TILE, D_PAD), 0x80, tl.uint8), k)
                k = k.to(tl.float8e4b8, bitcast=True)
                scale = scale * 2.0
        s = tl.dot(k, q_t)  # [TILE, ROWS] fp32
        s = tl.maximum(s, 0.0) * w[None, :]
        logits = tl.sum(tl.reshape(s, (TILE, NG, H_PAD)), axis=2) * scale[:, None]  # [TILE, NG]
        logits = tl.where(pos[:, None] < lens[None, :], logits, float("-inf"))
        tl.store(out_rows + pos[:, None], logits, mask=(pos < max_ctx)[:, None] & j_ok[None, :])

    if CLEAN:  # tiles of this split past the context: nobody computed them
        ninf = tl.full((TILE, NG), float("-inf"), tl.float32)
        for t in range(c_end, t_end):
            pos = t * TILE + offs_t
            tl.store(out_rows + pos[:, None], ninf, mask=(pos < max_ctx)[:, None] & j_ok[None, :])


def _block_ids(table, t, offs_t, hi, BS: tl.constexpr, TILE: tl.constexpr):
    """int64 [TILE] cache block of each position of tile ``t`` (0 past ``hi``: never dereferenced)."""
    pos = t * TILE + offs_t
    if BS % TILE == 0:  # the whole tile lies in one block: one id, broadcast
        blk = tl.load(table + (t * TILE) // BS, mask=t * TILE < hi, other=0).to(tl.int64)
        return tl.full((TILE,), 0, tl.int64) + blk
    return tl.load(table + pos // BS, mask=pos < hi, other=0).to(tl.int64)


def _scales(kvs_ptr, blk, t, offs_t, hi, block_words, BS: tl.constexpr, D: tl.constexpr,
            TILE: tl.constexpr):
    """float32 [TILE] scales of tile ``t``: they follow the BS * D value bytes of each block."""
    pos = t * TILE + offs_t
    return tl.load(kvs_ptr + blk * block_words + (BS * D) // 4 + pos % BS, mask=pos < hi, other=0.0)


@functools.lru_cache(maxsize=2)
def _jitted(interpret: bool) -> Any:
    """The kernel jitted for one mode. ``triton.jit`` fixes interpreter-or-compiled when it runs,
    so the kernel and the helpers it calls are jitted on first use per mode, not at import; the
    kernel gets its own globals in which the helper names are the same mode's jitted helpers."""
    with triton.knobs.runtime.scope():  # restores the knob and TRITON_INTERPRET afterwards
        triton.knobs.runtime.interpret = interpret
        scope = dict(_paged_kernel.__globals__)
        scope.update({f.__name__: triton.jit(f) for f in (_block_ids, _scales)})
        fn = types.FunctionType(_paged_kernel.__code__, scope, _paged_kernel.__name__,
                                _paged_kernel.__defaults__)
        # triton.jit reads constexpr parameters off the annotations, which FunctionType drops.
        fn.__annotations__ = dict(_paged_kernel.__annotations__)
        fn.__module__, fn.__qualname__ = _paged_kernel.__module__, _paged_kernel.__qualname__
        # Sizes and split counts vary per call: specialising on them would compile variants
        # for no gain. block_bytes and the strides keep their 16-divisibility hints.
        return triton.jit(fn, do_not_specialize=["max_ctx", "covered", "num_splits", "tiles_per_split"])


def kernel(interpret: bool | None = None) -> Any:
    """The jitted kernel for ``interpret`` (default: what TRITON_INTERPRET says now)."""
    return _jitted(bool(triton.knobs.runtime.interpret) if interpret is None else interpret)


def _arch_of(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    from mqa_core.arch import arch_of_device

    return arch_of_device(device)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return _cuda_sm_count(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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

    def constexprs(self, lens_2d: bool, clean: bool, kv_fnuz: bool, tma: bool) -> dict[str, Any]:
        return {"NEXT_N": self.next_n, "H": self.h, "H_PAD": self.h_pad, "D": self.d,
                "D_PAD": self.d_pad, "NG": self.ng, "NUM_GROUPS": self.groups,
                "BS": self.block_size, "TILE": self.tile,
                "LENS_2D": bool(lens_2d), "CLEAN": bool(clean), "KV_FNUZ": bool(kv_fnuz),
                "USE_TMA": bool(tma)}


def _kv_descriptor(values: torch.Tensor, shape: _Shape, arch: str) -> Any | None:
    """A host TMA descriptor viewing the cache values as [blocks, block_size, D] (rows D bytes apart,
    blocks block_bytes apart), or None where TMA does not apply."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    usable = arch == "cpu" or (arch.startswith("sm_") and int(arch[3:]) >= 90)
    if not usable or not shape.tma_ok() or values.data_ptr() % 16 or values.stride(0) % 16:
        return None
    return TensorDescriptor(values, [values.shape[0], shape.block_size, shape.d],
                            [values.stride(0), shape.d, 1], [1, shape.tile, shape.d])


def _new_output(m: int, n: int, device: torch.device) -> torch.Tensor:
    """[m, n] fp32 whose rows start 64-byte aligned (the row stride is n rounded up to 16)."""
    row = triton.cdiv(max(n, 1), _ROW_ALIGN) * _ROW_ALIGN
    return torch.empty((m, row), dtype=torch.float32, device=device)[:, :n]


def fp8_paged_mqa_logits_triton(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                                context_lens: torch.Tensor, block_tables: torch.Tensor,
                                max_context_len: int, clean_logits: bool = True, *,
                                config: PagedConfig | None = None) -> torch.Tensor:
    """``[B * next_n, max_context_len]`` float32 logits over the paged cache.

    Row ``b * next_n + j`` sees positions ``p < context_lens[b] - next_n + j + 1`` (or
    ``p < context_lens[b, j]`` for 2-D lens), capped by what ``block_tables`` covers; there
    ``out = scale[p] * sum_h weights[row, h] * relu(q[b, j, h] . k[p])``, elsewhere -inf when
    ``clean_logits`` (tiles no row of the program sees are left unwritten otherwise). Inputs follow
    the op's contract (``mqa_core.validate``); the result is a view of rows padded to 16 floats.
    No host synchronisation: safe to capture in a CUDA graph.
    """
    interpret = bool(triton.knobs.runtime.interpret)
    if q.device.type != "cuda" and not interpret:
        raise RuntimeError(f"fp8_paged_mqa_logits_triton got tensors on {q.device}: CPU tensors run "
                           "only under the Triton interpreter (set TRITON_INTERPRET=1)")
    b, next_n, h, d = q.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    if d % 16 or kv_cache.shape[-1] != d + 4:
        raise ValueError(f"fp8_paged_mqa_logits_triton needs D % 16 == 0 and kv_cache [..., D + 4]; "
                         f"got q {list(q.shape)}, kv_cache {list(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("fp8_paged_mqa_logits_triton: kv_cache must be contiguous (blocks are "
                         "addressed as num_blocks x block_size*(D+4) bytes)")
    arch = _arch_of(q.device)
    kv_fnuz = q.dtype == torch.float8_e4m3fn and wants_fnuz(arch)
    if kv_fnuz:  # q is small: convert it; the cache bytes are re-labelled inside the kernel
        q, weights = e4m3fn_to_e4m3fnuz(q, weights)
    if q.stride(3) != 1:
        q = q.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    lens_2d = context_lens.dim() == 2
    lens = context_lens if lens_2d else context_lens[:, None]

    out = _new_output(b * next_n, max_context_len, q.device)
    if out.numel() == 0:
        return out

    cfg = config or default_config(arch, block_size)
    shape = _Shape(next_n, h, d, block_size, cfg.tile)
    tiles = triton.cdiv(max_context_len, cfg.tile)
    wanted = cfg.programs_per_sm * _sm_count(q.device)  # the interpreter counts as one SM
    splits = max(1, min(tiles, triton.cdiv(wanted, b * shape.groups)))
    tiles_per_split = triton.cdiv(tiles, splits)
    splits = triton.cdiv(tiles, tiles_per_split)
    block_bytes = block_size * (d + 4)
    covered = min(max_context_len, block_tables.shape[1] * block_size)
    flat = kv_cache.view(num_blocks, block_bytes)
    values = flat if kv_fnuz else flat.view(q.dtype)
    desc = _kv_descriptor(values, shape, arch) if cfg.tma and not kv_fnuz else None
    with _interpreting() if interpret else contextlib.nullcontext():
        kernel(interpret)[(b * splits * shape.groups,)](
            q, values, desc, flat.view(torch.float32), weights, lens, block_tables, out,
            max_context_len, covered, block_bytes, block_bytes // 4, splits, tiles_per_split,
            q.stride(0), q.stride(1), q.stride(2), weights.stride(0), lens.stride(0), lens.stride(1),
            block_tables.stride(0), out.stride(0),
            **shape.constexprs(lens_2d, clean_logits, kv_fnuz, desc is not None),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return out


def compile_for(target: Any, *, next_n: int = 2, h: int = 64, d: int = 128, block_size: int = 64,
                lens_2d: bool = False, clean_logits: bool = True,
                config: PagedConfig | None = None) -> dict[str, Any]:
    """Compile ahead of time for a ``triton.backends.compiler.GPUTarget`` (no GPU needed) and return
    the asm dict (``ptx``/``cubin`` or ``amdgcn``) plus ``"metadata"``. The signature is what a real
    launch sees: 16-byte-aligned pointers and strides, unit inner strides of the lens."""
    from triton.compiler import ASTSource

    arch = f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch)
    cfg = config or default_config(arch, block_size)
    kv_fnuz = wants_fnuz(arch)
    fp8 = "*fp8e4b8" if kv_fnuz else "*fp8e4nv"
    fn = kernel(interpret=False)
    shape = _Shape(next_n, h, d, block_size, cfg.tile)
    tma = cfg.tma and target.backend == "cuda" and shape.tma_ok()
    constexprs = {**shape.constexprs(lens_2d, clean_logits, kv_fnuz, tma), "stride_clj": 1}
    if not tma:
        constexprs["kv_desc"] = None
    ptr_types = {"q_ptr": fp8, "kv_ptr": "*u8" if kv_fnuz else fp8, "kvs_ptr": "*fp32", "w_ptr": "*fp32",
                 "cl_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32",
                 "kv_desc": f"tensordesc<{fp8[1:]}[1,{cfg.tile},{shape.d_pad}]>"}
    signature = {a: ("constexpr" if a in constexprs else ptr_types.get(a, "i32")) for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if a.endswith("_ptr") and a != "cl_ptr"] + [
        "block_bytes", "block_words", "stride_qb", "stride_qn", "stride_qh", "stride_wm", "stride_om"]
    if (block_size * (d + 4)) % 64:  # block_words is divisible by 16 only then
        aligned.remove("block_words")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=target, options={"num_warps": cfg.num_warps,
                                                      "num_stages": cfg.num_stages})
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm
