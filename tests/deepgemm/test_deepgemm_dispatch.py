"""Who serves sm_90 and sm_100 with the DeepGEMM provider installed, through real entry points.

DeepGEMM ranks below gluon, so with both usable gluon serves by priority; deepgemm serves when named
(``MQA_PROVIDER``), when gluon cannot, or when a tuning table says so (tests/test_tuning.py). Every
case where deepgemm cannot serve shows its reason in ``explain``.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util

import pytest

import mqa_core
from mqa_core import Problem
from mqa_core.cli.main import main
from mqa_core.testing.providers import explain_with, provider_named

OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
@pytest.mark.parametrize("op", OPS)
def test_usable_below_gluon(deep_gemm, arch, op):
    deep_gemm("fp8_fp4")
    d = mqa_core.explain(arch, op=op)
    c = d.candidate("deepgemm")
    assert c.accepted and c.priority == 180, str(d)
    assert d.chosen == "gluon", str(d)
    named = explain_with(arch, op=op, MQA_PROVIDER="deepgemm")
    assert named.chosen == "deepgemm"
    assert provider_named("deepgemm", arch, op=op).name == "deepgemm"


@pytest.mark.parametrize("op", OPS)
def test_chosen_where_gluon_is_blocked(deep_gemm, op):
    deep_gemm("legacy")
    d = explain_with("sm_90", op=op, MQA_DISABLE_PROVIDERS="gluon")
    assert d.chosen == "deepgemm", str(d)
    assert "highest priority (180)" in d.why


def test_explain_lists_deepgemm_with_its_reason_when_absent(capsys):
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("this environment has deep_gemm installed")
    assert main(["explain", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "deepgemm" in line)
    assert f"mqa-provider-deepgemm=={md.version('mqa-provider-deepgemm')}" in row and "180" in row
    assert "rejected [check] DeepGEMM not importable: no module named 'deep_gemm'" in row
    assert "chosen: gluon" in out


@pytest.mark.parametrize("arch", ["cpu", "sm_80", "gfx942", "sm_120"])
def test_other_archs_say_why(deep_gemm, arch):
    deep_gemm("fp8_fp4")
    c = mqa_core.explain(arch).candidate("deepgemm")
    assert (c.code, c.reason) == ("arch", f"declares archs sm_100, sm_90; asked for {arch}")


@pytest.mark.parametrize("generation, says", [
    ("gemm_only", "exports neither known MQA-logits API"),
    ("no_cuda", "does not import: AssertionError"),
])
def test_unusable_builds_say_why_and_the_next_provider_serves(deep_gemm, generation, says):
    deep_gemm(generation)
    d = mqa_core.explain("sm_90", op="fp8_paged_mqa_logits")
    c = d.candidate("deepgemm")
    assert c.code == "check" and says in c.reason, str(d)
    with pytest.raises(mqa_core.ProviderUnavailableError, match=says):
        provider_named("deepgemm", "sm_90")


@pytest.mark.parametrize("problem", [Problem(64, 1024, 16, 128), Problem(64, 1024, 128, 128),
                                     Problem(64, 1024, 64, 256)])
def test_shapes_outside_go_to_the_next_provider(deep_gemm, problem):
    deep_gemm("fp8_fp4")
    d = explain_with("sm_90", problem=problem, MQA_DISABLE_PROVIDERS="gluon")
    c = d.candidate("deepgemm")
    assert c.code == "shape" and "DeepGEMM's MQA-logits kernels do not take this shape" in c.reason
    assert d.chosen == ("triton" if problem.d <= 128 else "torch_ref"), str(d)
