"""Shared fixtures: real distributions (dist-info + modules) installed into a temp site dir."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

import mqa_core

ROOT = Path(__file__).resolve().parents[1]


def _repo_plugins() -> str:
    """This repository's provider distributions (providers/*, examples/*), from their pyproject files:
    MQA_PLUGINS names distributions."""
    names: list[str] = []
    for pyproject in sorted(ROOT.glob("providers/*/pyproject.toml")) + sorted(ROOT.glob("examples/*/pyproject.toml")):
        text = pyproject.read_text()
        if '[project.entry-points."mqa_core.providers"]' in text:
            names += re.findall(r'^\[project\]\n(?:.*\n)*?name\s*=\s*"([^"]+)"', text, re.M)[:1]
    return ",".join(names)


#: The tests judge this repository's providers: other installed ones (a finished tutorial, a
#: user's own) are not loaded (MQA_PLUGINS), so they cannot change a choice the tests expect.
REPO_PLUGINS = _repo_plugins()


def allow_plugins(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Add distribution names to the MQA_PLUGINS allow-list the tests run under."""
    current = os.environ.get("MQA_PLUGINS")
    if current is not None:
        monkeypatch.setenv("MQA_PLUGINS", ",".join(filter(None, (current, *names))))


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch):
    """Each test starts from a clean environment and an empty registry cache, and leaves one."""
    for var in ("MQA_PROVIDER", "MQA_DISABLE_PROVIDERS", "MQA_STRICT_PLUGINS",
                "MQA_VALIDATE", "MQA_TORCH_REF_MEMORY_MB", "MQA_TUNING", "TRITON_INTERPRET", "MQA_WORKSPACE_MB",
                "MQA_BATCH_INVARIANT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MQA_PLUGINS", REPO_PLUGINS)
    mqa_core.reload()
    yield
    mqa_core.reload()


InstallDist = Callable[..., Path]


@pytest.fixture
def install_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InstallDist:
    """Install a distribution the way pip lays it out: modules plus ``NAME-VERSION.dist-info``.

    ``install_dist("my-provider", "1.0", {"my_provider/__init__.py": "..."},
    entry_points={"mqa_core.providers": {"my": "my_provider"}})``; the site dir is put on sys.path
    so importlib.metadata finds it, a provider distribution joins MQA_PLUGINS, and the registry is
    reloaded.
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
            if entry_points.get("mqa_core.providers"):
                allow_plugins(monkeypatch, name)
        mqa_core.reload()
        return site

    yield install
    for top in added:  # forget modules imported from the temp site so later tests re-import
        for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[mod]
