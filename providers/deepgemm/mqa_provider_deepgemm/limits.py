"""What DeepGEMM's MQA-logits kernels accept, read from its source; problems outside go to the next provider.

Source: DeepGEMM 54e2261 (paths from its repository root). The shape limits below hold for every arch
this provider declares (a problem carries no arch, so the sm_90 values, the narrower ones, apply):

- H: ``csrc/apis/attention.hpp:122-123`` (prefill) and ``:299-300`` (paged) accept H in {32, 64} on
  sm_90 and {8, 16, 32, 64} on sm_100; ``:160-163`` needs ``128 % H == 0`` (``block_q = 128 / H``).
- D: ``attention.hpp:124`` and ``:301`` accept D in {32, 64, 128}. DeepGEMM's own paged test runs only
  D=128 on sm_90 (``tests/test_attention.py:334``); this provider's ``cuda`` test also runs D=64.
- 32-bit sizes: the q TMA descriptor takes ``seq_len * num_heads`` as an ``int``
  (``csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp:102``), the logits row stride is an ``int``
  ``align(N + 256, 256)`` (``attention.hpp:166-170``) and the paged q descriptor takes
  ``batch_size * next_n * num_heads`` (``sm90_fp8_mqa_logits.hpp:336``): M*H and N + 512 stay below 2**31.

Limits that are not shape limits, and what the adapter (``kernel.py``) does about each:

- paged block size: 64 on sm_90 (``attention.hpp:308-309``, and the metadata ``:224``); 32 or 64 on
  sm_100 in the fp8_fp4 generation; 64 in the legacy one. A paged call's problem carries its block size,
  so shape limits pass a cache of another size to the next provider; the kernel object still refuses
  one at call time (a bound provider, or a problem built without it), naming the sizes (:data:`BLOCK_SIZES`).
- next_n: 1 or 2 on sm_90 (``sm90_fp8_mqa_logits.hpp:363``; the legacy generation everywhere). The
  adapter runs larger next_n in groups of :data:`MAX_NEXT_N`.
- k_scale: exactly [N], contiguous float32 (``attention.hpp:136-139``): [N, 1] is passed as a view.
- q, k contiguous (``:125``, ``:132``); weights must be contiguous although only ``stride(1) == 1`` is
  asserted (``:145``), because the weights TMA descriptor takes H as the row stride
  (``sm90_fp8_mqa_logits.hpp:109-110``); TMA needs 16-byte aligned bases and strides
  (``csrc/jit_kernels/impls/runtime_utils.hpp:113-136``).
- windows are read as ``uint32`` (``deep_gemm/include/deep_gemm/impls/sm90_fp8_mqa_logits.cuh:32-33``),
  a block's key range is ``end - start`` over its rows (``:133-143``) and the clean pass writes up to
  ``ke`` rounded up (``impls/smxx_clean_logits.cuh:44-70``): negative ks, ke > N and ke < ks would
  read or write out of bounds, so the adapter clamps to ``0 <= ks <= ke <= N``.
- paged context lengths: 2-D only in the fp8_fp4 generation (``attention.hpp:365``), and only the
  last column sizes each sequence's work (``scheduler/sm90_paged_mqa_logits.cuh:57`` and ``:189-190``);
  every row of a sequence gets values up to that length rounded up to 256 (``impls/
  sm90_fp8_paged_mqa_logits.cuh:195, 255, 327-328``) and nothing beyond. DeepGEMM cleans paged logits
  only for 1-D lengths (``attention.hpp:397-399``), so the adapter writes -inf itself, only where it
  must.
- paged kv_cache: ``stride(1) == D + 4``, ``stride(3) == 1`` and ``stride(0) % 4 == 0``
  (``attention.hpp:310-316``): strided page pools pass through untouched.
"""

from __future__ import annotations

from mqa_core import Problem

#: Heads every declared arch serves (sm_90's set; sm_100 also takes 8 and 16).
HEADS = (32, 64)
HEAD_DIMS = (32, 64, 128)
#: Largest next_n one paged call takes on every generation and arch; more runs in groups.
MAX_NEXT_N = 2
#: (generation, arch) -> paged block sizes the kernel takes.
BLOCK_SIZES = {
    ("fp8_fp4", "sm_90"): (64,),
    ("fp8_fp4", "sm_100"): (32, 64),
    ("legacy", "sm_90"): (64,),
    ("legacy", "sm_100"): (64,),
}
#: Block sizes every generation and arch takes: what shape limits can promise without knowing either.
COMMON_BLOCK_SIZES = (64,)
_INT32 = 2**31


def shape_limits(problem: Problem) -> str | None:
    """None when DeepGEMM's kernels take ``problem``, else every limit it breaks."""
    m, n, h, d = problem.m, problem.n, problem.h, problem.d
    broken = []
    if h not in HEADS:
        broken.append(f"H={h} is not one of {', '.join(map(str, HEADS))} (sm_90's heads)")
    if d not in HEAD_DIMS:
        broken.append(f"D={d} is not one of {', '.join(map(str, HEAD_DIMS))}")
    if m * h >= _INT32:
        broken.append(f"M*H={m * h} overflows the int32 q descriptor size (< 2**31)")
    if n + 512 >= _INT32:
        broken.append(f"N={n} overflows the int32 logits row stride (N + 512 < 2**31)")
    # A paged call's problem carries the cache's block size (None: a problem built without it).
    block_size = getattr(problem, "block_size", None)
    if block_size and block_size not in COMMON_BLOCK_SIZES:
        broken.append(f"paged block size {block_size} is not {COMMON_BLOCK_SIZES[0]}")
    if not broken:
        return None
    return "DeepGEMM's MQA-logits kernels do not take this shape: " + "; ".join(broken)
