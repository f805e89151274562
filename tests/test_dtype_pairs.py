"""Capability per operand: a spec declares (q dtype, k dtype) pairs, optionally per arch; selection,
validation, explain and get_provider judge the pair; torch_ref serves every pair, checked against
the float64 oracle."""

import dataclasses
import textwrap

import pytest
import torch

import mqa_core
from mqa_core import DTYPE_PAIRS, Problem, ProviderSpec
from mqa_core.select import decide
from mqa_core.settings import Settings
from mqa_core.testing import calc_diff, make_inputs, make_paged_inputs

FN, FNUZ = "float8_e4m3fn", "float8_e4m3fnuz"
AMD_PAIRS = {"gfx942": [(FNUZ, FNUZ), (FN, FNUZ), (FN, FN)], "any": [(FN, FN)]}


def spec(name="p", priority=1, archs=("sm_90", "gfx942"), **kw):
    return ProviderSpec(name=name, ops={"fp8_mqa_logits"}, archs=archs, priority=priority,
                        load=f"pkg.{name}:OBJ", **kw)


# -- the spec --------------------------------------------------------------------------------------

def test_dtypes_means_the_same_flavour_for_q_and_k_on_every_arch():
    s = spec(dtypes={FN, FNUZ})
    assert s.pairs_for("sm_90") == s.pairs_for("gfx942") == {(FN, FN), (FNUZ, FNUZ)}
    assert dict(s.dtype_pairs) == {"any": frozenset({(FN, FN), (FNUZ, FNUZ)})}


def test_pairs_per_arch_with_a_default():
    s = spec(dtype_pairs=AMD_PAIRS)
    assert s.pairs_for("gfx942") == {(FNUZ, FNUZ), (FN, FNUZ), (FN, FN)}
    assert s.pairs_for("sm_90") == {(FN, FN)}
    assert s.pairs_for("gfx950") == frozenset()  # not an arch it serves
    assert s.dtypes == {FN, FNUZ}  # derived: flavours declared for q and k alike somewhere


def test_flat_pairs_and_torch_dtypes():
    s = spec(dtype_pairs=[(torch.float8_e4m3fn, torch.float8_e4m3fnuz)])
    assert s.pairs_for("sm_90") == {(FN, FNUZ)} and s.dtypes == frozenset()


def test_spec_with_pairs_stays_a_hashable_value_and_survives_replace():
    a, b = spec(dtype_pairs=AMD_PAIRS), spec(dtype_pairs={"GFX942": AMD_PAIRS["gfx942"], "any": [(FN, FN)]})
    assert a == b and hash(a) == hash(b)
    c = dataclasses.replace(a, distribution="d", version="1")
    assert c.pairs_for("gfx942") == a.pairs_for("gfx942") and c.dtypes == a.dtypes
    assert spec(dtypes={FN}) == spec(dtype_pairs=[(FN, FN)])
    d = dataclasses.replace(a, dtype_pairs=[(FN, FNUZ)])  # dtype_pairs is the declaration; dtypes follows
    assert d.pairs_for("sm_90") == {(FN, FNUZ)} and d.dtypes == frozenset()


@pytest.mark.parametrize("kw, words", [
    ({}, "declare dtypes"),
    ({"dtypes": {"bfloat16"}}, "dtypes"),
    ({"dtype_pairs": [(FN, "bfloat16")]}, "is not a (q_dtype, k_dtype) pair"),
    ({"dtype_pairs": [(FN, FN, FN)]}, "is not a (q_dtype, k_dtype) pair"),
    ({"dtype_pairs": [FN]}, "is not a (q_dtype, k_dtype) pair"),
    ({"dtype_pairs": FN}, "dtype_pairs must be pairs"),
    ({"dtype_pairs": {"gfx950": [(FN, FN)], "any": [(FN, FN)]}}, "lists gfx950, which archs does not declare"),
    ({"dtype_pairs": {"gfx942": [(FN, FN)]}}, "covers neither sm_90 nor 'any'"),
    ({"dtype_pairs": {"gfx942": [], "any": [(FN, FN)]}}, "must be a non-empty collection"),
    ({"dtype_pairs": {"hopper": [(FN, FN)]}}, "malformed arch 'hopper'"),
])
def test_invalid_pairs_say_what_is_wrong(kw, words):
    with pytest.raises(ValueError, match="invalid ProviderSpec") as err:
        spec(**kw)
    assert words in str(err.value)


# -- selection -------------------------------------------------------------------------------------

SPECS = [spec("amd", 300, archs=("gfx942",), dtype_pairs=AMD_PAIRS["gfx942"]),
         spec("fn_only", 200, dtypes={FN}),
         spec("ref", 0, archs={"any"}, dtype_pairs=DTYPE_PAIRS)]


@pytest.mark.parametrize("dtype, arch, chosen", [
    (FNUZ, "gfx942", "amd"), ((FN, FNUZ), "gfx942", "amd"), (FN, "gfx942", "amd"),
    ((FNUZ, FN), "gfx942", "ref"), (FNUZ, "sm_90", "ref"), (FN, "sm_90", "fn_only"),
    (torch.float8_e4m3fnuz, "gfx942", "amd"), ([torch.float8_e4m3fn, FNUZ], "gfx942", "amd"),
])
def test_selection_judges_the_pair(dtype, arch, chosen):
    assert decide(SPECS, [], Settings(), arch=arch, op="fp8_mqa_logits", dtype=dtype).chosen == chosen


