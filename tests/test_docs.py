"""The documentation works as written: every python and shell block of README.md and docs/ runs here
(on the CPU, in CI), so a renamed function, option or output fails a test instead of a reader.

How a block is marked (README.md, "Documentation is tested", says the same):

- ```` ```python ```` and ```` ```bash ```` blocks run. The python blocks of one file run in order in one
  fresh process (a block may use what an earlier one defined); each bash block runs on its own with
  ``bash -euo pipefail`` in an empty folder.
- ```` ```text ````, ``toml``, ``json``, ``yaml``, ``markdown``: shown, not run (output, formulas, files).
  Every block names its language: an untagged block fails here.
- ```` ```bash ci="gpu" ```` (or python): needs a GPU, not run here.
  ```` ```bash ci="skip" why="..." ````: not run, for the reason given (installs, CI's own commands).
  Keep these rare.
- ``<!-- ci-setup ... -->`` right before a python block: hidden code that runs first (random inputs for
  an example that reads as an engine's call).

docs/writing-a-provider.md is run by tests/test_tutorial.py (in a layered virtual environment, since it
installs a package); here its markers are checked and its untitled python blocks run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PACKAGE_READMES = [*sorted(ROOT.glob("providers/*/README.md")),
                   ROOT / "examples" / "third_party_provider" / "README.md"]
RUN_ELSEWHERE = {"docs/writing-a-provider.md": "tests/test_tutorial.py"}
FENCE = re.compile(r"(?:<!-- ci-setup\n(?P<setup>.*?)-->\n)?"
                   r"^```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
RUN = {"python", "bash"}
SHOWN = {"text", "toml", "json", "yaml", "markdown"}
MARKS = {"gpu", "skip", "fails"}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: Path) -> list[dict[str, str]]:
    out = []
    for m in FENCE.finditer(path.read_text()):
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', m.group("attrs")))
        line = path.read_text()[: m.start("body")].count("\n")
        out.append({"lang": m.group("lang"), "body": m.group("body"), "setup": m.group("setup") or "",
                    "where": f"{rel(path)}:{line}", **attrs})
    return out


def runnable(path: Path, lang: str) -> list[dict[str, str]]:
    """The blocks of ``lang`` this file runs here. Of the tutorial, whose harness writes its titled
    blocks as files and runs its shell session, only the other python blocks (signatures to copy)."""
    found = [b for b in blocks(path) if b["lang"] == lang and "ci" not in b]
    if rel(path) in RUN_ELSEWHERE:
        return [b for b in found if lang == "python" and "title" not in b]
    return found


@pytest.mark.parametrize("path", DOCS + PACKAGE_READMES, ids=rel)
def test_every_block_is_tagged_and_marked_as_documented(path: Path) -> None:
    text = path.read_text()
    assert text.count("\n```") % 2 == 0, f"{rel(path)}: an unclosed code block"
    for b in blocks(path):
        assert b["lang"] in RUN | SHOWN, f"{b['where']}: tag the block's language ({sorted(RUN | SHOWN)})"
        assert b.get("ci", "gpu") in MARKS, f"{b['where']}: ci={b['ci']!r} is not one of {sorted(MARKS)}"
        if b.get("ci") == "skip":
            assert b.get("why") or rel(path) in RUN_ELSEWHERE, f'{b["where"]}: ci="skip" needs why="..."'
        if b.get("ci") == "fails":
            assert rel(path) in RUN_ELSEWHERE, f"{b['where']}: only the tutorial's harness runs ci=\"fails\""
        assert not b["setup"] or b["lang"] == "python", f"{b['where']}: ci-setup is for python blocks"


def test_opt_outs_stay_rare() -> None:
    marked = [b for p in DOCS if rel(p) not in RUN_ELSEWHERE for b in blocks(p) if b["lang"] in RUN and "ci" in b]
    ran = [b for p in DOCS for lang in RUN for b in runnable(p, lang)]
    assert len(ran) > len(marked), [b["where"] for b in marked]


RUNNER = """
import json, sys, traceback
scope = {"__name__": "__doc__"}
for where, code in json.load(sys.stdin):
    print(f"::: {where}", flush=True)
    try:
        exec(compile(code, where, "exec"), scope)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
"""


def _env() -> dict[str, str]:
    """This environment (its providers allow-list included) with its python's scripts first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_INTERPRET"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.parametrize("path", [p for p in DOCS if runnable(p, "python")], ids=rel)
def test_python_blocks_run(path: Path, tmp_path: Path) -> None:
    code = [(b["where"], b["setup"] + b["body"]) for b in runnable(path, "python")]
    r = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(code), capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


SHELL = [(p, i, b) for p in DOCS for i, b in enumerate(runnable(p, "bash"))]


@pytest.mark.parametrize("path, index, block", SHELL, ids=[b["where"] for _, _, b in SHELL])
def test_shell_blocks_run(path: Path, index: int, block: dict[str, str], tmp_path: Path) -> None:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block["body"]], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=600)
    assert r.returncode == 0, f"{block['where']}:\n{block['body']}\n" + (r.stdout + r.stderr)[-4000:]


# -- what the documentation says, checked against the tree (issue 36 items 11-14, 16) ------------------

PROSE = DOCS + PACKAGE_READMES + [ROOT / "bench" / "README.md"]
REPO_URL = "https://github.com/mqa-core/mqa-core"


