"""The problem shapes AITER's FlyDSL MQA-logits kernel compiles for; others go to the next provider.

Read from ROCm/aiter (never copied); line numbers are those of tag v0.1.20.post1 (``de07f3885e``),
``aiter/ops/flydsl/kernels/mqa_logits/fp8_mqa_logits.py``, the same code as v0.1.18's
``kernels/fp8_mqa_logits.py``:

- H and D powers of two: the entry asserts both (lines 484-485).
- H a multiple of the MFMA atom's rows, D of its K step: the builder asserts ``H % MFMA_M == 0`` and
  ``D % MFMA_K == 0`` (lines 118-124) for gfx942's 16x16x32 atom. The gfx950 path (ROCm/aiter#4538,
  later ``aiter/ops/flydsl/fp8_mqa_logits_kernels.py``) picks a 32x32x64 variant for every H on its
  own (``_auto_variant``) and ``_resolve_variant`` refuses H % 32 != 0; the adapter zero-pads H=16
  to 32 there, so H=16 is declared on both archs.
- No upper bound on H: nothing asserts one; the builder unrolls ``H // MFMA_M`` head tiles at compile
  time, so H=256 and H=512 build (with more registers per lane).
- D in {64, 128}: ``compile_fp8_mqa_logits`` documents "D in {64, 128}", AITER's own dispatcher
  offers the FlyDSL backend only for head_dim 64 or 128 (``flydsl_supports``), and its tests sweep
  those two. gfx942's builder alone would take D=32 or 256; nobody tested them, so they are not
  declared.
- 32-bit offsets: q is addressed as ``(row * H + h) * D`` bytes in int32 (lines 237-238) over rows
  padded up to a multiple of the rows-per-block (at most 4, lines 383-385 and 525-536), k as ``col * D``
  (lines 283-285). The output's row offset is 64-bit (lines 181-192), so M*N is not limited.
"""

from __future__ import annotations

from mqa_core import Problem

#: Head dims AITER builds, documents and tests the kernel for.
HEAD_DIMS = (64, 128)
#: Heads come in MFMA tiles of 16 rows (gfx942's atom; the adapter pads 16 up to gfx950's 32).
HEAD_MULTIPLE = 16
#: AITER pads query rows up to a multiple of its rows-per-block, at most this many.
MAX_ROWS_PER_BLOCK = 4
#: q and k byte offsets are int32 inside the kernel.
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
    rows = -(-m // MAX_ROWS_PER_BLOCK) * MAX_ROWS_PER_BLOCK
    if rows * h * d >= MAX_OFFSET:
        broken.append(f"M*H*D={rows * h * d} (M padded to {rows}) overflows the kernel's int32 q "
                      "offsets (< 2**31)")
    if n * d >= MAX_OFFSET:
        broken.append(f"N*D={n * d} overflows the kernel's int32 k offsets (< 2**31)")
    if not broken:
        return None
    return "AITER's FlyDSL kernel does not compile this shape: " + "; ".join(broken)
