"""mqa-provider-gluon: Triton and Gluon fp8 MQA-logits kernels (entry point: specs only).

Two providers from one distribution: ``gluon`` (the Gluon warp-specialised kernel on sm_90 where the
installed Triton is one it was written for, the Triton kernel elsewhere) and ``triton`` (always the
portable Triton kernel, one notch lower), so the two can be A/B'd by name on the same build.
"""

from __future__ import annotations

import importlib.util
import os

from mqa_core import Problem, ProviderSpec, hookimpl

#: Archs whose paths are compiled in CI (AOT for AMD and NVIDIA) and, for sm_90, run on an H200.
ARCHS = ("sm_90", "sm_100", "gfx942", "gfx950", "cpu")
HEADS = (16, 32, 64, 128)
#: Both providers serve the logits ops and the indexer step: the fused Triton top-k for prefill, the
#: paged logits then the Triton radix select for decode, and that select alone (``topk_per_row``).
#: Their claims (deterministic, batch-invariant): no atomics decide a value or an order, and no
#: launch parameter that depends on the batch changes a logit's arithmetic (the kit certifies both).
OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits", "fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row")
HEAD_DIMS = (64, 128)
FN, FNUZ = "float8_e4m3fn", "float8_e4m3fnuz"
#: (q dtype, k dtype) pairs the kernels serve, per arch. The launcher follows this table
#: (``fp8.conversions``), so what is declared is what runs:
#: - gfx942's MFMA reads e4m3fnuz: fnuz operands go in untouched; an e4m3fn operand is relabelled
#:   exactly (half the value, its scale doubled). With an fnuz k only q, the small operand, is.
#: - NVIDIA and gfx950 multiply OCP e4m3 (gfx950 would upcast fnuz to fp16 MMAs). No exact fnuz ->
#:   e4m3fn relabelling exists (fnuz +-240 would be +-480), so fnuz is not served there.
#: - the CPU (Triton's interpreter) computes every pair as it is.
DTYPE_PAIRS: dict[str, frozenset[tuple[str, str]]] = {
    "gfx942": frozenset({(FNUZ, FNUZ), (FN, FNUZ), (FN, FN)}),
    "gfx950": frozenset({(FN, FN)}),
    "sm_90": frozenset({(FN, FN)}),
    "sm_100": frozenset({(FN, FN)}),
    "cpu": frozenset({(FN, FN), (FNUZ, FNUZ), (FN, FNUZ), (FNUZ, FN)}),
}
def check(arch: str) -> str | None:
    """Usable when Triton is importable; on the CPU only inside Triton's interpreter."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not importable: pip install triton (ROCm torch ships pytorch-triton-rocm)"
    if arch == "cpu" and os.environ.get("TRITON_INTERPRET", "") != "1":
        return "serves the CPU only in Triton's interpreter: set TRITON_INTERPRET=1 (slow; for tests)"
    return None


def shape_limits(p: Problem) -> str | None:
    if p.h == 1 and p.d == 1:  # topk_per_row's problem: rows x columns, no heads
        return None
    if p.h not in HEADS:
        return f"H={p.h} unsupported: the kernels are built for H in {HEADS}"
    if p.d not in HEAD_DIMS:
        return f"D={p.d} unsupported: the kernels are built for D in {HEAD_DIMS}"
    return None


def _spec(name: str, priority: int, attr: str, description: str) -> ProviderSpec:
    return ProviderSpec(name=name, ops=frozenset(OPS), archs=frozenset(ARCHS),
                        dtype_pairs=DTYPE_PAIRS, priority=priority, load=f"mqa_provider_gluon.kernels:{attr}",
                        check=check, shape_limits=shape_limits, description=description,
                        claims=frozenset({"deterministic", "batch_invariant"}))


SPECS = (
    _spec("gluon", 200, "GLUON", "Gluon warp-specialised wgmma kernel on sm_90, Triton kernel elsewhere"),
    _spec("triton", 150, "TRITON", "portable Triton kernel (fp8 tl.dot) on NVIDIA and AMD"),
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    return list(SPECS)
