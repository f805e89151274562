"""The problem shapes AITER's FlyDSL MQA-logits kernel compiles for; others go to the next provider.

Source: ROCm/aiter ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py`` (``flydsl_fp8_mqa_logits`` asserts
H and D are powers of two; ``compile_fp8_mqa_logits`` documents "powers of two, D in {64, 128}") and
``aiter/ops/flydsl/kernels/mqa_logits/fp8_mqa_logits.py`` (the builders assert ``H % MFMA_M == 0``
and ``D % MFMA_K == 0``: gfx942's 16x16x32 atom needs H % 16, gfx950's auto-selected 32x32x64 atom
needs H % 32, which the adapter meets for H=16 by zero-padding heads; Q and KV are addressed with
32-bit element offsets, ``row * H * D`` and ``col * D``, so those products must stay below 2**31).
"""

from __future__ import annotations

from mqa_core import Problem

#: Head dims AITER compiles the kernel for.
HEAD_DIMS = (64, 128)
#: Heads come in MFMA tiles of 16 rows (gfx942's atom; gfx950 pads 16 up to its 32).
HEAD_MULTIPLE = 16
#: Q and KV byte offsets are int32 inside the kernel.
MAX_OFFSET = 2**31


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def shape_limits(problem: Problem) -> str | None:
    """None when the FlyDSL kernel can run ``problem``, else every limit it breaks."""
    m, n, h, d = problem.m, problem.n, problem.h, problem.d
    broken = []
    if not _pow2(h) or h % HEAD_MULTIPLE:
        broken.append(f"H={h} is not a power of two >= {HEAD_MULTIPLE}")
    if d not in HEAD_DIMS:
        broken.append(f"D={d} is not one of {', '.join(map(str, HEAD_DIMS))}")
    if m * h * d >= MAX_OFFSET:
        broken.append(f"M*H*D={m * h * d} overflows the kernel's int32 q offsets (< 2**31)")
    if n * d >= MAX_OFFSET:
        broken.append(f"N*D={n * d} overflows the kernel's int32 k offsets (< 2**31)")
    if not broken:
        return None
    return "AITER's FlyDSL kernel does not compile this shape: " + "; ".join(broken)
