"""The adapter's argument handling, checked numerically against the float64 reference on the CPU.

The provider chosen through the real entry point calls the stand-in AITER (real signature, dtype
handling, limits and stream convention; torch arithmetic). The only substitutions are the
device-to-arch and device-to-stream functions, so CPU tensors can play gfx942/gfx950 tensors; the
real device check is tested separately and rejects them.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from mqa_provider_flydsl import pairs
from mqa_provider_flydsl.kernel import KERNEL, FlyDSLKernel, call_flydsl
from mqa_provider_flydsl.limits import shape_limits

import mqa_core
from mqa_core import Problem
from mqa_core.testing import calc_diff, make_inputs

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
#: Every (arch, q dtype, k dtype) the spec declares.
DECLARED = [(arch, getattr(torch, q), getattr(torch, k))
            for arch in sorted(pairs.DECLARED) for q, k in sorted(pairs.DECLARED[arch])]


def _stream(device: torch.device) -> tuple[str, str]:
    return ("stream of", str(device))


def _inputs(problem: Problem, q_dtype: torch.dtype, k_dtype: torch.dtype, seed: int, **kw):
    """make_inputs with q and k drawn in their own flavours; e4m3fn operands carry some -0 bytes."""
    x = make_inputs(problem, dtype=q_dtype, seed=seed, **kw)
    if k_dtype != q_dtype:
        x = dataclasses.replace(x, k=make_inputs(problem, dtype=k_dtype, seed=seed + 1, **kw).k)
    for t in (x.q, x.k):
        if t.dtype == FN and t.numel():  # 0x80: e4m3fn's -0, e4m3fnuz's NaN; gfx942 must patch it
            t.view(torch.uint8).reshape(-1)[::7] = 0x80
    return x


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, clean_logits: bool) -> None:
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert out.stride(-1) == 1
    inside = torch.isfinite(ref)
    assert torch.isfinite(out[inside]).all(), "an in-window cell was not written"
    if clean_logits:
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs"
    if inside.any():
        assert calc_diff(out[inside], ref[inside]) < 1e-3


def _flydsl_as(arch: str) -> FlyDSLKernel:
    provider = mqa_core.get_provider(arch)
    assert provider.name == "flydsl"
    return type(provider.impl)(arch_of_device=lambda device: arch, stream_of=_stream)


def _calls() -> list[dict]:
    """The stand-in's record of its calls, from whichever module defines the entry."""
    return sys.modules[_entry().__module__].CALLS


@pytest.mark.parametrize("arch, q_dtype, k_dtype", DECLARED)
@pytest.mark.parametrize("h", [16, 64])
@pytest.mark.parametrize("clean_logits", [True, False])
@pytest.mark.parametrize("m, n, k_scale_2d", [(1, 300, False), (37, 513, True)])
def test_every_declared_pair_matches_reference(amd_aiter, monkeypatch, arch, q_dtype, k_dtype, h,
                                               clean_logits, m, n, k_scale_2d):
    amd_aiter()
    monkeypatch.setenv("MQA_TEST_AITER_GFX", arch)
    x = _inputs(Problem(m, n, h, 128), q_dtype, k_dtype, seed=1000 * h + m, k_scale_2d=k_scale_2d)
    out = _flydsl_as(arch).fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    _assert_matches(out, x.reference(), clean_logits)

    call = _calls()[-1]
    padded = arch == "gfx950" and h < 32
    assert call["arch"] == arch
    # Each operand reaches AITER in its own flavour, and (unless heads are padded) as the same tensor:
    # nothing was converted or copied on the way.
    assert call["q"] == (q_dtype, (m, 32 if padded else h, 128))
    assert call["kv"] == (k_dtype, (n, 128)) and call["kv_ptr"] == x.k.data_ptr()
    assert padded or call["q_ptr"] == x.q.data_ptr()
    assert call["kv_scales"] == (torch.float32, (n,))
    assert call["windows"] == (torch.int32, torch.int32)
    assert call["clean_logits"] is clean_logits
    assert call["stream"] == ("stream of", "cpu")  # q's device's stream, never AITER's own default


