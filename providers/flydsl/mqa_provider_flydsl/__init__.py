"""mqa-provider-flydsl: AMD AITER's FlyDSL fp8 MQA-logits kernel for gfx942 (MI300/MI325) and gfx950
(MI350/MI355), offered to mqa-core.

This module is the entry point and stays light: it holds the spec only. The runtime check imports
AITER lazily (once, cached) and the kernel object loads when the provider is chosen.
"""

from __future__ import annotations

from mqa_core import ProviderSpec, hookimpl

from . import pairs, probe
from .limits import shape_limits

__all__ = ["SPEC", "mqa_providers"]

SPEC = ProviderSpec(
    name="flydsl",
    ops=frozenset({"fp8_mqa_logits"}),
    archs=frozenset(probe.ARCHS),
    # Per arch (gfx942: every fn/fnuz combination, converted by AITER itself; gfx950: e4m3fn only).
    dtype_pairs=pairs.DECLARED,
    # Above gluon (200) and torch_ref (0): on MI355X it cut prefill indexer time 1.53x against Gluon.
    priority=300,
    load="mqa_provider_flydsl.kernel:KERNEL",
    check=probe.check,
    shape_limits=shape_limits,
    description="AMD AITER's FlyDSL fp8 MQA-logits kernel (gfx942, gfx950; needs ROCm, amd-aiter "
                "and flydsl)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    # Discovery runs once per process and again after mqa_core.reload(): the moment to forget what
    # an earlier probe learned about the installed AITER.
    probe.reset()
    return [SPEC]
