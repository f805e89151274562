"""The real FlyDSL kernel against the float64 reference, on an AMD gfx942/gfx950 GPU (``pytest -m rocm``).

Nothing here runs without ROCm: every test skips, naming what is missing. On an MI300/MI325
(gfx942) or MI350/MI355 (gfx950) with AMD's AITER and flydsl installed, flydsl must be the chosen
provider; if it is not, the test fails with ``mqa explain``'s table rather than skipping, since that
is what a user running these tests wants to know. Every (q, k) dtype pair the spec declares for the
GPU's arch is run: on gfx942 that is every e4m3fn/e4m3fnuz combination AITER converts itself.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mqa_provider_flydsl import pairs
from mqa_provider_flydsl.kernel import KERNEL

import mqa_core
from mqa_core import Problem
from mqa_core.testing import calc_diff, make_inputs

pytestmark = pytest.mark.rocm

#: Every pair declared on any arch; a test whose pair the GPU's arch does not declare skips.
ALL_PAIRS = sorted({p for declared in pairs.DECLARED.values() for p in declared})


def _rocm_arch() -> str | None:
    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return None
    arch = mqa_core.detect_arch()
    return arch if arch in ("gfx942", "gfx950") else None


@pytest.fixture(scope="module")
def rocm_arch() -> str:
    arch = _rocm_arch()
    if arch is None:
        hip = getattr(torch.version, "hip", None)
        pytest.skip(f"needs an AMD gfx942/gfx950 GPU with ROCm (torch {torch.__version__}, "
                    f"HIP {hip or 'none'}, GPU {'present' if torch.cuda.is_available() else 'none'})")
    return arch


@pytest.fixture
def flydsl(rocm_arch: str) -> mqa_core.Provider:
    decision = mqa_core.explain(rocm_arch)
    assert decision.chosen == "flydsl", f"flydsl is not chosen on this {rocm_arch} GPU:\n{decision}"
    return mqa_core.get_provider(rocm_arch)


def _pair(arch: str, pair: tuple[str, str]) -> tuple[torch.dtype, torch.dtype]:
    if pair not in pairs.DECLARED[arch]:
        pytest.skip(f"{arch} does not declare (q, k) = {pair}")
    return getattr(torch, pair[0]), getattr(torch, pair[1])


def _inputs(problem: Problem, q_dtype: torch.dtype, k_dtype: torch.dtype, device: str, **kw):
    seed = int(torch.randint(0, 2**31, ()).item())
    x = make_inputs(problem, dtype=q_dtype, device=device, seed=seed, **kw)
    if k_dtype != q_dtype:
        x = dataclasses.replace(x, k=make_inputs(problem, dtype=k_dtype, device=device, seed=seed + 1,
                                                 **kw).k)
    for t in (x.q, x.k):  # e4m3fn -0 (0x80) is e4m3fnuz's NaN: gfx942 must patch it
        if t.dtype == torch.float8_e4m3fn and t.numel():
            t.view(torch.uint8).reshape(-1)[::7] = 0x80
    return x


def _poison_allocator(m: int, n: int) -> None:
    """Leave NaN in the memory AITER's ``torch.empty`` output will most likely reuse."""
    aligned = (n + 255) // 256 * 256
    block = torch.full((m, aligned), float("nan"), dtype=torch.float32, device="cuda")
    del block


def _check(out: torch.Tensor, ref: torch.Tensor, clean_logits: bool) -> None:
    out = out.cpu()
    assert out.shape == ref.shape and out.dtype == torch.float32 and out.stride(-1) == 1
    inside = torch.isfinite(ref)
    assert torch.isfinite(out[inside]).all(), "an in-window cell was not written"
    if clean_logits:
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs"
    diff = calc_diff(out[inside], ref[inside]) if inside.any() else 0.0
    assert diff < 1e-3, f"calc_diff {diff:.2e}"


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=lambda p: f"{p[0][9:]}-{p[1][9:]}")
@pytest.mark.parametrize("h", [16, 32, 64])
@pytest.mark.parametrize("clean_logits", [True, False])
@pytest.mark.parametrize("m, n, window", [(1, 300, "ragged"), (257, 1000, "ragged"),
                                          (512, 4100, "causal"), (4, 20000, "ragged"),
                                          (300, 2048, "chunk")])
def test_kernel_matches_reference(flydsl, rocm_arch, pair, h, clean_logits, m, n, window):
    q_dtype, k_dtype = _pair(rocm_arch, pair)
    x = _inputs(Problem(m, n, h, 128), q_dtype, k_dtype, "cuda", window=window, k_scale_2d=(m % 2 == 1))
    _poison_allocator(m, n)
    out = flydsl.fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    torch.cuda.synchronize()
    _check(out, x.reference(), clean_logits)


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=lambda p: f"{p[0][9:]}-{p[1][9:]}")
@pytest.mark.parametrize("h, d", [(256, 128), (512, 64), (64, 64)])
def test_many_heads_and_d64(flydsl, rocm_arch, pair, h, d):
    q_dtype, k_dtype = _pair(rocm_arch, pair)
    x = _inputs(Problem(33, 1500, h, d), q_dtype, k_dtype, "cuda", window="causal")
    _check(flydsl.fp8_mqa_logits(*x.args()), x.reference(), True)


def test_runs_on_the_callers_stream(flydsl):
    # AITER would launch on the current device's current stream; the adapter passes q's.
    x = _inputs(Problem(256, 8192, 64, 128), torch.float8_e4m3fn, torch.float8_e4m3fn, "cuda",
                window="causal")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flydsl.fp8_mqa_logits(*x.args())
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    _check(out, x.reference(), True)


def test_tensors_on_another_device_than_the_current_one(flydsl, rocm_arch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: q on cuda:1 while cuda:0 is current")
    torch.cuda.set_device(0)
    x = _inputs(Problem(128, 4096, 64, 128), torch.float8_e4m3fn, torch.float8_e4m3fn, "cuda:1",
                window="ragged")
    out = KERNEL.fp8_mqa_logits(*x.args())
    assert out.device == torch.device("cuda", 1)
    torch.cuda.synchronize(1)
    _check(out, x.reference(), True)


def test_op_dispatches_to_flydsl_for_the_device(flydsl, rocm_arch):
    with_pairs = "dtype_pairs" in {f.name for f in dataclasses.fields(mqa_core.ProviderSpec)}
    for q_name, k_name in sorted(pairs.DECLARED[rocm_arch]):
        if not with_pairs and (q_name, k_name) != (pairs.FN, pairs.FN):
            continue  # this mqa-core judges q's dtype only, and flydsl then declares e4m3fn
        assert mqa_core.get_provider(rocm_arch, dtype=(q_name, k_name) if with_pairs else q_name
                                     ).name == "flydsl"
        x = _inputs(Problem(64, 1000, 64, 128), getattr(torch, q_name), getattr(torch, k_name), "cuda")
        _check(mqa_core.fp8_mqa_logits(*x.args()), x.reference(), True)