def test_a_dtype_rejection_says_what_is_declared_and_what_was_asked():
    d = decide(SPECS, [], Settings(), arch="gfx942", op="fp8_mqa_logits", dtype=(FN, FNUZ))
    c = d.candidate("fn_only")
    assert c.code == "dtype"
    assert c.reason == f"declares ({FN}, {FN}) on gfx942; asked for ({FN}, {FNUZ})"
    assert d.dtype == (FN, FNUZ) and f"q={FN} k={FNUZ}" in str(d)
    assert d.candidate("amd").pairs == ((FN, FN), (FN, FNUZ), (FNUZ, FNUZ))
    assert "fn/fnuz" in str(d)


@pytest.mark.parametrize("bad", ["bfloat16", (FN,), (FN, FN, FN), ("float8_e5m2", FN), 3])
def test_a_bad_dtype_request_raises(bad):
    with pytest.raises(ValueError, match="dtype"):
        mqa_core.get_provider("cpu", dtype=bad)


def test_public_api_takes_a_q_dtype_or_a_pair():
    assert mqa_core.get_provider("gfx1151", dtype=FNUZ).name == "torch_ref"
    for dtype in (FN, torch.float8_e4m3fn, (FN, FN), [FN, FN]):
        assert mqa_core.get_provider("sm_90", dtype=dtype).name == "gluon"
    assert mqa_core.get_provider("sm_90", dtype=(FN, FNUZ)).name == "torch_ref"
    d = mqa_core.explain("sm_90", dtype=(FN, FNUZ))
    assert d.candidate("gluon").code == "dtype" and d.chosen == "torch_ref"
    assert f"declares ({FN}, {FN}) on sm_90; asked for ({FN}, {FNUZ})" == d.candidate("gluon").reason


# -- validation and the call -----------------------------------------------------------------------

MIXED = Problem(9, 70, 8, 64)


def mixed_inputs(q_dtype, k_dtype, p=MIXED, window="ragged", seed=0, **kw):
    a = make_inputs(p, window=window, dtype=q_dtype, seed=seed, **kw)
    b = make_inputs(p, window=window, dtype=k_dtype, seed=seed + 1, **kw)
    return dataclasses.replace(a, k=b.k)


FN_ONLY_PLUGIN = textwrap.dedent("""
    from mqa_core import ProviderSpec, hookimpl

    class Kernels:
        def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
            raise AssertionError("a pair it does not declare reached it")

    KERNELS = Kernels()

    @hookimpl
    def mqa_providers():
        return [ProviderSpec(name="fn_only", ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                             priority=500, load="fn_only_plugin:KERNELS")]
    """)


def test_public_op_chooses_on_the_pair_and_skips_a_provider_that_does_not_declare_it(install_dist):
    install_dist("fn-only", "1.0", {"fn_only_plugin.py": FN_ONLY_PLUGIN},
                 {"mqa_core.providers": {"fn_only": "fn_only_plugin"}})
    inp = mixed_inputs(torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    out = mqa_core.fp8_mqa_logits(*inp.args())  # torch_ref serves it; fn_only's kernel would raise
    assert calc_diff(out, inp.reference()) < 1e-9
    p = mqa_core.get_provider("cpu")
    assert p.name == "fn_only"
    with pytest.raises(TypeError, match=rf"q and k are \({FN}, {FNUZ}\), but provider fn_only declares "
                                        rf"\({FN}, {FN}\) on cpu"):
        p.fp8_mqa_logits(*inp.args())


def test_paged_op_uses_q_flavour_for_the_cache():
    inp = make_paged_inputs(2, 2, 4, 64, 80, block_size=16)
    p = mqa_core.Provider(dataclasses.replace(mqa_core.get_provider("cpu").spec, dtype_pairs=[(FN, FNUZ)]),
                          mqa_core.get_provider("cpu").impl)
    with pytest.raises(TypeError, match=rf"q \(and the cache\) are \({FN}, {FN}\)"):
        p.fp8_paged_mqa_logits(*inp.args())


# -- torch_ref serves every pair, checked against float64 ------------------------------------------

@pytest.mark.parametrize("q_dtype, k_dtype", DTYPE_PAIRS, ids=[f"{q[11:]}-{k[11:]}" for q, k in DTYPE_PAIRS])
@pytest.mark.parametrize("window", ["causal", "ragged", "full"])
def test_torch_ref_matches_the_oracle_for_every_pair(q_dtype, k_dtype, window):
    inp = mixed_inputs(getattr(torch, q_dtype), getattr(torch, k_dtype), window=window, seed=7)
    assert (inp.q.dtype, inp.k.dtype) == (getattr(torch, q_dtype), getattr(torch, k_dtype))
    out = mqa_core.fp8_mqa_logits(*inp.args())
    ref = inp.reference()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(out), ~finite), "-inf mask differs"
    torch.testing.assert_close(out[finite].double(), ref[finite], rtol=1e-5, atol=1e-5)
    assert calc_diff(out, ref) < 1e-9
    # each operand is read in its own flavour: reading k as q's flavour would be far off
    if q_dtype != k_dtype:
        wrong = dataclasses.replace(inp, k=inp.k.view(inp.q.dtype))
        assert calc_diff(out, wrong.reference()) > 1e-3
    assert mqa_core.get_provider("cpu", dtype=(q_dtype, k_dtype)).name == "torch_ref"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_torch_ref_paged_matches_the_oracle_for_each_flavour(dtype):
    inp = make_paged_inputs(2, 2, 8, 64, 120, block_size=16, dtype=dtype, seed=5)
    assert inp.q.dtype == dtype
    out = mqa_core.fp8_paged_mqa_logits(*inp.args())
    ref = inp.reference()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    assert calc_diff(out, ref) < 1e-9
    assert mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits", dtype=dtype).name == "torch_ref"
