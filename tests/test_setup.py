"""The README's set-up: `make demo` and `make test` never install or replace an importable torch,
say which torch they used, and the packages carry what a distribution should (license, README,
py.typed, one mqa-core requirement)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = [ROOT, *sorted((ROOT / "providers").glob("*/")), ROOT / "examples" / "third_party_provider"]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

FAKE_PIP = """
import os, sys
with open(os.environ["FAKE_PIP_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if any(a.startswith("torch") for a in sys.argv[1:]):
    open(os.environ["FAKE_TORCH_MARKER"], "w").close()
"""
FAKE_TORCH = """
import os
if not os.path.exists(os.environ["FAKE_TORCH_MARKER"]):
    raise ImportError("no torch in this test's environment")
__version__ = "9.9.9+fake"
"""


def make(tmp_path: Path, target: str, *, torch_installed: bool, dry: bool = False) -> tuple[str, list[str]]:
    """Run a Makefile target with a fake pip (records its arguments) and a fake torch on PYTHONPATH."""
    fakes = tmp_path / "fakes"
    (fakes / "pip").mkdir(parents=True, exist_ok=True)
    (fakes / "pip" / "__init__.py").write_text("")
    (fakes / "pip" / "__main__.py").write_text(FAKE_PIP)
    (fakes / "torch.py").write_text(FAKE_TORCH)
    log, marker = tmp_path / "pip.log", tmp_path / "torch-installed"
    if torch_installed:
        marker.touch()
    env = {**os.environ, "PYTHONPATH": str(fakes), "FAKE_PIP_LOG": str(log), "FAKE_TORCH_MARKER": str(marker)}
    cmd = ["make", "--no-print-directory", "-C", str(ROOT), target, f"PYTHON={sys.executable}"]
    cmd += ["-n"] if dry else []
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, log.read_text().splitlines() if log.exists() else []


def makefile_words(variable: str) -> list[str]:
    """The words of a ``NAME = ...`` line of the Makefile (quotes removed)."""
    line = re.search(rf"^{variable}\s*=(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert line, f"the Makefile sets no {variable}"
    return line.group(1).replace('"', "").split()


def test_the_makefile_installs_every_provider_in_the_repo() -> None:
    here = sorted(f"providers/{p.parent.name}" for p in (ROOT / "providers").glob("*/pyproject.toml"))
    assert sorted(makefile_words("PROVIDERS")) == here


@needs_make
def test_an_importable_torch_is_left_alone(tmp_path: Path) -> None:
    out, pip = make(tmp_path, "install", torch_installed=True)
    assert "torch: using 9.9.9+fake from " in out and "(already installed: left as it is)" in out
    editable = " ".join(f"-e {p}" for p in [".", *makefile_words("PROVIDERS")])
    assert pip == [f"install --quiet {' '.join(makefile_words('DEPS'))}",
                   f"install --quiet --no-deps --config-settings editable_mode=compat {editable}"]
    assert not [line for line in pip if re.search(r"\btorch\b", line)]


@needs_make
def test_torch_is_installed_only_when_missing(tmp_path: Path) -> None:
    out, pip = make(tmp_path, "torch", torch_installed=False)
    assert pip == ["install --quiet torch==2.13.0"]
    assert "torch: none importable" in out and "torch: using 9.9.9+fake from " in out and "installed just now" in out


@needs_make
@pytest.mark.parametrize("target", ["demo", "test"])
def test_no_readme_command_names_torch_to_pip(tmp_path: Path, target: str) -> None:
    """Dry runs of the README's two commands: torch reaches pip only through .ci/ensure.py (which
    installs it only when missing), triton likewise; and each command says which torch it used."""
    out, _ = make(tmp_path, target, torch_installed=True, dry=True)
    pip_lines = [ln for ln in out.splitlines() if "-m pip install" in ln]
    assert pip_lines and not [ln for ln in pip_lines if re.search(r"\btorch\b|\btriton==", ln)
                              and "TRITON_LATEST" not in ln and "venv-triton" not in ln], pip_lines
    assert out.strip().splitlines()[-1].endswith('.ci/ensure.py torch "torch==2.13.0"')
    if target == "test":
        assert '.ci/ensure.py triton "triton==3.6.0" --no-deps' in out
        assert re.search(r"venv-triton-3\.9\.0/bin/python\" -m pip install --quiet --no-deps \"triton==3\.9\.0\"", out)
        venv = re.search(r'overlay_venv\.py "([^"]+)"', out)
        assert venv and not Path(venv.group(1)).is_relative_to(ROOT), out  # the venv lives outside the tree


def test_newest_triton_is_named_in_one_place() -> None:
    text = (ROOT / "Makefile").read_text()
    assert len(re.findall(r"^TRITON_LATEST = \d+\.\d+\.\d+$", text, re.M)) == 1
    assert "$(or $(XDG_CACHE_HOME),$(HOME)/.cache)" in text
    assert not re.search(r"triton==3\.9|triton==\$\(TRITON_LATEST\)\"?\s*$", text.split("TRITON_LATEST =")[0])


def test_ensure_script_refuses_bad_usage() -> None:
    r = subprocess.run([sys.executable, str(ROOT / ".ci" / "ensure.py"), "torch"], capture_output=True, text=True)
    assert r.returncode == 2 and "Install a requirement only when its module is missing" in r.stderr


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda p: p.name or "root")
def test_every_distribution_is_complete(dist: Path) -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    meta = tomllib.loads((dist / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (dist / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert meta["build-system"]["requires"] == ["setuptools>=77"]  # the first to take SPDX strings
    readme = "docs/package.md" if dist == ROOT else "README.md"  # the core's: no repo-relative links
    assert project["readme"] == readme and (dist / readme).stat().st_size > 200
    core = [d for d in project["dependencies"] if d.startswith("mqa-core")]
    assert core == ([] if dist == ROOT else ["mqa-core>=0.2,<0.3"]), core
    assert not [d for d in project["dependencies"] if re.match(r"torch\s*==", d)]  # never pin torch
    data = meta["tool"]["setuptools"].get("package-data", {})
    for package, files in data.items():
        assert files == ["py.typed"] and (dist / package / "py.typed").exists(), package
    packages = {p.parent.name for p in dist.glob("*/__init__.py") if p.parent.name != "tests"}
    assert packages and packages <= set(data), (packages, data)


def test_license_is_the_apache_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 11000


def test_version_is_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata as md

    import mqa_core
    from mqa_core.cli.main import main

    assert mqa_core.__version__ == md.version("mqa-core")
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"mqa-core {mqa_core.__version__}"


def test_providers_shows_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    from mqa_core.cli.main import main

    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^torch_ref\s+exact fp32 PyTorch on any device", out, re.M), out


def test_torch_imports_without_the_numpy_warning() -> None:
    r = subprocess.run([sys.executable, "-W", "default", "-c", "import torch; torch.zeros(2).sum()"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "Failed to initialize NumPy" not in r.stderr, r.stderr
