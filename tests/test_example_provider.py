"""examples/third_party_provider: discovered through its own pyproject's entry point, listed, correct,
blockable, never chosen over torch_ref by default, and certified by the conformance kit."""

from __future__ import annotations

import importlib.metadata as md
import os
from pathlib import Path

import pytest

import mqa_core
from mqa_core.cli.providers import collect
from mqa_core.spec import Problem
from mqa_core.testing import calc_diff, make_inputs
from mqa_core.testing.providers import explain_with, provider_named

pytest_plugins = ("pytester",)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "third_party_provider"
DIST = "mqa-provider-example-chunked"


def _installed() -> bool:
    try:
        md.distribution(DIST)
    except md.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The example as CI installs it (pip install -e), or, when it is not, laid out the same way:
    its source dir on the path plus a dist-info whose entry points come from its own pyproject."""
    if not _installed():
        tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
        meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
        site = tmp_path / "site"
        info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
        lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                 for group, eps in meta["entry-points"].items()]
        (info / "entry_points.txt").write_text("".join(lines))
        for path in (str(EXAMPLE), str(site)):
            monkeypatch.syspath_prepend(path)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(EXAMPLE), str(site),
                                                                         os.environ.get("PYTHONPATH")))))
        mqa_core.reload()
    return "example_chunked"


def test_listed_below_torch_ref(example: str) -> None:
    rows = {r["name"]: r for r in collect("cpu")["providers"]}
    row = rows[example]
    assert row["distribution"] == DIST and row["priority"] == -10 and row["usable"]
    assert row["priority"] < rows["torch_ref"]["priority"]
    assert mqa_core.explain("cpu").chosen == "torch_ref"  # installing it changes nothing by default


def test_chosen_when_named_and_blockable(example: str) -> None:
    assert explain_with("cpu", MQA_PROVIDER=example).chosen == example
    d = explain_with("cpu", MQA_DISABLE_PROVIDERS=example)
    assert d.candidate(example).code == "blocked" and d.chosen == "torch_ref"
    with pytest.raises(mqa_core.ProviderUnavailableError, match="blocked"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MQA_PROVIDER", example)
            mp.setenv("MQA_DISABLE_PROVIDERS", example)
            mqa_core.reload()
            mqa_core.get_provider("cpu")


def test_shape_limits_reject_what_is_not_certified(example: str) -> None:
    c = mqa_core.explain("cpu", problem=Problem(8, 64, 256, 128)).candidate(example)
    assert c.code == "shape" and "H=256" in c.reason


@pytest.mark.parametrize("window", ["causal", "ragged"])
def test_kernel_matches_the_oracle(example: str, window: str) -> None:
    p = provider_named(example, "cpu")
    x = make_inputs(Problem(70, 300, 16, 64), window=window)
    out = p.fp8_mqa_logits(*x.args())
    ref = x.reference()
    assert calc_diff(out, ref) < 1e-6 and bool((out.isinf() == ref.isinf()).all())


def test_passes_the_conformance_kit(example: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # small tensors: one thread
    result = pytester.runpytest_subprocess("--mqa-provider", example, "-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("failed", 0) == 0 and outcomes["passed"] > 40, result.stdout.str()
