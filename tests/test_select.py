"""The pure selector: order, ties, preference, blocking, shape limits, checks, and the trace."""

import pytest

from mqa_core import Problem, ProviderSpec
from mqa_core.discovery import BrokenPlugin
from mqa_core.select import decide
from mqa_core.settings import Settings


def spec(name, priority, archs=("sm_90",), **kw):
    return ProviderSpec(name=name, ops=kw.pop("ops", {"fp8_mqa_logits"}), archs=archs,
                        dtypes=kw.pop("dtypes", {"float8_e4m3fn"}), priority=priority,
                        load=f"pkg.{name}:OBJ", **kw)


def small_heads(p: Problem):
    return None if p.h <= 64 else f"H={p.h} > 64"


SPECS = [spec("low", 0, archs={"any"}), spec("mid_b", 100), spec("mid_a", 100),
         spec("high", 300, archs={"gfx950"}), spec("shaped", 250, shape_limits=small_heads)]


def test_highest_priority_then_name_wins():
    d = decide(SPECS, [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen == "shaped"
    assert [c.name for c in d.accepted] == ["shaped", "mid_a", "mid_b", "low"]
    assert d.candidate("high").code == "arch"
    assert "declares archs gfx950; this system has sm_90" in d.candidate("high").reason


def test_order_does_not_depend_on_discovery_order():
    a = decide(SPECS, [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    b = decide(list(reversed(SPECS)), [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    assert a == b


def test_shape_limits_reject_with_reason_and_next_is_chosen():
    d = decide(SPECS, [], Settings(), arch="sm_90", op="fp8_mqa_logits", problem=Problem(8, 8, 128, 128))
    assert d.chosen == "mid_a"
    assert (d.candidate("shaped").code, d.candidate("shaped").reason) == ("shape", "H=128 > 64")


def test_blocked_and_runtime_check():
    checks = {"mid_a": "driver too old"}
    d = decide(SPECS, [], Settings(disabled=frozenset({"shaped"})), arch="sm_90", op="fp8_mqa_logits",
               check=lambda s, arch: checks.get(s.name))
    assert d.chosen == "mid_b"
    assert d.candidate("shaped").code == "blocked"
    assert (d.candidate("mid_a").code, d.candidate("mid_a").reason) == ("check", "driver too old")


def test_preference_is_ordered_and_honoured():
    d = decide(SPECS, [], Settings(preference=("nope", "low", "mid_b")), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen == "low"
    assert d.candidate("shaped").code == "preference"
    assert "MQA_PROVIDER=nope,low,mid_b" in d.why


def test_preference_that_cannot_serve_chooses_nothing_and_lists_reasons():
    d = decide(SPECS, [], Settings(preference=("high",)), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen is None
    text = str(d)
    assert "high" in text and "[arch]" in text and "honoured or fails" in text


def test_dtype_and_op_filters():
    d = decide(SPECS + [spec("fnuz", 999, dtypes={"float8_e4m3fnuz"}),
                        spec("paged", 998, ops={"fp8_paged_mqa_logits"})],
               [], Settings(), arch="sm_90", op="fp8_mqa_logits", dtype="float8_e4m3fn")
    assert d.candidate("fnuz").code == "dtype" and d.candidate("paged").code == "op"
    assert d.chosen == "shaped"


def test_no_provider_says_what_to_install():
    d = decide([], [], Settings(), arch="cpu", op="fp8_mqa_logits")
    assert d.chosen is None and "pip install mqa-provider-torch-ref" in d.why


def test_broken_plugins_are_listed_and_load_errors_reject():
    broken = [BrokenPlugin("bad", "bad-dist", "1.0", "import", "ImportError: boom")]
    d = decide(SPECS, broken, Settings(), arch="sm_90", op="fp8_mqa_logits",
               load_errors={"shaped": "ImportError: no triton"})
    assert d.candidate("bad").code == "broken" and "boom" in d.candidate("bad").reason
    assert d.candidate("shaped").code == "import" and d.chosen == "mid_a"
    assert d.to_dict()["candidates"][-1]["name"] == "bad"


def test_check_that_raises_is_a_rejection():
    def boom(arch):
        raise RuntimeError("no ROCm")
    d = decide([spec("x", 5, check=boom), spec("y", 1)], [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen == "y" and "RuntimeError: no ROCm" in d.candidate("x").reason


@pytest.mark.parametrize("env, expect", [
    ({"MQA_PROVIDER": "a, b,a"}, Settings(preference=("a", "b"))),
    ({"MQA_PLUGINS": ""}, Settings(plugins=frozenset())),
    ({"MQA_DISABLE_PROVIDERS": "x,y", "MQA_STRICT_PLUGINS": "1"},
     Settings(disabled=frozenset({"x", "y"}), strict=True)),
])
def test_settings_from_env(env, expect):
    assert Settings.from_env(env) == expect
