"""mqa-provider-flydsl: AMD AITER's MQA-logits kernels for gfx942 (MI300/MI325) and gfx950 (MI350/MI355),
offered to mqa-core as two providers: ``flydsl`` (AITER's FlyDSL prefill kernel) and ``aiter``
(AITER's Triton/Gluon prefill kernel and its Gluon paged decode kernel, what vLLM's ROCm indexer
calls). One distribution, because both come from the one ``amd-aiter`` package and share its probe
(AMD's AITER versus the unrelated PyPI ``aiter``); two providers, so each is chosen, blocked, forced
and tuned by name (see README.md).

This module is the entry point and stays light: it holds the specs only. The runtime checks import
AITER lazily (once, cached) and a kernel object loads when its provider is chosen.
"""

from __future__ import annotations

from mqa_core import ProviderSpec, hookimpl

from . import aiter_limits, aiter_probe, pairs, probe
from .limits import shape_limits

__all__ = ["AITER_SPEC", "SPEC", "mqa_providers"]

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


AITER_SPEC = ProviderSpec(
    name="aiter",
    ops=frozenset({"fp8_mqa_logits", "fp8_paged_mqa_logits"}),
    archs=frozenset(aiter_probe.ARCHS),
    # gfx942: every fn/fnuz combination (AITER converts e4m3fn operands for prefill; the adapter
    # relabels the paged cache); gfx950: e4m3fn only (its OCP fp8 matrix instructions).
    dtype_pairs=pairs.DECLARED,
    # Below flydsl (300: first where its arch path is present), above gluon (200) and triton (150),
    # whose kernels were never measured on AMD: README.md gives the evidence; `mqa tune` overrides.
    priority=250,
    load="mqa_provider_flydsl.aiter_kernel:KERNEL",
    check=aiter_probe.check,
    shape_limits=aiter_limits.shape_limits,
    description="AMD AITER's Triton/Gluon fp8 MQA-logits prefill and paged decode kernels (gfx942, gfx950; "
                "needs ROCm and amd-aiter)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    # Discovery runs once per process and again after mqa_core.reload(): the moment to forget what
    # an earlier probe learned about the installed AITER.
    probe.reset()
    aiter_probe.reset()
    return [SPEC, AITER_SPEC]
