"""mqa-provider-deepgemm: DeepGEMM's fp8 MQA-logits kernels (sm_90 Hopper, sm_100 Blackwell) offered to mqa-core.

This module is the entry point and stays light: it holds the spec only. The runtime check imports
``deep_gemm`` lazily (once per discovery, cached) and the kernel object loads when the provider is chosen.
"""

from __future__ import annotations

from mqa_core import ProviderSpec, hookimpl
from mqa_core.spec import FP4_PAIR

from . import probe
from .limits import shape_limits

__all__ = ["SPEC", "mqa_providers"]

SPEC = ProviderSpec(
    name="deepgemm",
    ops=frozenset({"fp8_mqa_logits", "fp8_paged_mqa_logits"}),
    archs=frozenset(probe.ARCHS),
    # DeepGEMM asserts torch::kFloat8_e4m3fn for q and k (csrc/apis/attention.hpp:126, :133, :303), and
    # serves FP4 (q_sf given: packed e2m1, UE8M0 scales of 32 packed in int32) on sm_100 only
    # (DG_HOST_ASSERT(arch_major == 10), attention.hpp:92, :261; 54e2261).
    dtype_pairs={"sm_90": {("float8_e4m3fn", "float8_e4m3fn")},
                 "sm_100": {("float8_e4m3fn", "float8_e4m3fn"), FP4_PAIR}},
    # Below gluon (200), above triton (150): gluon leads on causal and packed prefills, DeepGEMM on small
    # chunks and full windows; a tuning table (MQA_TUNING) picks per shape bucket.
    priority=180,
    load="mqa_provider_deepgemm.kernel:KERNEL",
    check=probe.check,
    shape_limits=shape_limits,
    description="DeepGEMM's fp8 MQA-logits kernels, prefill and paged decode (sm_90, sm_100; needs deep_gemm)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    # Discovery runs once per process and again after mqa_core.reload(): the moment to forget what
    # an earlier probe learned about the installed DeepGEMM.
    probe.reset()
    return [SPEC]
