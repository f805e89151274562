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
    ({"archs": {"hopper"}}, "archs"),
    ({"archs": {"sm_90\n", "x"}}, "archs"),
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


@pytest.mark.parametrize("text", ["cuda", "", "hopper", "gfx99", "sm_9", "sm_1000", "9", "gfx942x", "sm_90b", "mi300"])
def test_normalize_arch_rejects_malformed_names_with_accepted_forms(text):
    with pytest.raises(ValueError, match="malformed arch .*: accepted forms are .*gfx942"):
        normalize_arch(text)


@pytest.mark.parametrize("text, arch", [("sm_91", "sm_91"), ("gfx1151", "gfx1151"), ("gfx999", "gfx999"),
                                        ("sm_100a", "sm_100"), ("sm_100f", "sm_100"), ("12.1", "sm_121"),
                                        ("gfx90a:xnack+", "gfx90a"), ("sm_120", "sm_120")])
def test_any_well_formed_arch_is_accepted_and_normalised(text, arch):
    assert normalize_arch(text) == arch


def test_specs_accept_and_normalise_any_well_formed_arch():
    assert spec(archs={"gfx1151", "SM90", "sm_91"}).archs == {"gfx1151", "sm_90", "sm_91"}


@pytest.mark.parametrize("arch", ["gfx1151", "sm_91", "sm_121", "gfx1036"])
def test_undeclared_archs_are_served_by_whoever_serves_them(arch):
    import mqa_core

    assert mqa_core.get_provider(arch).name == "torch_ref"
    d = mqa_core.explain(arch)
    assert d.arch == arch and d.candidate("gluon").code == "arch"


def test_known_archs_is_documentation_only():
    import mqa_core

    assert "gfx942" in mqa_core.KNOWN_ARCHS and "gfx1036" not in mqa_core.KNOWN_ARCHS
    assert normalize_arch("gfx1036") == "gfx1036"


@pytest.mark.parametrize("name", ["sm_\u0669\u0660", "\u0669.\u0660", "gfx\u0669\u0664\u0662", "sm_\uff19\uff10"])
def test_arch_names_are_ascii(name):
    """Issue 37: non-ASCII digits (sm_٩٠) were accepted as an arch."""
    with pytest.raises(ValueError, match="malformed arch"):
        normalize_arch(name)
    with pytest.raises(ValueError, match="archs"):
        spec(archs={name})


def test_a_non_ascii_arch_is_exit_2(capsys):
    import mqa_core
    from mqa_core.cli.main import main

    with pytest.raises(ValueError, match="malformed arch"):
        mqa_core.get_provider("sm_\u0669\u0660")
    assert main(["explain", "--arch", "sm_\u0669\u0660"]) == 2
    assert capsys.readouterr().err.startswith("mqa: error: malformed arch 'sm_\u0669\u0660': arch names are ASCII")
