"""Ahead-of-time builds of the Triton kernel for GPUs this machine lacks, and facts read from them.

``triton.compile`` with an explicit ``GPUTarget`` runs the whole backend on the CPU, so the AMD
builds can be checked for fp8 MFMA instructions and the sm_90 build for fp8 wgmma (QGMMA in SASS),
registers and spills without any GPU. The signature mirrors what the JIT sees at a real launch:
16-byte-aligned pointers and strides, a unit k_scale stride, and q/k pointers of the fp8 flavour the
launcher hands the kernel (each can be set, to build what a given (q, k) dtype pair launches).
"""

from __future__ import annotations

import collections
import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .fp8 import wants_fnuz
from .ops.mqa_logits_triton import TritonConfig, constexprs, default_config, kernel

__all__ = ["TARGETS", "TRITON_FP8", "AmdFacts", "SassFacts", "amd_facts", "compile_for", "mfma_formats",
           "mfma_ops", "sass", "sass_facts"]

#: The targets the provider is built for, by normalised arch name.
TARGETS = {
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "gfx950": GPUTarget("hip", "gfx950", 64),
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_100": GPUTarget("cuda", 100, 32),
}

#: Triton's pointer element type for each torch fp8 flavour (fp8e4b8 is AMD's e4m3fnuz).
TRITON_FP8 = {"float8_e4m3fn": "fp8e4nv", "float8_e4m3fnuz": "fp8e4b8"}

_ALIGNED = ("q_ptr", "k_ptr", "kscale_ptr", "w_ptr", "ks_ptr", "ke_ptr", "out_ptr",
            "stride_qm", "stride_qh", "stride_kn", "stride_wm", "stride_om")


def _target(name: str) -> GPUTarget:
    if name in TARGETS:
        return TARGETS[name]
    from mqa_core.arch import normalize_arch

    arch = normalize_arch(name)
    if arch not in TARGETS:
        raise ValueError(f"no AOT target for {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[arch]


def compile_for(target: str, *, h: int = 64, d: int = 128, config: TritonConfig | None = None,
                clean_logits: bool = True, q_dtype: str | None = None, k_dtype: str | None = None,
                out_dtype: str = "fp32", **extra: Any) -> dict[str, Any]:
    """Compile the kernel for ``target`` (``"sm_90"``, ``"gfx942"``, ``"gfx950"``) and return its asm
    dict (``ttgir``, ``ptx``/``cubin`` or ``amdgcn``/``hsaco``, ...), plus the compiled kernel's
    metadata under ``"metadata"``.

    ``q_dtype``/``k_dtype`` (torch names, :data:`TRITON_FP8`) are the pointer types the kernel is
    built for; by default e4m3fnuz on gfx942 and e4m3fn elsewhere, what the launcher passes for
    e4m3fn inputs. ``out_dtype``: the logits' Triton type, ``"fp32"`` or ``"bf16"``."""
    tgt = _target(target)
    arch = target if target in TARGETS else next(k for k, v in TARGETS.items() if v == tgt)
    cfg = config or default_config(arch, h)
    native = "float8_e4m3fnuz" if wants_fnuz(arch) else "float8_e4m3fn"
    q_fp8, k_fp8 = (f"*{_triton_fp8(t or native)}" for t in (q_dtype, k_dtype))
    fn = kernel(interpret=False)
    tma = cfg.tma and tgt.backend == "cuda"
    consts = {"stride_kscale": 1, **constexprs(cfg, h, d, clean_logits, tma=tma), **extra}
    if not tma:
        consts["k_desc"] = None
    types = {"q_ptr": q_fp8, "k_ptr": k_fp8,
             "k_desc": f"tensordesc<{k_fp8[1:]}[{cfg.block_n},{consts['D_PAD']}]>",
             "kscale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32",
             "ke_ptr": "*i32", "out_ptr": f"*{out_dtype}"}
    for p in fn.params:  # constexprs left at their defaults
        if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty:
            consts[p.name] = p.default
    signature = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in _ALIGNED}
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=tgt, options={"num_warps": cfg.num_warps,
                                                       "num_stages": cfg.num_stages})
    asm = dict(compiled.asm)
    asm["metadata"] = compiled.metadata
    return asm


def _triton_fp8(dtype: str) -> str:
    name = dtype.removeprefix("torch.")
    if name not in TRITON_FP8:
        raise ValueError(f"no Triton fp8 type for {dtype!r}; known: {', '.join(TRITON_FP8)}")
    return TRITON_FP8[name]


def mfma_ops(asm: dict[str, Any]) -> collections.Counter[str]:
    """Count of each ``v_mfma*`` instruction in an AMD build's ISA."""
    return collections.Counter(re.findall(r"^\s*(v_mfma_\w+)", asm["amdgcn"], re.MULTILINE))


