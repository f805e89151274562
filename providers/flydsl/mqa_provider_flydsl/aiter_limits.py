"""The problem shapes the ``aiter`` provider sends to AITER's Triton/Gluon kernels; others go to the
next provider.

Read from ROCm/aiter at ``e4048607a5`` (never copied):

- prefill (``aiter/ops/triton/attention/fp8_mqa_logits.py``): H and D powers of two (asserted); the
  Triton kernel's ``tl.dot`` takes the heads as its M side. AITER's own test sweeps H in {32, 64} and
  D in {64, 128} (``op_tests/triton_tests/attention/test_fp8_mqa_logits.py``), and its gfx950 Gluon
  heuristics are tuned for those; that is what is declared. The Gluon kernel loads q with 32-bit
  buffer offsets (``_gluon_kernels/gfx950/attention/fp8_mqa_logits.py``; only KV and the logits fall
  back to 64-bit pointers past 2 GiB), so M*H*D stays below 2**31.
- decode (``aiter/ops/triton/gluon/pa_mqa_logits.py``): the Gluon kernels take ``ChunkQ = H`` as
  ``H / 32`` rows per thread at D = 128 (``ValQMPerThread``), and the preshuffled one addresses its
  16-token tiles as 16 x 128 bytes (``offset_k_fixed``): H in {32, 64} (what vLLM and AITER's bench
  use) and D = 128. Blocks of 1 token (per-token paging) or a multiple of 16 that divides ChunkK = 256
  or is divided by it (``deepgemm_fp8_paged_mqa_logits`` asserts both).
"""

from __future__ import annotations

from mqa_core import Problem

PREFILL_HEADS = (32, 64)
PREFILL_HEAD_DIMS = (64, 128)
PAGED_HEADS = (32, 64)
PAGED_HEAD_DIM = 128
CHUNK_K = 256
#: q's buffer offsets are int32 in the gfx950 Gluon kernel.
MAX_OFFSET = 2**31


def block_size_ok(bs: int) -> bool:
    return bs == 1 or (bs % 16 == 0 and (CHUNK_K % bs == 0 or bs % CHUNK_K == 0))


def shape_limits(problem: Problem) -> str | None:
    """None when AITER's kernels take ``problem``, else every limit it breaks. A paged problem
    carries ``block_size`` (and ``next_n``); a prefill one does not."""
    m, h, d = problem.m, problem.h, problem.d
    broken = []
    if problem.block_size is None:  # prefill
        if h not in PREFILL_HEADS:
            broken.append(f"H={h} is not one of {', '.join(map(str, PREFILL_HEADS))}")
        if d not in PREFILL_HEAD_DIMS:
            broken.append(f"D={d} is not one of {', '.join(map(str, PREFILL_HEAD_DIMS))}")
        if m * h * d >= MAX_OFFSET:
            broken.append(f"M*H*D={m * h * d} overflows the Gluon kernel's int32 q offsets (< 2**31)")
    else:
        if h not in PAGED_HEADS:
            broken.append(f"H={h} is not one of {', '.join(map(str, PAGED_HEADS))} (the paged kernels' head tiles)")
        if d != PAGED_HEAD_DIM:
            broken.append(f"D={d} is not {PAGED_HEAD_DIM} (the preshuffled layout's 128-byte rows)")
        if not block_size_ok(problem.block_size):
            broken.append(f"block_size={problem.block_size} is neither 1 nor a multiple of 16 that divides "
                          f"or is divided by ChunkK={CHUNK_K}")
    if not broken:
        return None
    return "AITER's Triton/Gluon MQA-logits kernels do not take this shape: " + "; ".join(broken)
