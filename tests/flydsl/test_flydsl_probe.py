"""The FlyDSL provider's own pieces, without the core's selection: spec, pairs, limits, the runtime check."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from mqa_provider_flydsl import SPEC, pairs, probe
from mqa_provider_flydsl.limits import shape_limits

from mqa_core import Problem

FN, FNUZ = pairs.FN, pairs.FNUZ
NEEDS_FLYDSL = "AMD AITER's FlyDSL entry needs the `flydsl` package, which is not installed"


def test_spec_declares_the_kernel():
    assert SPEC.name == "flydsl"
    assert SPEC.archs == {"gfx942", "gfx950"}
    assert SPEC.ops == {"fp8_mqa_logits"}
    assert SPEC.priority == 300
    assert SPEC.load == "mqa_provider_flydsl.kernel:KERNEL"


def test_pairs_are_what_aiter_takes():
    assert pairs.DECLARED["gfx942"] == {(FNUZ, FNUZ), (FN, FNUZ), (FN, FN), (FNUZ, FN)}
    assert pairs.DECLARED["gfx950"] == {(FN, FN)}
    assert pairs.refusal("gfx942", FN, FNUZ) is None
    assert pairs.refusal("gfx950", FNUZ, FNUZ) == (
        "AITER's FlyDSL entry on gfx950 takes (q, k) dtypes (float8_e4m3fn, float8_e4m3fn); "
        "got (float8_e4m3fnuz, float8_e4m3fnuz)")


def test_spec_declares_pairs_per_arch():
    for arch, declared in pairs.DECLARED.items():
        assert SPEC.pairs_for(arch) == declared


@pytest.mark.parametrize("h", [16, 32, 64, 128, 256, 512])
@pytest.mark.parametrize("d", [64, 128])
def test_shapes_inside_the_limits(h, d):
    assert shape_limits(Problem(4096, 65536, h, d)) is None


@pytest.mark.parametrize("problem, says", [
    (Problem(8, 8, 48, 128), "H=48 is not a power of two"),
    (Problem(8, 8, 8, 128), "H=8 is not a power of two >= 16"),
    (Problem(8, 8, 64, 96), "D=96 is not one of 64, 128"),
    (Problem(8, 8, 64, 256), "D=256"),
    (Problem(8, 8, 64, 32), "D=32"),
    (Problem(2**18, 8, 64, 128), "M*H*D=2147483648 (M padded to 262144) overflows"),
    (Problem(2**18 - 3, 8, 64, 128), "M*H*D=2147483648 (M padded to 262144) overflows"),
    (Problem(2**14, 8, 1024, 128), "M*H*D=2147483648"),
    (Problem(8, 2**24, 64, 128), "N*D=2147483648 overflows"),
])
def test_shapes_outside_the_limits(problem, says):
    reason = shape_limits(problem)
    assert reason is not None and says in reason
    assert reason.startswith("AITER's FlyDSL kernel does not compile this shape")


def test_largest_shapes_inside_the_int32_offsets():
    assert shape_limits(Problem(2**18 - 4, 2**24 - 1, 64, 128)) is None


def test_absent():
    if importlib.util.find_spec("aiter") is not None:
        pytest.skip("this environment has a package named 'aiter' installed")
    assert probe.check("gfx942") == ("AMD AITER not importable: no module named 'aiter'; install AMD's "
                                     "amd-aiter (shipped with ROCm builds; not the PyPI package 'aiter')")


def test_aiter_with_the_gfx950_path_serves_both_archs(amd_aiter):
    amd_aiter()
    assert probe.check("gfx942") is None
    assert probe.check("gfx950") is None
    assert probe.check("sm_90") == "AITER's FlyDSL MQA-logits kernel is built for gfx942, gfx950, not sm_90"


def test_released_aiter_is_gfx942_only_and_decided_without_importing(amd_aiter):
    amd_aiter(gfx950=False)
    reason = probe.check("gfx950")
    assert reason is not None and reason.startswith("amd-aiter 0.1.20.post1's FlyDSL MQA-logits entry (")
    assert reason.endswith("kernels/mqa_logits/fp8_mqa_logits.py) is gfx942-only (ROCm/aiter#3913, as "
                           "released in v0.1.18 to v0.1.20.post1); gfx950 needs the gfx950 path of "
                           "ROCm/aiter#4538; gfx942 is served")
    assert "aiter" not in sys.modules  # the files answered; AITER's slow import was not needed
    assert probe.check("gfx942") is None
    assert "aiter" in sys.modules


@pytest.mark.parametrize("gfx950", [True, False])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_aiter_without_flydsl_names_flydsl_not_an_upgrade(amd_aiter, gfx950, arch):
    amd_aiter(gfx950=gfx950, flydsl=None)
    reason = probe.check(arch)
    if arch == "gfx950" and not gfx950:
        assert reason is not None and "is gfx942-only" in reason  # installing flydsl would not help
        return
    assert reason is not None and reason.startswith(NEEDS_FLYDSL)
    assert "exports aiter.ops.flydsl.flydsl_fp8_mqa_logits only when `flydsl` imports" in reason
    assert ">= 0.2.4" in reason and "upgrade" not in reason
    assert "aiter" not in sys.modules  # decided from find_spec, before AITER's import


def test_flydsl_missing_found_at_import_is_named_too(amd_aiter, monkeypatch):
    # The later layout imports flydsl in aiter/ops/flydsl/__init__.py: a flydsl that looked present
    # but does not import (a stale path entry, say) surfaces there as ModuleNotFoundError.
    amd_aiter()
    monkeypatch.setattr(probe, "flydsl_installed", lambda: True)
    monkeypatch.setitem(sys.modules, "flydsl", None)  # "import flydsl" raises ModuleNotFoundError
    reason = probe.check("gfx942")
    assert reason is not None and reason.startswith(NEEDS_FLYDSL)


@pytest.mark.parametrize("gfx950", [True, False])
def test_flydsl_too_old(amd_aiter, gfx950):
    amd_aiter(gfx950=gfx950, flydsl="0.2.1")
    reason = probe.check("gfx942")
    assert reason is not None and reason.endswith(
        "imports, but aiter.ops.flydsl does not: ImportError: Unsupported `flydsl` version: "
        "expected >=`0.2.4`, got `0.2.1`.")


def test_flydsl_present_but_not_for_this_gpu(amd_aiter, monkeypatch):
    # The released layout asks flydsl whether it supports the GPU; without one it exports nothing.
    amd_aiter(gfx950=False)
    monkeypatch.setenv("MQA_TEST_AITER_GFX", "gfx1100")  # an arch flydsl ships no kernels for
    reason = probe.check("gfx942")
    assert reason == ("amd-aiter 0.1.20.post1 exports aiter.ops.flydsl.flydsl_fp8_mqa_logits only when "
                      "aiter.ops.flydsl.is_flydsl_available() is true, and here it is not (`flydsl` "
                      "does not support this machine's GPU)")


def test_a_directory_named_flydsl_is_not_the_package(tmp_path, monkeypatch):
    (tmp_path / "flydsl").mkdir()  # an implicit namespace package, as a checkout's tests/flydsl is
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("flydsl") is not None
    assert probe.flydsl_installed() is False


@pytest.mark.parametrize("gfx950", [True, False])
def test_aiter_older_than_the_entry(amd_aiter, gfx950):
    amd_aiter("0.1.17", gfx950=gfx950, entry=False)
    assert probe.check("gfx942") == ("amd-aiter 0.1.17 has no aiter.ops.flydsl.flydsl_fp8_mqa_logits "
                                     "(added in ROCm/aiter#3913, first released in v0.1.18); upgrade "
                                     "amd-aiter")


def test_async_iterator_aiter_is_not_amd(async_aiter):
    reason = probe.check("gfx942")
    assert reason == ("the installed 'aiter' is the unrelated async-iterator package (distribution "
                      "aiter 0.13.20191203); install AMD's amd-aiter")
    assert "aiter" not in sys.modules  # judged from the package on disk, never executed


def test_both_named_when_the_async_package_shadows_amd(async_aiter, install_dist):
    install_dist("amd-aiter", "0.1.20.post1", {})  # metadata left behind, its aiter/ overwritten
    reason = probe.check("gfx942")
    assert reason is not None and reason.startswith("the installed 'aiter' is the unrelated async-iterator")
    assert ("both amd-aiter 0.1.20.post1 and aiter 0.13.20191203 are installed and share the import "
            "name; pip uninstall aiter") in reason


def test_import_raising_is_reported(aiter_without_rocm):
    assert probe.check("gfx942") == ("AMD AITER not importable: RuntimeError: stand-in AITER: no ROCm/HIP "
                                     "runtime found (hipGetDeviceCount failed)")


def test_v0_1_18_layout_is_found_on_disk(install_dist, flydsl_pkg):
    # v0.1.18 and v0.1.19 kept the entry in aiter/ops/flydsl/kernels/fp8_mqa_logits.py.
    flydsl_pkg()
    entry = "def flydsl_fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True,\n" \
            "                          stream=None, variant=None):\n    pass\n"
    install_dist("amd-aiter", "0.1.18", {
        "aiter/__init__.py": "", "aiter/ops/__init__.py": "",
        "aiter/ops/flydsl/__init__.py": "from .kernels.fp8_mqa_logits import flydsl_fp8_mqa_logits\n",
        "aiter/ops/flydsl/kernels/__init__.py": "", "aiter/ops/flydsl/kernels/fp8_mqa_logits.py": entry})
    found = probe.installed()
    source = probe.entry_source(found.location)
    assert source is not None and source[0].endswith("kernels/fp8_mqa_logits.py")
    assert probe.check("gfx942") is None
    reason = probe.check("gfx950")
    assert reason is not None and "kernels/fp8_mqa_logits.py) is gfx942-only" in reason


def test_entry_outside_the_known_files_is_judged_from_its_loaded_source(install_dist, flydsl_pkg,
                                                                        monkeypatch):
    flydsl_pkg()
    entry = 'def flydsl_fp8_mqa_logits(*args, **kwargs):\n    return "gfx950"\n'
    install_dist("some-bundle", "1.0", {"aiter/__init__.py": "", "aiter/ops/__init__.py": "",
                                        "aiter/ops/flydsl/__init__.py": entry})
    assert probe.entry_source(probe.installed().location) is None
    assert probe.check("gfx942") is None
    assert probe.check("gfx950") is None  # its module names gfx950
    probe.reset()
    monkeypatch.setattr(probe, "_loaded_source", lambda fn: None)
    reason = probe.check("gfx950")
    assert reason is not None and reason.startswith(
        "cannot tell whether AMD AITER has the gfx950 FlyDSL MQA-logits path (ROCm/aiter#4538): "
        "no source of aiter.ops.flydsl.flydsl_fp8_mqa_logits under ")


def test_check_never_raises(monkeypatch):
    def boom(name):
        raise OSError("disk on fire")

    monkeypatch.setattr(probe, "_dist_version", boom)
    assert probe.check("gfx942") == "flydsl runtime check failed: OSError: disk on fire"


def test_import_happens_once_per_discovery(amd_aiter):
    amd_aiter()
    for _ in range(3):
        assert probe.check("gfx942") is None
        assert probe.check("gfx950") is None
    assert probe.load_entry.cache_info().misses == 1
    probe.reset()
    assert probe.load_entry.cache_info().misses == 0
