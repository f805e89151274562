"""Name a provider the way a user does (``MQA_PROVIDER``) and get exactly what they would get.

The kit and ``mqa bench`` must test the object an engine receives, through the real selection path,
and fail with the rendered trace when the named provider cannot serve the device; so they set the
environment variables for the duration of the call and reload the registry on the way in and out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .. import api, registry
from ..decision import Decision
from ..names import names_provider
from ..provider import Provider
from ..spec import OPS, Problem, ProviderSpec

_lock = threading.RLock()


def _apply(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) ``MQA_*`` variables and reload; restore and reload afterwards."""
    with _lock:
        saved = {k: os.environ.get(k) for k in values}
        try:
            _apply(values)
            api.reload()
            yield
        finally:
            _apply(saved)
            api.reload()


def provider_named(name: str, arch: str, *, op: str = "fp8_mqa_logits", dtype: str | None = None,
                   problem: Problem | None = None) -> Provider:
    """What ``get_provider`` returns under ``MQA_PROVIDER=name``; raises with the trace if it cannot."""
    with environment(MQA_PROVIDER=name):
        return api.get_provider(arch, op=op, dtype=dtype, problem=problem)


def explain_with(arch: str, *, op: str = "fp8_mqa_logits", problem: Problem | None = None,
                 **env: str | None) -> Decision:
    """``mqa_core.explain`` under temporarily changed ``MQA_*`` variables."""
    with environment(**env):
        return api.explain(arch, op=op, problem=problem)


def spec_named(ref: str) -> ProviderSpec | None:
    """The installed provider ``ref`` names (``name`` or ``distribution:name``, as ``MQA_PROVIDER``
    takes them), the core's ``composed`` provider included; None when none does. A bare name two
    distributions claim raises ValueError naming both (pass ``distribution:name``)."""
    found = [s for s in registry.all_specs() if names_provider(ref, s.distribution, s.name)]
    if len(found) > 1:
        raise ValueError(f"provider name {ref!r} is claimed by {' and '.join(s.id for s in found)}: name one "
                         "as distribution:name")
    return found[0] if found else None


def installed_names() -> list[str]:
    """The installed providers' names, and ``composed`` (the core's own provider of the fused top-k ops)."""
    return [s.name for s in registry.all_specs()]


def usable_providers(arch: str, ops: Sequence[str] = OPS) -> list[str]:
    """Providers that can serve at least one of ``ops`` on ``arch``, in selection order.

    A provider set aside only because ``MQA_PROVIDER`` names another still counts as usable.
    """
    names: dict[str, None] = {}
    for op in ops:
        for c in api.explain(arch, op=op).candidates:
            if c.accepted or c.code == "preference":
                names.setdefault(c.name)
    return list(names)