#: gfx950's f8f6f4 MFMAs take each operand's format from a modifier: cbsz for A, blgp for B.
F8F6F4_FORMATS = {0: "fp8 e4m3", 1: "bf8 e5m2", 2: "fp6 e2m3", 3: "bf6 e3m2", 4: "fp4 e2m1"}


def mfma_formats(asm: dict[str, Any]) -> collections.Counter[tuple[str, str, str]]:
    """Count of ``(instruction, A format, B format)`` over the ``v_mfma*`` of an AMD build.

    For the f8f6f4 instructions the formats come from ``cbsz``/``blgp`` (absent means 0, fp8 e4m3);
    for the others from the name (``..._fp8_fp8``: both fp8 in the arch's own encoding, which is
    e4m3fnuz on gfx942).
    """
    out: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for line in asm["amdgcn"].splitlines():
        m = re.match(r"\s*(v_mfma_\w+)", line)
        if not m:
            continue
        op = m.group(1)
        if op.endswith("f8f6f4"):
            a, b = (int(x.group(1)) if (x := re.search(rf"{k}:(\d+)", line)) else 0
                    for k in ("cbsz", "blgp"))
            out[op, F8F6F4_FORMATS.get(a, str(a)), F8F6F4_FORMATS.get(b, str(b))] += 1
        else:
            kinds = op.split("_")[-2:]
            out[op, kinds[0], kinds[1]] += 1
    return out


@dataclass(frozen=True)
class AmdFacts:
    """Register use of an AMD build, from the code object's metadata in the ISA listing."""

    vgprs: int  # arch VGPRs + AGPRs
    agprs: int
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int
    occupancy: int  # waves per SIMD

    def __str__(self) -> str:
        return (f"vgprs={self.vgprs} agprs={self.agprs} spills={self.vgpr_spills}+{self.sgpr_spills} "
                f"scratch={self.scratch_bytes}B occupancy={self.occupancy}")


def amd_facts(asm: dict[str, Any]) -> AmdFacts:
    text = asm["amdgcn"]

    def grab(pattern: str) -> int:
        m = re.search(pattern, text, re.MULTILINE)
        return int(m.group(1)) if m else -1

    return AmdFacts(vgprs=grab(r"; TotalNumVgprs: (\d+)"), agprs=grab(r"; NumAgprs: (\d+)"),
                    vgpr_spills=grab(r"\.vgpr_spill_count:\s+(\d+)"),
                    sgpr_spills=grab(r"\.sgpr_spill_count:\s+(\d+)"),
                    scratch_bytes=grab(r"; ScratchSize: (\d+)"), occupancy=grab(r"; Occupancy: (\d+)"))


@dataclass(frozen=True)
class SassFacts:
    """What decides the speed of an sm_90 build: fp8 wgmma present, registers, spills."""

    qgmma: int  # fp8 warpgroup MMA instructions
    hgmma: int  # fp16/bf16 warpgroup MMA (should be 0: fp8 must not be upcast)
    mma_other: int  # HMMA/IMMA (pre-Hopper mma.sync)
    registers: int
    spill_stores: int  # STL instructions
    spill_loads: int  # LDL instructions
    shared_bytes: int

    def __str__(self) -> str:
        return (f"QGMMA={self.qgmma} HGMMA={self.hgmma} mma.sync={self.mma_other} "
                f"regs={self.registers} STL={self.spill_stores} LDL={self.spill_loads} "
                f"smem={self.shared_bytes}B")


def _nvidia_tool(name: str) -> str:
    return getattr(triton.knobs.nvidia, name).path


def sass(asm: dict[str, Any]) -> str:
    """The SASS of an sm_90 build, via the cuobjdump shipped with triton."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(asm["cubin"])
        return subprocess.run([_nvidia_tool("cuobjdump"), "-sass", str(path)], check=True,
                              capture_output=True, text=True).stdout


def sass_facts(asm: dict[str, Any]) -> SassFacts:
    """Count MMA kinds and spills in the SASS; registers from the build's metadata or the cubin."""
    text = sass(asm)
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text, re.MULTILINE)
    count = collections.Counter(op for op in ops)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(asm["cubin"])
        usage = subprocess.run([_nvidia_tool("cuobjdump"), "-res-usage", str(path)], check=True,
                               capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return SassFacts(
        qgmma=count["QGMMA"], hgmma=count["HGMMA"], mma_other=count["HMMA"] + count["IMMA"],
        registers=int(regs.group(1)) if regs else -1,
        spill_stores=count["STL"], spill_loads=count["LDL"],
        shared_bytes=int(getattr(asm["metadata"], "shared", 0)),
    )
