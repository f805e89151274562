"""The dispatch plan through real entry points and installed distributions: who serves which arch.

With AMD's AITER present (a stand-in distribution on this CPU machine) gfx942 and gfx950 choose
flydsl; every other arch, and every case where flydsl cannot serve, chooses the next provider (gluon
where it serves, else torch_ref), and ``explain()`` says why flydsl was passed over.
"""

from __future__ import annotations

import importlib.util

import pytest
from mqa_provider_flydsl import pairs

import mqa_core
from mqa_core import KNOWN_ARCHS, Decision, Problem

AMD = ("gfx942", "gfx950")
OTHER = tuple(a for a in KNOWN_ARCHS if a not in AMD)
FN, FNUZ = pairs.FN, pairs.FNUZ
DECLARED = [(arch, q, k) for arch in AMD for q, k in sorted(pairs.DECLARED[arch])]


def _next_provider(d: Decision) -> str:
    """The provider the plan falls back to: the best accepted one other than flydsl."""
    usable = [c.name for c in d.candidates if c.accepted and c.name != "flydsl"]
    assert usable, f"no provider besides flydsl can serve {d.arch}; is torch_ref installed?\n{d}"
    return usable[0]


def _passed_over(d: Decision, code: str, says: str) -> None:
    c = d.candidate("flydsl")
    assert not c.accepted and c.code == code and says in c.reason, str(d)
    assert d.chosen == _next_provider(d), str(d)
    assert "flydsl" in str(d) and says in str(d)
    assert mqa_core.get_provider(d.arch, dtype=d.dtype, problem=d.problem).name == d.chosen


@pytest.mark.parametrize("arch", AMD)
def test_amd_archs_choose_flydsl_when_aiter_is_present(amd_aiter, arch):
    amd_aiter()
    d = mqa_core.explain(arch)
    assert d.chosen == "flydsl" and d.candidate("flydsl").accepted, str(d)
    provider = mqa_core.get_provider(arch)
    assert provider.name == "flydsl" and provider.spec.distribution == "mqa-provider-flydsl"
    assert mqa_core.get_provider(arch, dtype="float8_e4m3fn").name == "flydsl"


@pytest.mark.parametrize("arch", OTHER)
def test_other_archs_choose_the_next_provider(amd_aiter, arch):
    amd_aiter()
    _passed_over(mqa_core.explain(arch), "arch", f"declares archs gfx942, gfx950; asked for {arch}")


@pytest.mark.parametrize("arch", AMD)
def test_aiter_absent(arch):
    if importlib.util.find_spec("aiter") is not None:
        pytest.skip("this environment has a package named 'aiter' installed")
    _passed_over(mqa_core.explain(arch), "check", "AMD AITER not importable: no module named 'aiter'")


def test_released_gfx942_only_aiter_still_serves_gfx942(amd_aiter):
    amd_aiter(gfx950=False)
    _passed_over(mqa_core.explain("gfx950"), "check", "is gfx942-only (ROCm/aiter#3913")
    assert mqa_core.explain("gfx942").chosen == "flydsl"
    assert mqa_core.get_provider("gfx942").name == "flydsl"


@pytest.mark.parametrize("arch", AMD)
@pytest.mark.parametrize("gfx950", [True, False])
def test_aiter_without_flydsl_goes_to_the_next_provider_naming_flydsl(amd_aiter, arch, gfx950):
    amd_aiter(gfx950=gfx950, flydsl=None)
    says = ("is gfx942-only" if arch == "gfx950" and not gfx950
            else "AMD AITER's FlyDSL entry needs the `flydsl` package")
    _passed_over(mqa_core.explain(arch), "check", says)


@pytest.mark.parametrize("arch", AMD)
def test_blocked(amd_aiter, monkeypatch, arch):
    amd_aiter()
    monkeypatch.setenv("MQA_DISABLE_PROVIDERS", "flydsl")
    mqa_core.reload()
    _passed_over(mqa_core.explain(arch), "blocked", "MQA_DISABLE_PROVIDERS")


@pytest.mark.parametrize("arch", AMD)
def test_unrelated_async_iterator_aiter(async_aiter, arch):
    _passed_over(mqa_core.explain(arch), "check",
                 "the installed 'aiter' is the unrelated async-iterator package (distribution aiter "
                 "0.13.20191203); install AMD's amd-aiter")


@pytest.mark.parametrize("arch", AMD)
def test_aiter_import_raises_without_rocm(aiter_without_rocm, arch):
    _passed_over(mqa_core.explain(arch), "check", "AMD AITER not importable: RuntimeError: stand-in AITER")


@pytest.mark.parametrize("arch", AMD)
@pytest.mark.parametrize("problem", [Problem(64, 1024, 48, 128), Problem(64, 1024, 8, 128),
                                     Problem(64, 1024, 64, 96), Problem(64, 1024, 64, 256),
                                     Problem(2**18, 1024, 64, 128)])
def test_shapes_outside_the_kernel_go_to_the_next_provider(amd_aiter, arch, problem):
    amd_aiter()
    _passed_over(mqa_core.explain(arch, problem=problem), "shape",
                 "AITER's FlyDSL kernel does not compile this shape")
    assert mqa_core.get_provider(arch).name == "flydsl"  # without a problem it still serves


@pytest.mark.parametrize("arch", AMD)
@pytest.mark.parametrize("problem", [Problem(1, 1, 16, 64), Problem(8192, 65536, 64, 128),
                                     Problem(300, 1000, 32, 128), Problem(4, 20000, 128, 128)])
def test_shapes_inside_the_kernel_choose_flydsl(amd_aiter, arch, problem):
    amd_aiter()
    assert mqa_core.explain(arch, problem=problem).chosen == "flydsl"
    assert mqa_core.get_provider(arch, problem=problem).name == "flydsl"


def test_preference_for_flydsl_fails_with_the_reason_rather_than_falling_back(async_aiter, monkeypatch):
    monkeypatch.setenv("MQA_PROVIDER", "flydsl")
    mqa_core.reload()
    with pytest.raises(mqa_core.ProviderUnavailableError, match="unrelated async-iterator package"):
        mqa_core.get_provider("gfx950")


@pytest.mark.parametrize("arch, q, k", DECLARED)
def test_every_declared_pair_chooses_flydsl(amd_aiter, arch, q, k):
    amd_aiter()
    d = mqa_core.explain(arch, dtype=(q, k))
    assert d.chosen == "flydsl", str(d)
    assert mqa_core.get_provider(arch, dtype=(q, k)).name == "flydsl"
    if q == k:
        assert mqa_core.explain(arch, dtype=q).chosen == "flydsl"


@pytest.mark.parametrize("q, k", [(FNUZ, FNUZ), (FN, FNUZ), (FNUZ, FN)])
def test_gfx950_passes_over_flydsl_for_fnuz(amd_aiter, q, k):
    amd_aiter()
    _passed_over(mqa_core.explain("gfx950", dtype=(q, k)), "dtype", "")


@pytest.mark.parametrize("dtype", [FNUZ, (FN, FNUZ)])
def test_gfx942_engine_dtypes_without_aiter_go_to_the_next_provider(amd_aiter, dtype):
    amd_aiter(flydsl=None)
    _passed_over(mqa_core.explain("gfx942", dtype=dtype), "check", "needs the `flydsl` package")
