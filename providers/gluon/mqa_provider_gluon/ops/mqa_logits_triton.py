"""fp8 MQA logits in portable Triton: one kernel for sm_90, gfx942, gfx950 and the interpreter.

A program owns ``BLOCK_M`` whole query rows (or a contiguous slice of their key tiles, when M is too
small to fill the device). Per key tile it runs one fp8 dot ``k[BLOCK_N, D] x q^T[D, BLOCK_M*H]``:
keys sit on the MMA's M side and the heads of its queries on the N side, so the head reduction of
``relu(s) * w`` is a sum along columns that each thread mostly holds itself (a few shuffles, no
shared memory), as in DeepGEMM's sm_90 kernel. Key tiles outside every window of the block are not
computed; with ``clean_logits`` the same program fills them with -inf, so every cell has one writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from ..fp8 import e4m3fn_to_e4m3fnuz, wants_fnuz

__all__ = ["TritonConfig", "constexprs", "default_config", "fp8_mqa_logits_triton", "kernel"]

#: The output's row stride is rounded up to this many floats, so each row starts 64-byte aligned.
_ROW_ALIGN = 16


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """Launch shape. ``block_m`` queries x H heads form the dot's N side, so keep block_m*H <= 256."""

    block_m: int = 2
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    #: Load key tiles with TMA (NVIDIA sm_90+ only; elsewhere, or for unaligned k, plain loads).
    tma: bool = False

    def __post_init__(self) -> None:
        for k in ("block_m", "block_n", "num_warps"):
            v = getattr(self, k)
            if v < 1 or v & (v - 1):
                raise ValueError(f"TritonConfig.{k} must be a power of two, got {v}")
        if self.block_n < 16:
            raise ValueError(f"TritonConfig.block_n must be >= 16 (an MMA tile), got {self.block_n}")
        if self.num_stages < 1:
            raise ValueError(f"TritonConfig.num_stages must be >= 1, got {self.num_stages}")

    def __str__(self) -> str:
        tma = "tma" if self.tma else ""
        return f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}{tma}"


