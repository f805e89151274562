"""mqa-provider-torch-ref: the exact, memory-bounded PyTorch reference provider (any arch).

This module is the entry point: it holds only the spec, so listing providers imports no kernel code.
"""

from __future__ import annotations

from mqa_core import DTYPE_PAIRS, ProviderSpec, hookimpl

SPEC = ProviderSpec(
    name="torch_ref",
    ops={"fp8_mqa_logits", "fp8_paged_mqa_logits"},
    archs={"any"},
    # Every (q, k) pair of the contract on every arch: the kernel upcasts q and k each from its own dtype.
    dtype_pairs=DTYPE_PAIRS,
    priority=0,
    load="mqa_provider_torch_ref.kernels:KERNELS",
    description="exact fp32 PyTorch on any device, chunked to a memory bound (MQA_TORCH_REF_MEMORY_MB)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    return [SPEC]
