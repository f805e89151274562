"""The conformance kit: torch_ref passes it, and subtly wrong providers fail it, saying where and by how much."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
import torch

from mqa_core.spec import Problem
from mqa_core.testing.cases import WINDOW_KINDS, edge_windows, make_windows
from mqa_core.testing.checks import Case, check_identical, check_logits
from mqa_core.testing.data import make_inputs

pytest_plugins = ("pytester",)

#: Three providers, each wrong in one way an author could miss: written as a real distribution.
WRONG_KERNELS = '''
import torch


def _logits(q, kv, w, ks, ke, *, relu=True, scale=True, edge=0):
    k, k_scale = kv
    s = torch.einsum("mhd,nd->mhn", q.float(), k.float())
    if relu:
        s = s.clamp_min(0)
    out = torch.einsum("mhn,mh->mn", s, w)
    if scale:
        out = out * k_scale.reshape(1, -1)
    n = k.shape[0]
    cols = torch.arange(n)[None, :]
    inside = (cols >= ks.long()[:, None].clamp(min=0)) & (cols < (ke.long()[:, None] + edge).clamp(max=n))
    return out.masked_fill(~inside, float("-inf"))


class Wrong:
    def __init__(self, **bug):
        self.bug = bug

    def fp8_mqa_logits(self, q, kv, w, ks, ke, *, clean_logits=True):
        return _logits(q, kv, w, ks, ke, **self.bug)


SCALE, EDGE, RELU = Wrong(scale=False), Wrong(edge=1), Wrong(relu=False)
'''

WRONG_SPECS = '''
from mqa_core import ProviderSpec, hookimpl


@hookimpl
def mqa_providers():
    return [ProviderSpec(name=name, ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                         priority=-100, load=f"wrong_providers.kernels:{attr}")
            for name, attr in (("wrong_scale", "SCALE"), ("wrong_edge", "EDGE"), ("wrong_relu", "RELU"))]
'''


def install_wrong_providers(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Lay out the wrong providers as pip would (package + dist-info) and put them on PYTHONPATH."""
    site = root / "site"
    (site / "wrong_providers").mkdir(parents=True)
    (site / "wrong_providers" / "__init__.py").write_text(textwrap.dedent(WRONG_SPECS))
    (site / "wrong_providers" / "kernels.py").write_text(textwrap.dedent(WRONG_KERNELS))
    info = site / "wrong_providers-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wrong-providers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mqa_core.providers]\nwrong = wrong_providers\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))))
    return site


def test_wrong_providers_fail_and_torch_ref_passes(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    install_wrong_providers(pytester.path, monkeypatch)
    names = ("torch_ref", "wrong_scale", "wrong_edge", "wrong_relu")
    args = [a for n in names for a in ("--mqa-provider", n)]
    # The whole kit for torch_ref; for the wrong ones a subset that must catch each bug.
    result = pytester.runpytest_subprocess(*args, "-v", "-p", "no:cacheprovider", "--tb=short",
                                           "-k", "torch_ref or prefill_window and (causal or edges) or selection")
    out = result.stdout.str()
    per: dict[str, dict[str, int]] = {n: {"PASSED": 0, "FAILED": 0} for n in names}
    for name, status in re.findall(r"::test_\w+\[([a-z_]+)[-\]][^ ]* (PASSED|FAILED)", out):
        per[name][status] += 1
    assert per["torch_ref"]["FAILED"] == 0 and per["torch_ref"]["PASSED"] >= 50, out
    for name in names[1:]:
        assert per[name]["FAILED"] >= 2, (name, out)
        assert per[name]["PASSED"] >= 1, (name, out)  # selection works; only the numbers are wrong
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # Each failure names the provider, the case, the seed, and the size of the miss.
    result.stdout.fnmatch_lines([
        "*[[]wrong_scale[]] fp8_mqa_logits window=causal clean_logits=True *seed=*calc_diff *e-0* >= 1e-03*",
        "*[[]wrong_edge[]] fp8_mqa_logits window=edges clean_logits=True *out-of-window cells are not -inf*",
        "*[[]wrong_relu[]] fp8_mqa_logits window=*calc_diff * >= 1e-03*",
    ], consecutive=False)


def test_plugin_adds_nothing_without_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def _case(what: str = "window=test") -> Case:
    return Case("p", "fp8_mqa_logits", what, Problem(29, 83, 4, 32), 1, 2)


def test_check_logits_reports_each_kind_of_miss() -> None:
    x = make_inputs(Problem(29, 83, 4, 32), window="full", seed=3)
    ks, ke = edge_windows(29, 83)
    from mqa_core.reference import fp8_mqa_logits_ref

    ref = fp8_mqa_logits_ref(x.q, x.k, x.k_scale, x.weights, ks, ke)
    good = ref.float()
    assert check_logits(good, ref, _case(), clean=True) < 1e-6

    hole = good.clone()
    hole[0, 5] = float("nan")
    with pytest.raises(AssertionError, match=r"1 of \d+ in-window cells are not finite.*\(0, 5\)"):
        check_logits(hole, ref, _case(), clean=True, windows=(ks, ke))
    stray = good.clone()
    stray[3, 40] = 1.0  # row 3 is an empty window
    with pytest.raises(AssertionError, match=r"1 of \d+ out-of-window cells are not -inf.*row 3 sees keys \[5, 5\)"):
        check_logits(stray, ref, _case(), clean=True, windows=(ks, ke))
    check_logits(stray, ref, _case(), clean=False)  # without clean_logits those cells are not read
    scaled = good * 1.2
    scaled[0, 0] = good[0, 0] * 3
    with pytest.raises(AssertionError, match=r"\[p\] fp8_mqa_logits window=test .* calc_diff .* >= 1e-03"):
        check_logits(scaled, ref, _case(), clean=True)
    with pytest.raises(AssertionError, match=r"shape \[29, 83\]"):
        check_logits(good[:, :80], ref, _case(), clean=True)
    with pytest.raises(AssertionError, match="differ in 1 of"):
        check_identical(good, stray, _case())


@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_windows_cover_the_corners(kind: str) -> None:
    ks, ke = make_windows(kind, 40, 83, seed=5)
    assert ks.dtype == ke.dtype == torch.int32 and ks.shape == ke.shape == (40,)
    if kind == "edges":
        assert (ks < 0).any() and (ke > 83).any() and (ks >= ke).any() and ((ke - ks) == 1).any()
        assert ((ks % 16 != 0) & (ke % 16 != 0) & (ks < ke)).any()
    if kind == "empty":
        assert (ks >= ke).all()