@pytest.mark.parametrize("path", PROSE, ids=rel)
def test_no_test_counts_or_provider_counts(path: Path) -> None:
    """Counts drift ("13 skipped" became 16, "the three providers" four): the docs name none."""
    text = path.read_text()
    counts = re.findall(r"\b[1-9]\d* (?:passed|failed|skipped|tests)\b", text)
    assert not counts, f"{rel(path)} states test counts: {counts}"
    numbered = re.findall(r"\b(?:two|three|four|five|six|seven|eight) providers\b", text, re.I)
    assert not numbered, f"{rel(path)} counts the providers: {numbered}"


def test_the_readme_documents_every_setting() -> None:
    from mqa_core.settings import ENV_VARS

    table = ROOT.joinpath("README.md").read_text().split("| variable | effect |")[1].split("\n\n")[0]
    missing = [name for name in ENV_VARS if f"`{name}" not in table]
    assert not missing, f"README's settings table lacks {missing}"


def test_flydsl_versions_agree_and_it_declares_torch() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    meta = tomllib.loads((ROOT / "providers" / "flydsl" / "pyproject.toml").read_text())["project"]
    (aiter,) = meta["optional-dependencies"]["aiter"]
    version = re.fullmatch(r"amd-aiter>=([\d.]+)", aiter)
    assert version, aiter
    for doc in ("README.md", "providers/flydsl/README.md", "docs/providers/flydsl.md"):
        said = set(re.findall(r"v?(0\.1\.\d+)\b", ROOT.joinpath(doc).read_text()))
        assert version.group(1) in said, (doc, said)
    assert "`amd-aiter` >= " + version.group(1) in ROOT.joinpath("README.md").read_text()
    assert any(re.match(r"torch\s*>=", d) for d in meta["dependencies"]), meta["dependencies"]


INDEX_INSTALL = re.compile(r"pip install (?:-[-\w]+ )*['\"]?(mqa-core|mqa-provider-[\w-]+)(?![\w\[-])")


@pytest.mark.parametrize("path", PROSE + sorted((ROOT / "mqa_core").rglob("*.py")), ids=rel)
def test_nothing_says_to_install_from_an_index(path: Path) -> None:
    """The packages are not on an index: installs name a path in a checkout (an extra of an installed
    package, 'mqa-core[check]', is fine: pip then fetches only the extra's requirements)."""
    found = INDEX_INSTALL.findall(path.read_text())
    assert not found, f"{rel(path)}: pip install {found} reads as an install from a package index"


def _distributions() -> list[Path]:
    return [ROOT, *sorted(p.parent for p in ROOT.glob("providers/*/pyproject.toml")),
            ROOT / "examples" / "third_party_provider"]


@pytest.mark.parametrize("dist", _distributions(), ids=lambda p: rel(p) or "root")
def test_long_descriptions_stand_alone_and_urls_are_declared(dist: Path) -> None:
    """A wheel's description is read on an index, away from the repository: no repository-relative
    links or `make` commands; Project-URLs point at the repository."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((dist / "pyproject.toml").read_text())["project"]
    text = (dist / project["readme"]).read_text()
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", text)
    assert not relative, f"{project['name']}: repository-relative links {relative}"
    assert not re.search(r"^\s*make\b", text, re.M), f"{project['name']}: a make command"
    urls = project.get("urls", {})
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(urls), urls
    assert all(u.startswith(REPO_URL) for u in urls.values()), urls


def test_the_set_up_states_time_and_disk() -> None:
    setup = ROOT.joinpath("README.md").read_text().split("## Set-up")[1].split("\n## ")[0]
    for command in ("make demo", "make test"):
        line = next(ln for ln in setup.splitlines() if ln.startswith(command))
        assert re.search(r"\d+ minutes?", line) and re.search(r"\d(\.\d)? [GM]B", line), line


def test_the_readme_shows_where_each_part_lives() -> None:
    layout = ROOT.joinpath("README.md").read_text().split("## Layout")[1].split("\n## ")[0]
    parts = ["mqa_core/", "mqa_core/testing/", "docs/", "bench/", "tests/", "examples/third_party_provider/"]
    parts += [f"providers/{p.parent.name}/" for p in ROOT.glob("providers/*/pyproject.toml")]
    missing = [p for p in parts if f"`{p}`" not in layout]
    assert not missing, missing


def test_the_bench_table_lists_every_tool_and_nothing_else() -> None:
    text = ROOT.joinpath("bench", "README.md").read_text()
    listed = set(re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", text, re.M))
    present = {p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")}
    assert listed == present, (sorted(listed - present), sorted(present - listed))
    assert len(present) <= 13, "bench/ is for a few device tools; a comparison is a mqa bench/tune option"


def test_every_performance_table_says_where_when_and_how() -> None:
    """docs/performance.md: each table with its device, versions, date and the command that reproduces
    it, and each results file it cites present (one per table, nothing else in bench/results)."""
    text = ROOT.joinpath("docs", "performance.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    tables = [s for s in sections if not s.startswith("What was tried")]
    assert len(tables) >= 4
    for s in tables:
        title = s.splitlines()[0]
        assert re.search(r"\bNVIDIA H\d00\b", s) and re.search(r"torch \d+\.\d+", s), title
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", s), f"{title}: no date"
        assert re.search(r"Command[s]? \(on the H[12]00\): `(python bench/|mqa )", s), f"{title}: no command"
    cited = set(re.findall(r"bench/results/([\w.-]+\.txt)", text))
    held = {p.name for p in (ROOT / "bench" / "results").iterdir()}
    assert cited == held, (cited, held)
    tried = text.split("## What was tried")[1]
    assert all(len(line) < 260 for line in tried.splitlines() if line.startswith("- ")), "one line per idea"
