"""Whether this triton can build for an ahead-of-time target; the AOT tests of the Triton kernels skip
when it cannot (no AMD or NVIDIA backend, no ptxas), so they run on any machine that can compile."""

from __future__ import annotations

import pytest


def backend_missing(target: str) -> str | None:
    """Why this triton cannot compile for ``target`` (a key of ``aot.TARGETS``), or None when it can."""
    import triton
    from mqa_provider_gluon import aot

    backend = aot.TARGETS[target].backend
    if backend == "hip" and "amd" not in triton.backends.backends:
        return "this triton has no AMD backend"
    if backend == "cuda":
        if "nvidia" not in triton.backends.backends:
            return "this triton has no NVIDIA backend"
        try:
            _ = triton.knobs.nvidia.ptxas.path
        except Exception as e:  # the tool lookup raises when ptxas is not shipped or found
            return f"no ptxas: {e}"
    return None


def skip_unless_buildable(target: str) -> None:
    """Skip the calling test when this triton cannot compile for ``target``."""
    reason = backend_missing(target)
    if reason:
        pytest.skip(f"cannot compile for {target} here: {reason}")
