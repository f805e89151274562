"""Shared fixtures: real distributions (dist-info + modules) installed into a temp site dir."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

import mqa_core


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch):
    """Each test starts from a clean environment and an empty registry cache, and leaves one."""
    for var in ("MQA_PROVIDER", "MQA_DISABLE_PROVIDERS", "MQA_PLUGINS", "MQA_STRICT_PLUGINS",
                "MQA_VALIDATE", "MQA_TORCH_REF_MEMORY_MB", "MQA_TUNING", "TRITON_INTERPRET"):
        monkeypatch.delenv(var, raising=False)
    mqa_core.reload()
    yield
    mqa_core.reload()


InstallDist = Callable[..., Path]


@pytest.fixture
def install_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InstallDist:
    """Install a distribution the way pip lays it out: modules plus ``NAME-VERSION.dist-info``.

    ``install_dist("my-provider", "1.0", {"my_provider/__init__.py": "..."},
    entry_points={"mqa_core.providers": {"my": "my_provider"}})``; the site dir is put on sys.path
    so importlib.metadata finds it, and the registry is reloaded.
    """
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    monkeypatch.syspath_prepend(str(site))
    added: list[str] = []

    def install(name: str, version: str, files: Mapping[str, str],
                entry_points: Mapping[str, Mapping[str, str]] | None = None) -> Path:
        for rel, text in files.items():
            path = site / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
            top = rel.split("/")[0].removesuffix(".py")
            added.append(top)
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if entry_points:
            lines = []
            for group, eps in entry_points.items():
                lines.append(f"[{group}]")
                lines += [f"{k} = {v}" for k, v in eps.items()]
            (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        mqa_core.reload()
        return site

    yield install
    for top in added:  # forget modules imported from the temp site so later tests re-import
        for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[mod]
