"""An example third-party provider for mqa-core (see docs/writing-a-provider.md).

This module is the entry point, so it holds only the spec: ``mqa providers`` imports it to list the
provider, and the kernel module (``kernel.py``) is imported only once selection picks this provider.
"""

from __future__ import annotations

from mqa_core import Problem, ProviderSpec, hookimpl

#: The sizes the conformance kit has certified this kernel on (its grid goes up to H=128, D=256).
MAX_HEADS = 128
MAX_HEAD_DIM = 256


def shape_limits(problem: Problem) -> str | None:
    """Claim only what has been run through ``pytest --mqa-provider example_chunked``."""
    if problem.h > MAX_HEADS:
        return f"H={problem.h} is above {MAX_HEADS}, the largest H this provider is certified on"
    if problem.d > MAX_HEAD_DIM:
        return f"D={problem.d} is above {MAX_HEAD_DIM}, the largest D this provider is certified on"
    return None


SPEC = ProviderSpec(
    name="example_chunked",
    ops={"fp8_mqa_logits"},
    archs={"cpu"},  # tested on the CPU only; a GPU would run it, but nobody has certified that
    dtypes={"float8_e4m3fn"},
    priority=-10,  # below torch_ref (0): installed next to it, it is never chosen unless asked for
    load="mqa_example_chunked.kernel:KERNEL",
    shape_limits=shape_limits,
    description="example provider: key blocks x all heads in fp32 on the CPU (for the tutorial)",
)


@hookimpl
def mqa_providers() -> list[ProviderSpec]:
    return [SPEC]
