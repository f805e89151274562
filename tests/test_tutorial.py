"""docs/writing-a-provider.md works as written: its code blocks, extracted in order and run from an
empty folder on the CPU, build a provider whose stub fails the kit and whose kernel passes it.

Blocks: a ```lang title="PATH"``` block is a file written at that point; a ```bash``` block is run
and must succeed; ```bash ci="fails"``` must fail; ```bash ci="skip"``` is not run (GPU, upload).
They run in one shell session, in a virtual environment layered over this one (.ci/overlay_venv.py),
so `pip install -e .` installs the tutorial's provider there and nowhere else.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "writing-a-provider.md"
FENCE = re.compile(r"^```(\w+)?([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
EOF_MARK = "MQA_TUTORIAL_EOF"


def blocks() -> list[tuple[str, dict[str, str], str]]:
    """(language, attributes, body) of every fenced block, in order."""
    out = []
    for m in FENCE.finditer(TUTORIAL.read_text()):
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out.append((m.group(1) or "", attrs, m.group(3)))
    return out


def script() -> str:
    """The tutorial as one bash session: files written and commands run in the order they appear."""
    lines = ["set -euo pipefail"]
    for i, (lang, attrs, body) in enumerate(blocks()):
        if "title" in attrs and lang != "bash":
            assert EOF_MARK not in body
            lines += [f"echo '::: tutorial block {i}: write {attrs['title']}'",
                      f"cat > {shlex.quote(attrs['title'])} <<'{EOF_MARK}'", body.rstrip("\n"), EOF_MARK]
        elif lang == "bash" and attrs.get("ci") != "skip":
            lines.append(f"echo '::: tutorial block {i}: run ({attrs.get('ci', 'succeeds')})'")
            if attrs.get("ci") == "fails":
                lines += [f"if ( {body.strip()} ); then echo 'tutorial block {i} should fail' >&2; exit 97; fi"]
            else:
                lines.append(body.rstrip("\n"))
    return "\n".join(lines) + "\n"


def test_blocks_are_what_the_harness_expects() -> None:
    found = blocks()
    files = [a["title"] for lang, a, _ in found if "title" in a]
    assert files == ["pyproject.toml", "README.md", "mqa_provider_mine/__init__.py", "mqa_provider_mine/kernel.py",
                     "mqa_provider_mine/kernel.py"]
    stub, final = [body for _, a, body in found if a.get("title") == "mqa_provider_mine/kernel.py"]
    assert 'raise NotImplementedError("mine: fp8_mqa_logits is not written yet")' in stub
    example = ROOT / "examples" / "third_party_provider" / "mqa_example_chunked" / "kernel.py"
    assert final == example.read_text(), "the tutorial's kernel is the finished example's, verbatim"
    spec = next(body for _, a, body in found if a.get("title") == "mqa_provider_mine/__init__.py")
    assert 'archs={"cpu"}' in spec and "priority=-10," in spec and "description=" in spec
    runs = [(a.get("ci", ""), body) for lang, a, body in found if lang == "bash"]
    assert [ci for ci, body in runs if "mqa check --provider mine" in body] == ["fails", "", "skip"]
    assert any("pip install build" in body and not ci for ci, body in runs)


@pytest.mark.skipif(os.name != "posix", reason="the harness drives bash")
def test_tutorial_runs_from_an_empty_folder_to_a_green_check(tmp_path: Path) -> None:
    if importlib.util.find_spec("mqa_provider_mine") is not None:
        pytest.skip("a package mqa_provider_mine is installed here already (a finished tutorial?): the tutorial "
                    "would install a second provider named 'mine'")
    venv = tmp_path / "venv"
    python = load_script(".ci/overlay_venv.py").make_overlay(venv)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQA_", "PYTEST_", "TRITON_INTERPRET"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    (tmp_path / "tutorial.sh").write_text(script())
    r = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=work, env=env, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "mine  FAIL" in out and "NotImplementedError: mine: fp8_mqa_logits is not written yet" in out, out[-6000:]
    assert re.search(r"^  mine  PASS  \d+ passed, 0 failed", out, re.M), out[-6000:]
    assert re.search(r"^\d+ passed, \d+ skipped", out, re.M), out[-6000:]  # pytest --mqa-provider mine -q
    assert re.search(r"^mine\s+my kernel: key blocks x all heads", out, re.M), out[-6000:]  # its description
    wheel = list((work / "mqa-provider-mine" / "dist").glob("mqa_provider_mine-0.1.0-*.whl"))
    assert len(wheel) == 1
    import zipfile

    names = zipfile.ZipFile(wheel[0]).namelist()
    assert "mqa_provider_mine/py.typed" in names and "mqa_provider_mine/kernel.py" in names
    # Installed in the layered venv only: this environment does not see it.
    seen = subprocess.run([str(python), "-c", "import mqa_provider_mine"], capture_output=True)
    assert seen.returncode == 0
    assert importlib.util.find_spec("mqa_provider_mine") is None