def default_config(arch: str, h: int) -> TritonConfig:
    """A config that compiles without spills on ``arch`` for ``h`` heads; the bench sweeps the rest.

    128 query-heads per tile keep the fp32 accumulator and the per-column weights within about 150
    registers, so three programs share an SM and one's head reduction hides another's MMAs. On
    sm_90 TMA loads the key tiles: fewer instructions and registers than pointer loads.
    """
    block_m = max(1, 128 // triton.next_power_of_2(h))
    if arch.startswith("gfx"):
        return TritonConfig(block_m=block_m, block_n=64, num_warps=4, num_stages=2)
    return TritonConfig(block_m=block_m, block_n=64, num_warps=4, num_stages=3,
                        tma=arch.startswith("sm_"))


def constexprs(cfg: TritonConfig, h: int, d: int, clean_logits: bool, tma: bool = False
               ) -> dict[str, Any]:
    """The kernel's compile-time arguments. Heads and head dim are padded to powers of two (padded
    heads get weight 0, padded dims q = k = 0), the dot's N side to >= 16 and its K side to >= 32."""
    return {"H": h, "H_PAD": max(16 // cfg.block_m, triton.next_power_of_2(h)), "D": d,
            "D_PAD": _d_pad(d), "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
            "CLEAN": bool(clean_logits), "USE_TMA": tma}


def _d_pad(d: int) -> int:
    return max(32, triton.next_power_of_2(d))


def _mqa_logits_kernel(
    q_ptr, k_ptr, k_desc, kscale_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr,
    M, N, stride_qm, stride_qh, stride_kn, stride_kscale, stride_wm, stride_om,
    num_splits, tiles_per_split,
    H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CLEAN: tl.constexpr, USE_TMA: tl.constexpr,
):
    # Heaviest query blocks first: in causal prefill the last queries see the most keys, and
    # scheduling the long programs first shortens the tail. Consecutive programs share a query block.
    pid = tl.program_id(0)
    num_mb = tl.cdiv(M, BLOCK_M)
    split = pid % num_splits
    mb = num_mb - 1 - pid // num_splits
    m0 = mb * BLOCK_M

    # The block's windows, clamped to [0, N); an empty window contributes no tile.
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    ks = tl.maximum(tl.load(ks_ptr + offs_m, mask=m_ok, other=0), 0)
    ke = tl.minimum(tl.load(ke_ptr + offs_m, mask=m_ok, other=0), N)
    nonempty = ks < ke
    # ks <= n < ke as one unsigned compare: (n - ks) < width, with width 0 for an empty window.
    width = tl.maximum(ke - ks, 0).to(tl.uint32, bitcast=True)
    lo = tl.min(tl.where(nonempty, ks, N), axis=0)
    hi = tl.max(tl.where(nonempty, ke, 0), axis=0)

    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, tl.cdiv(N, BLOCK_N))
    # Computed tiles [c_begin, c_end) lie inside this split's [t_begin, t_end), so the -inf fill
    # below never touches another split's tiles.
    c_begin = tl.minimum(tl.maximum(t_begin, lo // BLOCK_N), t_end)
    c_end = tl.maximum(tl.minimum(t_end, tl.cdiv(hi, BLOCK_N)), c_begin)

    # Rows of the dot's N side: r = query * H_PAD + head. Padded heads load q = 0 and weight 0.
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
    out_rows = out_ptr + offs_m[None, :].to(tl.int64) * stride_om
    k_ptrs = (k_ptr + (c_begin * BLOCK_N + offs_n0)[:, None].to(tl.int64) * stride_kn
              + offs_d[None, :])
    for t in range(c_begin, c_end):
        offs_n = t * BLOCK_N + offs_n0
        n_ok = offs_n < N
        if USE_TMA:  # rows >= N and columns >= D arrive as zeros
            k = k_desc.load([t * BLOCK_N, 0])
        else:
            k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            k_ptrs += BLOCK_N * stride_kn
        s = tl.dot(k, q_t)  # [BLOCK_N, ROWS] fp32
        s = tl.maximum(s, 0.0) * w[None, :]
        logits = tl.sum(tl.reshape(s, (BLOCK_N, BLOCK_M, H_PAD)), axis=2)  # [BLOCK_N, BLOCK_M]
        scale = tl.load(kscale_ptr + offs_n * stride_kscale, mask=n_ok, other=0.0)
        logits = logits * scale[:, None]
        if CLEAN:
            rel = (offs_n[:, None] - ks[None, :]).to(tl.uint32, bitcast=True)
            logits = tl.where(rel < width[None, :], logits, float("-inf"))
        tl.store(out_rows + offs_n[:, None], logits, mask=n_ok[:, None] & m_ok[None, :])

    if CLEAN:
        # Tiles of this split outside every window of the block: nobody computed them.
        ninf = tl.full((BLOCK_N, BLOCK_M), float("-inf"), tl.float32)
        for t in range(t_begin, c_begin):
            offs_n = t * BLOCK_N + offs_n0
            tl.store(out_rows + offs_n[:, None], ninf, mask=(offs_n < N)[:, None] & m_ok[None, :])
        for t in range(c_end, t_end):
            offs_n = t * BLOCK_N + offs_n0
            tl.store(out_rows + offs_n[:, None], ninf, mask=(offs_n < N)[:, None] & m_ok[None, :])


@functools.lru_cache(maxsize=2)
def _jitted(interpret: bool) -> Any:
    """The kernel jitted for one mode. ``triton.jit`` fixes interpreter-or-compiled when it runs,
    so decorating at import would freeze whatever TRITON_INTERPRET said then."""
    with triton.knobs.runtime.scope():  # restores the knob and TRITON_INTERPRET afterwards
        triton.knobs.runtime.interpret = interpret
        # Sizes and split counts vary per call; specialising on them (== 1, % 16) would compile
        # several variants of one config for no gain. Strides keep their (16-aligned) hints.
        return triton.jit(_mqa_logits_kernel,
                          do_not_specialize=["M", "N", "num_splits", "tiles_per_split"])


def kernel(interpret: bool | None = None) -> Any:
    """The jitted kernel for ``interpret`` (default: what TRITON_INTERPRET says now)."""
    return _jitted(bool(triton.knobs.runtime.interpret) if interpret is None else interpret)


@functools.lru_cache(maxsize=1)
def _interpreted_stdlib() -> dict[str, Any]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return {name: InterpretedFunction(fn.fn) for name, fn in vars(tl).items()
            if isinstance(fn, JITFunction)}


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """Run the interpreter as if TRITON_INTERPRET had been set before triton was imported, and
    leave triton as it was found.

    Triton 3.6's interpreter has these gaps when the mode is switched on after import (as a test or
    a CPU caller does), each closed here for the duration of a launch: ``tl.sum``, ``tl.max``,
    ``tl.cdiv``... were jitted at import as compiled-only functions, which it refuses to call, so
    they are swapped for interpreted twins; it turns its shape-(1,) scalars into loop bounds with
    ``int()``, which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream by #9172); it
    cannot type a pointer to e4m3fnuz, though it computes with it; and each call of an interpreted
    helper patches the ``tl`` namespaces for the interpreter without undoing it, after which no
    kernel compiles in this process, so every namespace it touches is put back on exit.
    """
    from triton.runtime import interpreter

    spaces = (tl, tl.core, tl.math, tl.tensor, tl.dtype, tl.core.tensor_descriptor_base)
    saved = [(ns, dict(vars(ns))) for ns in spaces]
    saved_tensor, saved_core = interpreter._patch_lang_tensor, interpreter._patch_lang_core

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        saved_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def patch_lang_core(lang: Any, scope: Any) -> None:
        saved_core(lang, scope)
        to_ir = lang.dtype.to_ir

        def fnuz_to_ir(self: Any, builder: Any) -> Any:
            return builder.get_fp8e4b8_ty() if self.name == "fp8e4b8" else to_ir(self, builder)

        scope.set_attr(lang.dtype, "to_ir", fnuz_to_ir)

    try:
        for name, fn in _interpreted_stdlib().items():
            setattr(tl, name, fn)
        interpreter._patch_lang_tensor = patch_lang_tensor
        interpreter._patch_lang_core = patch_lang_core
        yield
    finally:
        interpreter._patch_lang_tensor, interpreter._patch_lang_core = saved_tensor, saved_core
        for ns, before in saved:
            for name, value in list(vars(ns).items()):
                if name not in before:
                    delattr(ns, name)
                elif before[name] is not value:
                    setattr(ns, name, before[name])


def _arch_of(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    from mqa_core.arch import arch_of_device

    return arch_of_device(device)


def _k_descriptor(k: torch.Tensor, cfg: TritonConfig, arch: str) -> Any | None:
    """A host TMA descriptor for key tiles, or None where TMA does not apply (not NVIDIA sm_90+,
    k not 16-byte aligned, a row wider than one 128-byte swizzle)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    d_pad = _d_pad(k.shape[1])
    usable = (arch == "cpu" or (arch.startswith("sm_") and int(arch[3:]) >= 90)) and d_pad <= 128
    if not usable or k.data_ptr() % 16 or k.stride(0) % 16:
        return None
    return TensorDescriptor(k, list(k.shape), [k.stride(0), 1], [cfg.block_n, d_pad])


def _new_output(m: int, n: int, device: torch.device) -> torch.Tensor:
    """[m, n] fp32 whose rows start 64-byte aligned (the row stride is n rounded up to 16)."""
    row = triton.cdiv(max(n, 1), _ROW_ALIGN) * _ROW_ALIGN
    return torch.empty((m, row), dtype=torch.float32, device=device)[:, :n]


def _num_programs_wanted(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def fp8_mqa_logits_triton(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
                          weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor,
                          clean_logits: bool = True, *,
                          config: TritonConfig | None = None) -> torch.Tensor:
    """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) for ks[m] <= n < ke[m].

    Inputs follow DESIGN.md's contract (fp8 q [M, H, D] and k [N, D] of one dtype, k_scale [N] or
    [N, 1], weights [M, H] fp32, int32 windows). Returns [M, N] fp32 as a view of a buffer whose rows
    are padded to 16 floats. e4m3fn inputs on gfx942 are converted exactly to e4m3fnuz first.
    """
    interpret = bool(triton.knobs.runtime.interpret)
    if q.device.type != "cuda" and not interpret:
        raise RuntimeError(f"fp8_mqa_logits_triton got tensors on {q.device}: CPU tensors run only "
                           "under the Triton interpreter (set TRITON_INTERPRET=1)")
    m, h, d = q.shape
    n = k.shape[0]
    arch = _arch_of(q.device)
    if q.dtype == torch.float8_e4m3fn and wants_fnuz(arch):
        # The fnuz copies read as half the e4m3fn values; doubling k_scale and the weights (the
        # weights are q's per-head scale) undoes both halvings exactly.
        q, weights = e4m3fn_to_e4m3fnuz(q, weights)
        k, k_scale = e4m3fn_to_e4m3fnuz(k, k_scale)
    if k_scale.dim() == 2:
        k_scale = k_scale[:, 0]
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(1) != 1:
        k = k.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    ks = ks.to(torch.int32).contiguous()
    ke = ke.to(torch.int32).contiguous()

    cfg = config or default_config(arch, h)
    out = _new_output(m, n, q.device)
    if m == 0 or n == 0:
        return out

    num_mb = triton.cdiv(m, cfg.block_m)
    num_tiles = triton.cdiv(n, cfg.block_n)
    splits = max(1, min(num_tiles, triton.cdiv(_num_programs_wanted(q.device), num_mb)))
    tiles_per_split = triton.cdiv(num_tiles, splits)
    splits = triton.cdiv(num_tiles, tiles_per_split)
    k_desc = _k_descriptor(k, cfg, arch) if cfg.tma else None
    # Triton launches on the current device: make it q's.
    with _interpreting() if interpret else torch.cuda.device(q.device):
        kernel(interpret)[(num_mb * splits,)](
            q, k, k_desc, k_scale, weights, ks, ke, out,
            m, n, q.stride(0), q.stride(1), k.stride(0), k_scale.stride(0), weights.stride(0),
            out.stride(0), splits, tiles_per_split,
            **constexprs(cfg, h, d, clean_logits, tma=k_desc is not None),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    return out
