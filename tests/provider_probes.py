"""What the provider test folders (``tests/deepgemm``, ``tests/flydsl``) share about their probes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def fresh_probe_fixture(probe: Any, arch_variable: str) -> Any:
    """An autouse fixture for a conftest: the stand-in's arch variable unset (its default arch) and
    no cached probe answer (``probe.reset()``) leaking into or out of a test."""

    @pytest.fixture(autouse=True)
    def _fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.delenv(arch_variable, raising=False)
        probe.reset()
        yield
        probe.reset()

    return _fresh_probe
