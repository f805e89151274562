"""The DeepGEMM provider's own pieces, without the core's selection: spec, limits, generations, the check."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from mqa_provider_deepgemm import SPEC, probe
from mqa_provider_deepgemm.limits import shape_limits

from mqa_core import Problem


def test_spec_declares_what_deepgemm_serves():
    assert SPEC.name == "deepgemm"
    assert SPEC.archs == {"sm_90", "sm_100"}
    assert SPEC.dtypes == {"float8_e4m3fn"}
    assert SPEC.ops == {"fp8_mqa_logits", "fp8_paged_mqa_logits"}
    assert 150 < SPEC.priority < 200  # below gluon, above triton
    assert SPEC.load == "mqa_provider_deepgemm.kernel:KERNEL"


@pytest.mark.parametrize("h", [32, 64])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_shapes_inside_the_limits(h, d):
    assert shape_limits(Problem(8192, 131072, h, d)) is None


@pytest.mark.parametrize("problem, says", [
    (Problem(8, 8, 16, 128), "H=16 is not one of 32, 64"),
    (Problem(8, 8, 128, 128), "H=128"),
    (Problem(8, 8, 48, 128), "H=48"),
    (Problem(8, 8, 64, 256), "D=256 is not one of 32, 64, 128"),
    (Problem(8, 8, 64, 96), "D=96"),
    (Problem(2**25, 8, 64, 128), "M*H=2147483648 overflows"),
    (Problem(8, 2**31 - 512, 64, 128), "N=2147483136 overflows"),
])
def test_shapes_outside_the_limits(problem, says):
    reason = shape_limits(problem)
    assert reason is not None and says in reason
    assert reason.startswith("DeepGEMM's MQA-logits kernels do not take this shape")


def test_block_size_is_judged_when_the_problem_carries_it():
    assert "paged block size 16 is not 64" in (shape_limits(Problem(4, 4096, 64, 128, next_n=2, block_size=16)) or "")
    assert shape_limits(Problem(4, 4096, 64, 128, next_n=2, block_size=64)) is None
    assert shape_limits(Problem(4, 4096, 64, 128)) is None  # built without it: judged at call time


# -- generations, from exports alone --------------------------------------------------------------

def _module(*names: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in names})


def test_detects_the_fp8_fp4_generation_even_with_the_legacy_wrappers():
    api, why = probe.detect(_module(*probe.FP8_FP4_NAMES, *probe.LEGACY_NAMES), "2.6.1")
    assert why is None and api is not None
    assert (api.generation, api.version) == ("fp8_fp4", "2.6.1")


def test_detects_the_legacy_generation():
    api, why = probe.detect(_module(*probe.LEGACY_NAMES), "2.1.0")
    assert why is None and api is not None and api.generation == "legacy"


def test_an_unknown_generation_is_refused_naming_what_is_missing():
    api, why = probe.detect(_module("fp8_gemm_nt", "get_num_sms", "fp8_mqa_logits"), "9.9")
    assert api is None
    assert why == ("DeepGEMM 9.9 exports neither known MQA-logits API: the fp8_fp4 generation lacks "
                   "fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata; the "
                   "legacy one lacks fp8_paged_mqa_logits, get_paged_mqa_logits_metadata (a build "
                   "without the attention kernels, e.g. CUDA < 12.3, or an unknown generation)")


def test_the_generation_calls_map_onto_each_form():
    seen = {}

    def record(name):
        return lambda *args: seen.setdefault(name, args)

    new = types.SimpleNamespace(**{n: record(n) for n in (*probe.FP8_FP4_NAMES, *probe.LEGACY_NAMES)})
    api, _ = probe.detect(new)
    api.mqa_logits("q", "k", "s", "w", "ks", "ke", True)
    api.paged_mqa_logits("q", "cache", "w", "lens", "table", "meta", 77)
    assert seen["fp8_fp4_mqa_logits"] == (("q", None), ("k", "s"), "w", "ks", "ke", True)
    assert seen["fp8_fp4_paged_mqa_logits"] == (("q", None), "cache", "w", "lens", "table", "meta", 77, False)
    old = types.SimpleNamespace(**{n: record("old_" + n) for n in probe.LEGACY_NAMES})
    api, _ = probe.detect(old)
    api.mqa_logits("q", "k", "s", "w", "ks", "ke", False)
    api.paged_mqa_logits("q", "cache", "w", "lens", "table", "meta", 77)
    assert seen["old_fp8_mqa_logits"] == ("q", ("k", "s"), "w", "ks", "ke", False)
    assert seen["old_fp8_paged_mqa_logits"] == ("q", "cache", "w", "lens", "table", "meta", 77, False)


# -- the runtime check, against installed stand-ins -----------------------------------------------

def test_absent():
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("this environment has deep_gemm installed")
    assert probe.check("sm_90") == (
        "DeepGEMM not importable: no module named 'deep_gemm'; build DeepGEMM from source "
        "(github.com/deepseek-ai/DeepGEMM, ./install.sh) or install the build your engine ships (vLLM, SGLang)")


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_103", "sm_120", "gfx942", "cpu"])
def test_other_archs_are_refused_without_importing(deep_gemm, arch):
    deep_gemm("fp8_fp4")
    assert probe.check(arch) == f"DeepGEMM's MQA-logits kernels are written for sm_90, sm_100, not {arch}"
    assert "deep_gemm" not in sys.modules


@pytest.mark.parametrize("generation", ["fp8_fp4", "legacy"])
def test_known_generations_serve_both_archs(deep_gemm, generation):
    deep_gemm(generation, version="2.4.0")
    assert probe.check("sm_90") is None and probe.check("sm_100") is None
    api, why = probe.load_api()
    assert why is None and (api.generation, api.version) == (generation, "2.4.0")


def test_a_build_without_attention_kernels_is_refused(deep_gemm):
    deep_gemm("gemm_only", version="2.0.0")
    reason = probe.check("sm_90")
    assert reason is not None
    assert reason.startswith("DeepGEMM 2.0.0 exports neither known MQA-logits API: the fp8_fp4 generation "
                             "lacks fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata")


def test_import_raising_is_reported(deep_gemm):
    deep_gemm("no_cuda")
    reason = probe.check("sm_90")
    assert reason is not None and reason.startswith("DeepGEMM at ")
    assert reason.endswith("does not import: AssertionError: stand-in DeepGEMM: CUDA home not found "
                           "(_find_cuda_home)")


def test_source_checkout_without_metadata_reads_the_module_version(deep_gemm):
    deep_gemm("fp8_fp4", metadata=False)
    assert probe.installed().version is None
    api, _ = probe.load_api()
    assert api is not None and api.version == "2.6.1"  # deep_gemm.__version__


def test_check_never_raises(monkeypatch, deep_gemm):
    def boom(*args):
        raise OSError("disk on fire")

    with monkeypatch.context() as m:
        m.setattr(probe.importlib.util, "find_spec", boom)
        assert probe.check("sm_90") == "DeepGEMM not importable: OSError: disk on fire"
    deep_gemm("fp8_fp4")
    probe.reset()
    monkeypatch.setattr(probe, "_dist_version", boom)
    assert probe.check("sm_90") == "deepgemm runtime check failed: OSError: disk on fire"


def test_import_happens_once_per_discovery(deep_gemm):
    deep_gemm("fp8_fp4")
    for _ in range(3):
        assert probe.check("sm_90") is None and probe.check("sm_100") is None
    assert probe.load_api.cache_info().misses == 1
    probe.reset()
    assert probe.load_api.cache_info().misses == 0
