"""mqa-provider-flydsl: AMD AITER's FlyDSL fp8 MQA-logits kernel for gfx942 (MI300/MI325) and gfx950
(MI350/MI355), offered to mqa-core.

This module is the entry point and stays light: it holds the spec only. The runtime check imports
AITER lazily (once, cached) and the kernel object loads when the provider is chosen.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mqa_core import ProviderSpec, hookimpl

from . import pairs, probe
from .limits import shape_limits

__all__ = ["SPEC", "mqa_providers"]

# Per-arch (q, k) dtype pairs (gfx942: every fn/fnuz combination, converted by AITER itself; gfx950:
# e4m3fn only). ProviderSpec gains ``dtype_pairs`` in a newer mqa-core: pass it only where the field
# exists, so this provider also loads under an mqa-core without it. There ``dtypes`` alone applies,
# and e4m3fn for both operands is the one pair true on both archs.
_PAIRS: dict[str, Any] = (
    {"dtype_pairs": pairs.DECLARED}
    if "dtype_pairs" in {f.name for f in dataclasses.fields(ProviderSpec)} else {}
)

SPEC = ProviderSpec(
    name="flydsl",
    ops=frozenset({"fp8_mqa_logits"}),
    archs=frozenset(probe.ARCHS),
    dtypes=frozenset({pairs.FN}),
    # Above gluon (200) and torch_ref (0): on MI355X it cut prefill indexer time 1.53x against Gluon.
    priority=300,
    load="mqa_provider_flydsl.kernel:KERNEL",
    check=probe.check,
    shape_limits=shape_limits,
    description="AMD AITER's FlyDSL fp8 MQA-logits kernel (gfx942, gfx950; needs ROCm, amd-aiter "
                "and flydsl)",
    **_PAIRS,
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    # Discovery runs once per process and again after mqa_core.reload(): the moment to forget what
    # an earlier probe learned about the installed AITER.
    probe.reset()
    return [SPEC]
