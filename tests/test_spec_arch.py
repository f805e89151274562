"""ProviderSpec/Problem validation and arch normalisation."""

import pytest

from mqa_core import Problem, ProviderSpec, normalize_arch


def spec(**kw):
    base = dict(name="p", ops={"fp8_mqa_logits"}, archs={"sm_90"}, dtypes={"float8_e4m3fn"},
                priority=1, load="pkg.mod:OBJ")
    base.update(kw)
    return ProviderSpec(**base)


def test_spec_stores_frozensets_and_is_hashable():
    s = spec(archs=["sm_90", "gfx950"], ops="fp8_mqa_logits")
    assert s.archs == frozenset({"sm_90", "gfx950"}) and s.ops == frozenset({"fp8_mqa_logits"})
    assert hash(s) == hash(spec(archs=("gfx950", "sm_90")))


@pytest.mark.parametrize("kw, words", [
    ({"name": "Bad Name"}, "name"),
    ({"ops": {"matmul"}}, "ops"),
    ({"archs": {"sm_91"}}, "archs"),
    ({"archs": set()}, "archs"),
    ({"dtypes": {"bfloat16"}}, "dtypes"),
    ({"priority": 1.5}, "priority"),
    ({"priority": True}, "priority"),
    ({"load": "no_colon"}, "load"),
    ({"check": "not callable"}, "check"),
])
def test_invalid_specs_say_which_field(kw, words):
    with pytest.raises(ValueError, match=words):
        spec(**kw)


def test_any_arch_serves_everything():
    s = spec(archs={"any"})
    assert s.serves_arch("gfx942") and s.serves_arch("cpu")
    assert not spec().serves_arch("gfx942")


def test_problem_parse_and_validation():
    assert Problem.parse("4096, 16384,64,128") == Problem(4096, 16384, 64, 128)
    for bad in ("1,2,3", "a,b,c,d", "1,2,3,-4"):
        with pytest.raises(ValueError, match="M,N,H,D"):
            Problem.parse(bad)
    with pytest.raises(ValueError):
        Problem(-1, 2, 3, 4)


@pytest.mark.parametrize("text, arch", [
    ("sm_90", "sm_90"), ("sm90", "sm_90"), ("SM_90", "sm_90"), ("sm_90a", "sm_90"), ("9.0", "sm_90"),
    ("compute_100", "sm_100"), ("10.0", "sm_100"), ("gfx942:sramecc+:xnack-", "gfx942"),
    ("GFX950", "gfx950"), ("gfx950:sramecc+", "gfx950"), (" cpu ", "cpu"),
])
def test_normalize_arch_accepts_common_spellings(text, arch):
    assert normalize_arch(text) == arch


@pytest.mark.parametrize("text", ["sm_91", "gfx999", "cuda", "", "hopper"])
def test_normalize_arch_rejects_unknown_with_accepted_forms(text):
    with pytest.raises(ValueError, match="accepted forms are .*gfx942"):
        normalize_arch(text)
