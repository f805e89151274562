"""mqa-provider-torch-ref: the exact, memory-bounded PyTorch reference provider (any arch).

This module is the entry point: it holds only the spec, so listing providers imports no kernel code.
"""

from __future__ import annotations

from mqa_core import DTYPE_PAIRS, ProviderSpec, hookimpl
from mqa_core.spec import FP4_PAIR

SPEC = ProviderSpec(
    name="torch_ref",
    ops={"fp8_mqa_logits", "fp8_paged_mqa_logits", "fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row"},
    archs={"any"},
    # Every fp8 (q, k) pair of the contract on every arch: the kernel upcasts q and k each from its own
    # dtype. FP4 (decoded exactly) on the CPU only, as the oracle of the format: on a GPU an FP4 call
    # should meet a kernel that serves it (deepgemm on sm_100) or a clear refusal, not a slow fallback.
    dtype_pairs={"any": DTYPE_PAIRS, "cpu": (*DTYPE_PAIRS, FP4_PAIR)},
    priority=0,
    # float64 dot products are exact and the head sum runs in one order (kernels.py): the same logits
    # and the same selection whatever the batch, call after call.
    claims={"deterministic", "batch_invariant"},
    load="mqa_provider_torch_ref.kernels:KERNELS",
    description="exact fp32 PyTorch on any device, chunked to a memory bound (MQA_TORCH_REF_MEMORY_MB)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    return [SPEC]