@pytest.mark.parametrize("q_dtype, k_dtype", [(FNUZ, FNUZ), (FN, FNUZ), (FN, FN), (FNUZ, FN)])
def test_released_gfx942_aiter_converts_each_fn_operand_itself(amd_aiter, q_dtype, k_dtype):
    amd_aiter(gfx950=False)  # v0.1.18 to v0.1.20.post1: gfx942-only, rows padded to the block
    x = _inputs(Problem(23, 700, 32, 64), q_dtype, k_dtype, seed=5, window="causal")
    out = _flydsl_as("gfx942").fp8_mqa_logits(*x.args())
    _assert_matches(out, x.reference(), True)
    assert _calls()[-1]["q"][0] == q_dtype and _calls()[-1]["kv"][0] == k_dtype


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("h", [256, 512])
def test_many_heads(amd_aiter, monkeypatch, arch, h):
    # Nothing in AITER bounds H: the builder unrolls H // MFMA_M head tiles.
    amd_aiter()
    monkeypatch.setenv("MQA_TEST_AITER_GFX", arch)
    problem = Problem(3, 90, h, 128)
    assert shape_limits(problem) is None
    x = _inputs(problem, FN, FN, seed=h)
    _assert_matches(_flydsl_as(arch).fp8_mqa_logits(*x.args()), x.reference(), True)
    assert _calls()[-1]["q"] == (FN, (3, h, 128))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("h", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
def test_every_declared_shape_runs_in_the_stand_in(amd_aiter, monkeypatch, arch, h, d):
    amd_aiter()
    monkeypatch.setenv("MQA_TEST_AITER_GFX", arch)
    problem = Problem(2, 40, h, d)
    assert shape_limits(problem) is None
    x = _inputs(problem, FN, FN, seed=h + d)
    _assert_matches(_flydsl_as(arch).fp8_mqa_logits(*x.args()), x.reference(), True)


@pytest.mark.parametrize("h, d", [(8, 128), (24, 128), (48, 64), (64, 96)])
def test_shapes_the_limits_refuse_are_refused_by_aiter_too(amd_aiter, h, d):
    amd_aiter()
    problem = Problem(2, 40, h, d)
    assert shape_limits(problem) is not None
    x = _inputs(problem, FN, FN, seed=1)
    with pytest.raises(AssertionError, match="power of 2|multiple of MFMA_M"):
        call_flydsl(_entry(), "gfx942", x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke)


@pytest.mark.parametrize("q_dtype, k_dtype", [(FNUZ, FNUZ), (FN, FNUZ), (FNUZ, FN)])
def test_gfx950_refuses_fnuz_before_aiter_sees_it(amd_aiter, q_dtype, k_dtype):
    amd_aiter()
    x = _inputs(Problem(4, 64, 32, 128), q_dtype, k_dtype, seed=0)
    with pytest.raises(TypeError, match=r"on gfx950 takes \(q, k\) dtypes \(float8_e4m3fn, "
                                        r"float8_e4m3fn\); got"):
        _flydsl_as("gfx950").fp8_mqa_logits(*x.args())
    assert _calls() == []


def test_released_aiter_on_gfx950_would_misread_fnuz(amd_aiter, monkeypatch):
    # Why the gfx950 check insists on the gfx950 path: a released, gfx942-only entry on gfx950
    # converts nothing and its OCP MFMA reads fnuz bytes as e4m3fn (twice the value), silently.
    amd_aiter(gfx950=False)
    monkeypatch.setenv("MQA_TEST_AITER_GFX", "gfx950")
    x = _inputs(Problem(4, 64, 32, 128), FNUZ, FNUZ, seed=0, window="full")
    out = _entry()(x.q, x.k, x.k_scale, x.weights, x.ks, x.ke)
    ref = x.reference().float()
    assert not calc_diff(out, ref) < 1e-3


def _flydsl_as_unchecked(arch: str) -> FlyDSLKernel:
    return FlyDSLKernel(arch_of_device=lambda device: arch, stream_of=_stream)


def _entry():
    from aiter.ops.flydsl import flydsl_fp8_mqa_logits

    return flydsl_fp8_mqa_logits


def test_stream_defaults_to_the_current_stream_of_qs_device(amd_aiter, monkeypatch):
    amd_aiter()
    asked = []

    def current_stream(device):
        asked.append(device)
        return f"current stream of {device}"

    monkeypatch.setattr("mqa_provider_flydsl.kernel._current_stream", current_stream)
    x = _inputs(Problem(4, 64, 32, 128), FN, FNUZ, seed=0)
    FlyDSLKernel(arch_of_device=lambda device: "gfx942").fp8_mqa_logits(*x.args())
    assert asked == [x.q.device]
    assert _calls()[-1]["stream"] == "current stream of cpu"


@pytest.mark.parametrize("window", ["causal", "full", "chunk", "ragged"])
def test_window_patterns_and_d64(amd_aiter, window):
    amd_aiter()
    x = _inputs(Problem(48, 700, 32, 64), FN, FNUZ, window=window, seed=7)
    out = _flydsl_as("gfx942").fp8_mqa_logits(*x.args())
    _assert_matches(out, x.reference(), True)


@pytest.mark.parametrize("layout_gfx950", [True, False])
def test_non_contiguous_inputs_and_int64_windows(amd_aiter, layout_gfx950):
    amd_aiter(gfx950=layout_gfx950)  # released entries do not make Q and KV contiguous themselves
    x = _inputs(Problem(20, 333, 64, 128), FNUZ, FNUZ, seed=3)
    q = x.q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strided
    k = torch.cat([x.k.view(torch.uint8)] * 2, dim=1)[:, :128].view(FNUZ)
    weights = x.weights.t().contiguous().t()
    k_scale = torch.stack([x.k_scale, x.k_scale], dim=1)[:, :1]
    assert not (q.is_contiguous() or k.is_contiguous() or weights.is_contiguous()
                or k_scale.reshape(-1).is_contiguous())
    out = call_flydsl(_entry(), "gfx942", q, (k, k_scale), weights, x.ks.long(), x.ke.long())
    _assert_matches(out, x.reference(), True)


@pytest.mark.parametrize("m, n", [(0, 64), (5, 0)])
def test_empty_problem_launches_nothing(amd_aiter, m, n):
    amd_aiter()
    x = _inputs(Problem(m, n, 32, 128), FN, FN, seed=0)
    out = _flydsl_as("gfx950").fp8_mqa_logits(*x.args())
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert _calls() == []


def test_real_device_check_rejects_cpu_tensors(amd_aiter):
    amd_aiter()
    x = _inputs(Problem(4, 64, 32, 128), FN, FN, seed=0)
    with pytest.raises(RuntimeError, match=r"runs on gfx942 and gfx950 GPUs; the tensors are on cpu \(cpu\)"):
        KERNEL.fp8_mqa_logits(*x.args())
    with pytest.raises(ValueError, match="serves gfx942, gfx950; the tensors are on cpu"):
        mqa_core.get_provider("gfx942").fp8_mqa_logits(*x.args())


def test_adapter_refuses_an_arch_aiter_cannot_serve(amd_aiter):
    amd_aiter(gfx950=False)
    x = _inputs(Problem(4, 64, 32, 128), FN, FN, seed=0)
    with pytest.raises(RuntimeError, match="flydsl cannot run on gfx950: amd-aiter 0.1.20.post1's "
                                           "FlyDSL MQA-logits entry .* is gfx942-only"):
        _flydsl_as_unchecked("gfx950").fp8_mqa_logits(*x.args())
