"""The pure selector: order, ties, preference, blocking, shape limits, checks, and the trace."""

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
    assert "declares archs gfx950; asked for sm_90" in d.candidate("high").reason


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
    assert d.chosen is None and "pip install ./providers/torch_ref" in d.why


def test_broken_plugins_are_listed_and_load_errors_reject():
    broken = [BrokenPlugin("bad", "bad-dist", "1.0", "import", "ImportError: boom")]
    d = decide(SPECS, broken, Settings(), arch="sm_90", op="fp8_mqa_logits",
               load_errors={SPECS[4].id: "ImportError: no triton"})
    assert d.candidate("bad").code == "broken" and "boom" in d.candidate("bad").reason
    assert d.candidate("shaped").code == "import" and d.chosen == "mid_a"
    assert d.to_dict()["candidates"][-1]["name"] == "bad"


def test_check_that_raises_is_a_rejection():
    def boom(arch):
        raise RuntimeError("no ROCm")
    d = decide([spec("x", 5, check=boom), spec("y", 1)], [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen == "y" and "RuntimeError: no ROCm" in d.candidate("x").reason


def claimant(dist, priority):
    return spec("twin", priority, distribution=dist, version="1")


def test_a_name_two_distributions_claim_is_ambiguous():
    specs = SPECS + [claimant("dist-a", 900), claimant("dist-b", 1)]
    d = decide(specs, [], Settings(), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen == "shaped"  # the claimants' priority (900) buys nothing
    for dist, other in (("dist-a", "dist-b"), ("dist-b", "dist-a")):
        c = d.candidate(f"{dist}:twin")
        assert c.code == "ambiguous" and f"also claimed by {other}==1" in c.reason
        assert f"MQA_PROVIDER={dist}:twin" in c.reason


def test_distribution_colon_name_resolves_ambiguity_and_naming_the_name_does_not():
    specs = SPECS + [claimant("dist-a", 900), claimant("Dist_B", 1)]
    d = decide(specs, [], Settings(preference=("dist-b:twin",)), arch="sm_90", op="fp8_mqa_logits")
    assert (d.chosen, d.chosen_distribution) == ("twin", "Dist_B")
    assert d.candidate("dist-a:twin").code == "ambiguous"
    d = decide(specs, [], Settings(preference=("twin",)), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen is None and "honoured or fails" in d.why


def test_blocking_one_claimant_resolves_the_name():
    specs = [claimant("dist-a", 900), claimant("dist-b", 1)]
    d = decide(specs, [], Settings(disabled=frozenset({"dist-a"})), arch="sm_90", op="fp8_mqa_logits")
    assert (d.chosen, d.chosen_distribution) == ("twin", "dist-b")
    d = decide(specs, [], Settings(disabled=frozenset({"dist-a:twin"})), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen_distribution == "dist-b"
    d = decide(specs, [], Settings(disabled=frozenset({"twin"})), arch="sm_90", op="fp8_mqa_logits")
    assert d.chosen is None and {c.code for c in d.candidates} == {"blocked"}


def test_nothing_left_by_the_allowlist_says_so():
    d = decide([], [], Settings(plugins=frozenset({"nope"})), arch="cpu", op="fp8_mqa_logits",
               skipped=["torch_ref (mqa-provider-torch-ref)"])
    assert "MQA_PLUGINS=nope loads only" in d.why and "torch_ref (mqa-provider-torch-ref)" in d.why
    assert "no provider is installed" not in d.why
    broken = [BrokenPlugin("bad", "bad-dist", "1.0", "import", "ImportError: boom")]
    assert "every installed plugin is broken" in decide([], broken, Settings(), arch="cpu", op="fp8_mqa_logits").why
