"""The FlyDSL provider's own pieces, without the core's selection: limits, versions, the runtime check."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from mqa_provider_flydsl import SPEC, probe
from mqa_provider_flydsl.limits import shape_limits

from mqa_core import Problem


def test_spec_declares_the_kernel():
    assert SPEC.name == "flydsl"
    assert SPEC.archs == {"gfx942", "gfx950"}
    assert SPEC.dtypes == {"float8_e4m3fn"}
    assert SPEC.ops == {"fp8_mqa_logits"}
    assert SPEC.priority == 300
    assert SPEC.load == "mqa_provider_flydsl.kernel:KERNEL"


@pytest.mark.parametrize("h", [16, 32, 64, 128])
@pytest.mark.parametrize("d", [64, 128])
def test_shapes_inside_the_limits(h, d):
    assert shape_limits(Problem(4096, 65536, h, d)) is None


@pytest.mark.parametrize("problem, says", [
    (Problem(8, 8, 48, 128), "H=48 is not a power of two"),
    (Problem(8, 8, 8, 128), "H=8 is not a power of two >= 16"),
    (Problem(8, 8, 64, 96), "D=96 is not one of 64, 128"),
    (Problem(8, 8, 64, 256), "D=256"),
    (Problem(8, 8, 64, 32), "D=32"),
    (Problem(2**18, 8, 64, 128), "M*H*D=2147483648 overflows"),
    (Problem(8, 2**24, 64, 128), "N*D=2147483648 overflows"),
])
def test_shapes_outside_the_limits(problem, says):
    reason = shape_limits(problem)
    assert reason is not None and says in reason
    assert reason.startswith("AITER's FlyDSL kernel does not compile this shape")


@pytest.mark.parametrize("version, ok", [
    ("0.1.23", True), ("0.1.23.post1", True), ("0.1.23+rocm7.2.1", True), ("0.1.24.dev3+g1a2b3c", True),
    ("0.1.23.post1.dev2", True), ("0.2", True), ("1.0.0", True), ("v0.1.30", True),
    ("0.1.22", False), ("0.1.22.post9", False), ("0.1.23rc1", False), ("0.1.23.dev5+ge6c7333", False),
    ("0.1.7.post2.dev18", False), ("0.1", False),
])
def test_version_at_least(version, ok):
    assert probe.at_least(version, probe.GFX950_MIN) is ok


def test_unreadable_version_is_not_guessed():
    assert probe.at_least("unknown", probe.GFX950_MIN) is None
    reason = probe.gfx950_reason(probe.Installed(None, "unknown", "/x/aiter"))
    assert reason is not None and "cannot read AMD AITER version 'unknown'" in reason


def test_absent():
    if importlib.util.find_spec("aiter") is not None:
        pytest.skip("this environment has a package named 'aiter' installed")
    assert probe.check("gfx942") == ("AMD AITER not importable: no module named 'aiter'; install AMD's "
                                     "amd-aiter (shipped with ROCm builds; not the PyPI package 'aiter')")


def test_present_serves_both_archs(amd_aiter):
    amd_aiter("0.1.23")
    assert probe.check("gfx942") is None
    assert probe.check("gfx950") is None
    assert probe.check("sm_90") == "AITER's FlyDSL MQA-logits kernel is built for gfx942, gfx950, not sm_90"


def test_too_old_for_gfx950_still_serves_gfx942_and_decides_without_importing(amd_aiter):
    amd_aiter("0.1.22")
    reason = probe.check("gfx950")
    assert reason == ("amd-aiter 0.1.22 is too old for gfx950: gfx950 needs amd-aiter >= 0.1.23 "
                      "(the gfx950 FlyDSL MQA-logits path, ROCm/aiter#4538); gfx942 is served")
    assert "aiter" not in sys.modules  # metadata answered; AITER's slow import was not needed
    assert probe.check("gfx942") is None
    assert "aiter" in sys.modules


def test_async_iterator_aiter_is_not_amd(async_aiter):
    reason = probe.check("gfx942")
    assert reason == ("the installed 'aiter' is the unrelated async-iterator package (distribution "
                      "aiter 0.13.20191203); install AMD's amd-aiter")
    assert "aiter" not in sys.modules  # judged from the package on disk, never executed


def test_both_named_when_the_async_package_shadows_amd(async_aiter, install_dist):
    install_dist("amd-aiter", "0.1.23", {})  # metadata left behind, its aiter/ overwritten
    reason = probe.check("gfx942")
    assert reason is not None and reason.startswith("the installed 'aiter' is the unrelated async-iterator")
    assert ("both amd-aiter 0.1.23 and aiter 0.13.20191203 are installed and share the import name; "
            "pip uninstall aiter") in reason


def test_import_raising_is_reported(aiter_without_rocm):
    assert probe.check("gfx942") == ("AMD AITER not importable: RuntimeError: stand-in AITER: no ROCm/HIP "
                                     "runtime found (hipGetDeviceCount failed)")


def test_aiter_without_the_flydsl_entry(amd_aiter):
    amd_aiter("0.1.10", entry=False)
    assert probe.check("gfx942") == ("AMD AITER 0.1.10 has no aiter.ops.flydsl.flydsl_fp8_mqa_logits "
                                     "(added in ROCm/aiter#3913); upgrade amd-aiter")


def test_source_checkout_without_metadata(install_dist):
    # AITER on PYTHONPATH from a git checkout: no distribution, so no version to trust for gfx950.
    entry = "def flydsl_fp8_mqa_logits(): pass\n"
    install_dist("some-bundle", "1.0", {"aiter/__init__.py": "", "aiter/ops/__init__.py": "",
                                        "aiter/ops/flydsl/__init__.py": entry})
    assert probe.check("gfx942") is None
    reason = probe.check("gfx950")
    assert reason is not None and "cannot tell the AMD AITER version" in reason


def test_check_never_raises(monkeypatch):
    def boom(name):
        raise OSError("disk on fire")

    monkeypatch.setattr(probe, "_dist_version", boom)
    assert probe.check("gfx942") == "flydsl runtime check failed: OSError: disk on fire"


def test_import_happens_once_per_discovery(amd_aiter):
    amd_aiter("0.1.23")
    for _ in range(3):
        assert probe.check("gfx942") is None
        assert probe.check("gfx950") is None
    assert probe.load_entry.cache_info().misses == 1
    probe.reset()
    assert probe.load_entry.cache_info().misses == 0
