"""The adapter's argument handling, checked numerically against the float64 reference on the CPU.

The provider chosen through the real entry point calls the stand-in AITER (real signature and
conventions, torch arithmetic). The only substitution is the device-to-arch function, so CPU tensors
can play gfx942/gfx950 tensors; the real device check is tested separately and rejects them.
"""

from __future__ import annotations

import pytest
import torch
from mqa_provider_flydsl.kernel import KERNEL, FlyDSLKernel, call_flydsl

import mqa_core
from mqa_core import Problem
from mqa_core.testing import calc_diff, make_inputs


def _with_negative_zeros(t: torch.Tensor) -> torch.Tensor:
    """Put some e4m3fn -0 bytes (0x80, a NaN if read as fnuz) where gfx942's conversion must patch them."""
    t.view(torch.uint8).reshape(-1)[::7] = 0x80
    return t


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
    return type(provider.impl)(arch_of_device=lambda device: arch)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("h", [16, 32, 64])
@pytest.mark.parametrize("clean_logits", [True, False])
@pytest.mark.parametrize("m, n, k_scale_2d", [(1, 300, False), (37, 513, True), (64, 256, False)])
def test_matches_reference(amd_aiter, monkeypatch, arch, h, clean_logits, m, n, k_scale_2d):
    amd_aiter("0.1.23")
    monkeypatch.setenv("MQA_TEST_AITER_GFX", arch)
    x = make_inputs(Problem(m, n, h, 128), seed=1000 * h + m, k_scale_2d=k_scale_2d)
    _with_negative_zeros(x.q)
    _with_negative_zeros(x.k)
    out = _flydsl_as(arch).fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    _assert_matches(out, x.reference(), clean_logits)

    from aiter.ops.flydsl.fp8_mqa_logits_kernels import CALLS  # the stand-in's record of the call

    call = CALLS[-1]
    assert call["arch"] == arch
    assert call["q"] == (torch.float8_e4m3fn, (m, max(h, 32) if arch == "gfx950" else h, 128))
    assert call["kv"] == (torch.float8_e4m3fn, (n, 128))  # e4m3fn passed through: AITER converts
    assert call["kv_scales"] == (torch.float32, (n,))
    assert call["windows"] == (torch.int32, torch.int32)
    assert call["clean_logits"] is clean_logits


@pytest.mark.parametrize("window", ["causal", "full", "chunk", "ragged"])
def test_window_patterns_and_d64(amd_aiter, window):
    amd_aiter("0.1.23")
    x = make_inputs(Problem(48, 700, 32, 64), window=window, seed=7)
    out = _flydsl_as("gfx942").fp8_mqa_logits(*x.args())
    _assert_matches(out, x.reference(), True)


def test_non_contiguous_inputs_and_int64_windows(amd_aiter):
    amd_aiter("0.1.23")
    x = make_inputs(Problem(20, 333, 64, 128), seed=3)
    q = x.q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strided
    weights = x.weights.t().contiguous().t()
    out = call_flydsl(_stand_in_entry(), "gfx942", q, (x.k, x.k_scale), weights,
                      x.ks.long(), x.ke.long())
    assert not q.is_contiguous() and not weights.is_contiguous()
    _assert_matches(out, x.reference(), True)


def _stand_in_entry():
    from aiter.ops.flydsl import flydsl_fp8_mqa_logits

    return flydsl_fp8_mqa_logits


@pytest.mark.parametrize("m, n", [(0, 64), (5, 0)])
def test_empty_problem_launches_nothing(amd_aiter, m, n):
    amd_aiter("0.1.23")
    x = make_inputs(Problem(m, n, 32, 128), seed=0)
    out = _flydsl_as("gfx950").fp8_mqa_logits(*x.args())
    assert out.shape == (m, n) and out.dtype == torch.float32
    from aiter.ops.flydsl.fp8_mqa_logits_kernels import CALLS

    assert CALLS == []


def test_real_device_check_rejects_cpu_tensors(amd_aiter):
    amd_aiter("0.1.23")
    x = make_inputs(Problem(4, 64, 32, 128), seed=0)
    with pytest.raises(RuntimeError, match=r"runs on gfx942 and gfx950 GPUs; the tensors are on cpu \(cpu\)"):
        KERNEL.fp8_mqa_logits(*x.args())
    with pytest.raises(ValueError, match="serves gfx942, gfx950; the tensors are on cpu"):
        mqa_core.get_provider("gfx942").fp8_mqa_logits(*x.args())


def test_adapter_refuses_an_arch_aiter_cannot_serve(amd_aiter):
    amd_aiter("0.1.22")
    x = make_inputs(Problem(4, 64, 32, 128), seed=0)
    with pytest.raises(RuntimeError, match="flydsl cannot run on gfx950: amd-aiter 0.1.22 is too old"):
        FlyDSLKernel(arch_of_device=lambda device: "gfx950").fp8_mqa_logits(*x.args())
