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
from triton.runtime.driver import driver

from ..fp8 import conversions, e4m3fn_to_e4m3fnuz
from ..launch import BoundKernel, bind, direct_launch_unsupported, hooks_active, residues

__all__ = ["PreparedCall", "TritonConfig", "constexprs", "default_config", "fp8_mqa_logits_triton", "kernel",
           "prepare"]

#: The output's row stride is rounded up to this many bytes, so each row starts 64-byte aligned.
_ROW_BYTES = 64


def _row(n: int, itemsize: int) -> int:
    """The output's row stride in elements for ``n`` columns of ``itemsize`` bytes."""
    align = _ROW_BYTES // itemsize
    return -(-max(n, 1) // align) * align


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
        if out_ptr.dtype.element_ty == tl.bfloat16:
            # bf16 logits: rounded once to nearest even, in the bits (the conversion that follows is then
            # exact: Triton's interpreter truncates where compiled code rounds). -inf keeps its bits.
            bits = logits.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            logits = bits.to(tl.float32, bitcast=True)
        tl.store(out_rows + offs_n[:, None], logits.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])

    if CLEAN:
        # Tiles of this split outside every window of the block: nobody computed them.
        ninf = tl.full((BLOCK_N, BLOCK_M), float("-inf"), tl.float32).to(out_ptr.dtype.element_ty)
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
    Triton 3.9's interpreter types a comparison's result as its operands' type (its values are
    bools), so a scalar comparison used as a load mask is splatted to integers and refused ("mask
    has unsupported dtype"): comparisons are typed int1 here, as compiled Triton types them.
    """
    from triton.runtime import interpreter

    spaces = (tl, tl.core, tl.math, tl.tensor, tl.dtype, tl.core.tensor_descriptor_base,
              interpreter.InterpreterBuilder)
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

    def typed_int1(compare: Any) -> Any:
        def run(self: Any, lhs: Any, rhs: Any) -> Any:
            out = compare(self, lhs, rhs)
            return out if out.dtype == tl.int1 else interpreter.TensorHandle(out.data.astype(bool), tl.int1)

        return run

    try:
        for name, fn in _interpreted_stdlib().items():
            setattr(tl, name, fn)
        for name, compare in vars(interpreter.InterpreterBuilder).items():
            if name.startswith(("create_icmp", "create_fcmp")):
                setattr(interpreter.InterpreterBuilder, name, typed_int1(compare))
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


# ---- the launcher: decided once per call signature, then only the launch ---------------------

def _device_facts(index: int) -> tuple[str, int]:
    """(arch, programs that fill the device) for a CUDA device index; ("cpu", 1) for -1."""
    if index < 0:
        return "cpu", 1
    from mqa_core.arch import arch_of_device

    device = torch.device("cuda", index)
    return arch_of_device(device), _num_programs_wanted(device)


def _num_programs_wanted(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def _k_descriptor(k: torch.Tensor, cfg: TritonConfig, arch: str) -> Any | None:
    """A host TMA descriptor for key tiles, or None where TMA does not apply (see :func:`_tma_usable`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not _tma_usable(arch, k.shape[1], k.data_ptr(), k.stride()):
        return None
    return TensorDescriptor(k, list(k.shape), [k.stride(0), 1], [cfg.block_n, _d_pad(k.shape[1])])


def _tma_usable(arch: str, d: int, k_ptr: int, k_stride: tuple[int, ...]) -> bool:
    """TMA key loads need NVIDIA sm_90+ (or the interpreter), a 16-byte aligned k with unit inner
    stride and 16-byte aligned rows, and a row no wider than one 128-byte swizzle."""
    nvidia = arch == "cpu" or (arch.startswith("sm_") and int(arch[3:]) >= 90)
    return nvidia and _d_pad(d) <= 128 and k_ptr % 16 == 0 and k_stride[0] % 16 == 0 and k_stride[1] == 1


def _new_output(m: int, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[m, n] logits (float32 or bfloat16) whose rows start 64-byte aligned."""
    return torch.empty_strided((m, n), (_row(n, dtype.itemsize), 1), dtype=dtype, device=device)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a call signature needs, decided on its first call: the kernel's fp8 format, copies,
    config and constexprs, TMA, and how many programs fill the device."""

    device: torch.device
    arch: str
    programs: int
    cfg: TritonConfig
    convert_q: bool  # e4m3fn q -> e4m3fnuz (weights doubled), for an fnuz MMA
    convert_k: bool  # e4m3fn k -> e4m3fnuz (k_scale doubled)
    prepare: bool  # some operand needs a conversion or a copy before the launch
    tma: bool
    consts: dict[str, Any]
    #: The constexprs in parameter order: the C launcher skips them, but counts them.
    tail: tuple[Any, ...]
    #: Whether later calls launch through a bound kernel (compiled for NVIDIA, a known triton).
    direct: bool


_CONSTEXPRS = ("H", "H_PAD", "D", "D_PAD", "BLOCK_M", "BLOCK_N", "CLEAN", "USE_TMA")
#: Plans and bound kernels per call signature (the key in fp8_mqa_logits_triton). Bounded: a process
#: sees a handful of signatures.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_BOUND: dict[tuple[Any, ...], Any] = {}
_CACHE_SIZE = 256


def clear_caches() -> None:
    """Forget every plan and bound kernel (tests that change what a device reports use this)."""
    _PLANS.clear()
    _BOUND.clear()


def _remember(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)), None)  # oldest first; a steady workload never gets here
    cache[key] = value


def _make_plan(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
               weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool,
               config: TritonConfig | None, interpret: bool) -> _Plan:
    arch, programs = _device_facts(q.get_device())
    if arch == "cpu" and not interpret:
        raise RuntimeError(f"fp8_mqa_logits_triton got tensors on {q.device}: CPU tensors run only "
                           "under the Triton interpreter (set TRITON_INTERPRET=1)")
    convert_q, convert_k = conversions(arch, q.dtype, k.dtype)
    h, d = q.shape[1], q.shape[2]
    cfg = config or default_config(arch, h)
    prepare = (convert_q or convert_k or q.stride(2) != 1 or k.stride(1) != 1 or weights.stride(1) != 1
               or k_scale.dtype != torch.float32 or weights.dtype != torch.float32
               or any(t.dtype != torch.int32 or t.stride(0) != 1 for t in (ks, ke)))
    # After preparation k is either this k (unit inner stride) or a fresh, aligned, contiguous copy.
    k_ptr, k_stride = (k.data_ptr(), k.stride()) if k.stride(1) == 1 and not convert_k else (0, (d, 1))
    tma = cfg.tma and _tma_usable(arch, d, k_ptr, k_stride)
    consts = constexprs(cfg, h, d, clean_logits, tma=tma)
    return _Plan(device=q.device, arch=arch, programs=programs, cfg=cfg, convert_q=convert_q,
                 convert_k=convert_k, prepare=prepare, tma=tma, consts=consts,
                 tail=tuple(consts[c] for c in _CONSTEXPRS),
                 direct=not interpret and arch.startswith("sm_") and direct_launch_unsupported() is None)


def _prepare(plan: _Plan, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
             ks: torch.Tensor, ke: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The operands in the kernel's format; each is touched only where it is not already right."""
    if plan.convert_q:
        # The fnuz copy reads as half the e4m3fn value; doubling the weights (q's per-head scale)
        # undoes it exactly. Likewise k with k_scale.
        q, weights = e4m3fn_to_e4m3fnuz(q, weights)
    if plan.convert_k:
        k, k_scale = e4m3fn_to_e4m3fnuz(k, k_scale)
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(1) != 1:
        k = k.contiguous()
    if k_scale.dtype != torch.float32:
        k_scale = k_scale.float()
    if weights.dtype != torch.float32:
        weights = weights.float()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    ks = ks if ks.dtype == torch.int32 and ks.stride(0) == 1 else ks.to(torch.int32).contiguous()
    ke = ke if ke.dtype == torch.int32 and ke.stride(0) == 1 else ke.to(torch.int32).contiguous()
    return q, k, k_scale, weights, ks, ke


def _on_device(index: int) -> contextlib.AbstractContextManager[Any]:
    """Triton launches on the current device: make it ``index`` unless it already is (or is the CPU)."""
    if index < 0 or driver.active.get_current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _signature(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
               ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool, config: TritonConfig | None,
               interpret: bool, ptrs: tuple[int, ...], logits_dtype: torch.dtype) -> tuple[Any, ...]:
    """The key of plans and bound kernels: everything the plan and Triton's specialisation read, except
    the sizes M and N (the kernel does not specialise on them; the grid is computed per call) and each
    tensor's data pointer (``ptrs``) beyond its 16-byte alignment."""
    misaligned = (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15
    return (q.get_device(), k.get_device(), k_scale.get_device(), weights.get_device(), ks.get_device(),
            ke.get_device(), interpret, clean_logits, config, q.dtype, k.dtype, k_scale.dtype, weights.dtype,
            ks.dtype, ke.dtype, q.shape[1], q.shape[2], q.stride(), k.stride(), k_scale.stride(), weights.stride(),
            ks.stride(), ke.stride(), misaligned and tuple(p & 15 == 0 for p in ptrs), logits_dtype)


def _grid(plan: _Plan, m: int, n: int) -> tuple[int, int, int]:
    """(programs, key splits, tiles per split): each block of queries' key tiles cut into enough
    splits that the programs fill the device."""
    num_mb = -(-m // plan.cfg.block_m)
    num_tiles = -(-n // plan.cfg.block_n)
    splits = max(1, min(num_tiles, -(-plan.programs // num_mb)))
    tiles_per_split = -(-num_tiles // splits)
    splits = -(-num_tiles // tiles_per_split)
    return num_mb * splits, splits, tiles_per_split


def fp8_mqa_logits_triton(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
                          weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor,
                          clean_logits: bool = True, *, config: TritonConfig | None = None,
                          direct: bool = True, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) for ks[m] <= n < ke[m].

    Inputs follow DESIGN.md's contract (fp8 q [M, H, D] and k [N, D], k_scale [N] or [N, 1], weights
    [M, H] fp32, int32 windows), in a (q, k) dtype pair the arch serves (``DTYPE_PAIRS``). Returns
    [M, N] logits of ``logits_dtype`` (float32, or bfloat16: each logit rounded once to nearest even
    as it is stored) whose rows start 64-byte aligned. On gfx942 an e4m3fn operand is
    relabelled exactly to e4m3fnuz first; nothing else is converted or copied unless its layout needs it.

    The first call of a signature (devices, dtypes, strides, alignments, config) decides all of that
    and launches through Triton; later ones, with ``direct`` (the default), launch the kernel Triton
    compiled then without Triton's per-call argument binding (see ``mqa_provider_gluon.launch``).
    """
    interpret = bool(triton.knobs.runtime.interpret)
    clean_logits = bool(clean_logits)
    m = q.shape[0]
    n = k.shape[0]
    ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
    key = _signature(q, k, k_scale, weights, ks, ke, clean_logits, config, interpret, ptrs, logits_dtype)
    plan = _PLANS.get(key)
    if plan is None:
        if len(set(key[:6])) != 1:
            raise ValueError("fp8_mqa_logits_triton: all tensors must be on one device; got "
                             f"{[str(t.device) for t in (q, k, k_scale, weights, ks, ke)]}")
        plan = _make_plan(q, k, k_scale, weights, ks, ke, clean_logits, config, interpret)
        _remember(_PLANS, key, plan)
    if plan.prepare:
        q, k, k_scale, weights, ks, ke = _prepare(plan, q, k, k_scale, weights, ks, ke)
        ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(),
                ke.data_ptr())
    out = _new_output(m, n, plan.device, logits_dtype)
    if m == 0 or n == 0:
        return out

    cfg = plan.cfg
    grid, splits, tiles_per_split = _grid(plan, m, n)
    row = out.stride(0)

    if direct and plan.direct and not (m | n | row) >> 31:
        bound = _BOUND.get(key)
        if bound and not hooks_active():
            strides = (q.stride(), k.stride(0), k_scale.stride(0), weights.stride(0))
            _launch_bound(bound, plan, grid, ptrs, strides, k, out.data_ptr(), m, n, row, splits, tiles_per_split)
            return out
    k_desc = _k_descriptor(k, cfg, plan.arch) if plan.tma else None
    with _interpreting() if interpret else _on_device(key[0]):
        compiled = kernel(interpret)[(grid,)](
            q, k, k_desc, k_scale, weights, ks, ke, out,
            m, n, q.stride(0), q.stride(1), k.stride(0), k_scale.stride(0), weights.stride(0),
            row, splits, tiles_per_split,
            **plan.consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if direct and plan.direct and key not in _BOUND:
            _remember(_BOUND, key, bind(compiled))
    return out


def _launch_bound(bound: BoundKernel, plan: _Plan, grid: int, ptrs: tuple[int, ...],
                  strides: tuple[Any, ...], k: torch.Tensor, out_ptr: int, m: int, n: int, row: int, splits: int,
                  tiles_per_split: int) -> None:
    """The arguments ``kernel[grid](...)`` would pass, straight to the bound kernel's launcher:
    pointers as ints (the launcher then skips its per-pointer driver query), descriptors cached.
    ``strides``: q's, then the row strides of k, k_scale and weights."""
    qs, skn, sks, swm = strides
    if plan.tma:
        k_desc = bound.descriptor((0, ptrs[1], n, skn), _k_descriptor, k, plan.cfg, plan.arch)
    else:
        k_desc = [None]
    index = plan.device.index
    drv = driver.active
    args = (ptrs[0], ptrs[1], *k_desc, ptrs[2], ptrs[3], ptrs[4], ptrs[5], out_ptr, m, n, qs[0], qs[1], skn, sks,
            swm, row, splits, tiles_per_split, *plan.tail)
    if index is None or drv.get_current_device() == index:
        bound(grid, 1, 1, drv.get_current_stream(index), args)
    else:
        with torch.cuda.device(index):
            bound(grid, 1, 1, drv.get_current_stream(index), args)


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """The bound launch of one full call signature, with everything that signature fixes (plan,
    grid, sizes, strides) worked out once: mqa-core's prepared call (its signature holds every
    tensor's type, shape, strides, dtype and device; with the start addresses' residues modulo 16,
    checked per call, that is a superset of :func:`_signature`, plus M and N). Per call it reads six
    pointers, allocates the output and launches; with the interpreter on, a Triton launch hook set
    (the hook sees the launch) or pointers of other residues it takes the full launcher, as
    :func:`fp8_mqa_logits_triton` would."""

    bound: BoundKernel
    plan: _Plan
    size: tuple[int, int]
    row: int
    grid: int
    splits: int
    tiles_per_split: int
    #: q's strides, then the row strides of k, k_scale and weights.
    strides: tuple[Any, ...]
    clean_logits: bool
    #: The six start addresses modulo 16 it was prepared for (``launch.residues``; None: all 0).
    residues: tuple[int, ...] | None
    logits_dtype: torch.dtype = torch.float32

    def __call__(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                 ks: torch.Tensor, ke: torch.Tensor, *, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``logits_dtype``: mqa-core's hint, which :func:`prepare` takes, so the call gets it too; the
        signature fixed it, and another one takes the full path."""
        k, k_scale = kv
        ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
        other_dtype = logits_dtype is not None and logits_dtype is not self.logits_dtype
        if triton.knobs.runtime.interpret or hooks_active() or other_dtype or (
                (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15 if self.residues is None
                else residues(ptrs) != self.residues):
            return fp8_mqa_logits_triton(q, k, k_scale, weights, ks, ke, self.clean_logits,
                                         logits_dtype=logits_dtype or self.logits_dtype)
        out = torch.empty_strided(self.size, (self.row, 1), dtype=self.logits_dtype, device=self.plan.device)
        _launch_bound(self.bound, self.plan, self.grid, ptrs, self.strides, k, out.data_ptr(), *self.size,
                      self.row, self.splits, self.tiles_per_split)
        return out


def prepare(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
            ke: torch.Tensor, clean_logits: bool = True, *, config: TritonConfig | None = None,
            logits_dtype: torch.dtype = torch.float32) -> PreparedCall | None:
    """The :class:`PreparedCall` for calls like this one, once a call of its signature has bound a
    launch; None where such calls do not take the bound launch (the interpreter, a Triton without
    direct launches, ROCm, operands that need a conversion or copy, an empty output, sizes past 32
    bits). Arguments as for :func:`fp8_mqa_logits_triton`, already checked by it on an earlier call."""
    if triton.knobs.runtime.interpret:
        return None
    clean_logits = bool(clean_logits)
    ptrs = (q.data_ptr(), k.data_ptr(), k_scale.data_ptr(), weights.data_ptr(), ks.data_ptr(), ke.data_ptr())
    key = _signature(q, k, k_scale, weights, ks, ke, clean_logits, config, False, ptrs, logits_dtype)
    plan, bound = _PLANS.get(key), _BOUND.get(key)
    m, n = q.shape[0], k.shape[0]
    row = _row(n, logits_dtype.itemsize)  # as _new_output
    if plan is None or not bound or plan.prepare or not plan.direct or not (m and n) or (m | n | row) >> 31:
        return None
    grid, splits, tiles_per_split = _grid(plan, m, n)
    return PreparedCall(bound, plan, (m, n), row, grid, splits, tiles_per_split,
                        (q.stride(), k.stride(0), k_scale.stride(0), weights.stride(0)), clean_logits,
                        residues(ptrs), logits_dtype)
