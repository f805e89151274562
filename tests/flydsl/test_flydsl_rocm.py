"""The real FlyDSL kernel against the float64 reference, on an AMD gfx942/gfx950 GPU (``pytest -m rocm``).

Nothing here runs without ROCm: every test skips, naming what is missing. On an MI300/MI325
(gfx942) or MI350/MI355 (gfx950) with AMD's AITER installed, flydsl must be the chosen provider; if it
is not, the test fails with ``mqa explain``'s table rather than skipping, since that is what a user
running these tests wants to know.
"""

from __future__ import annotations

import pytest
import torch

import mqa_core
from mqa_core import Problem
from mqa_core.testing import calc_diff, make_inputs

pytestmark = pytest.mark.rocm


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


def _poison_allocator(m: int, n: int) -> None:
    """Leave NaN in the memory AITER's ``torch.empty`` output will most likely reuse."""
    aligned = (n + 255) // 256 * 256
    block = torch.full((m, aligned), float("nan"), dtype=torch.float32, device="cuda")
    del block


@pytest.mark.parametrize("h", [16, 32, 64])
@pytest.mark.parametrize("clean_logits", [True, False])
@pytest.mark.parametrize("m, n, window", [(1, 300, "ragged"), (257, 1000, "ragged"),
                                          (512, 4100, "causal"), (4, 20000, "ragged"),
                                          (300, 2048, "chunk")])
def test_kernel_matches_reference(flydsl, h, clean_logits, m, n, window):
    x = make_inputs(Problem(m, n, h, 128), device="cuda", window=window, k_scale_2d=(m % 2 == 1))
    _poison_allocator(m, n)
    out = flydsl.fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    torch.cuda.synchronize()
    ref = x.reference()
    out = out.cpu()
    assert out.shape == (m, n) and out.dtype == torch.float32 and out.stride(-1) == 1
    inside = torch.isfinite(ref)
    assert torch.isfinite(out[inside]).all(), "an in-window cell was not written"
    if clean_logits:
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs"
    diff = calc_diff(out[inside], ref[inside]) if inside.any() else 0.0
    assert diff < 1e-3, f"calc_diff {diff:.2e}"


def test_op_dispatches_to_flydsl_for_the_device(flydsl):
    x = make_inputs(Problem(64, 1000, 64, 128), device="cuda")
    out = mqa_core.fp8_mqa_logits(*x.args())
    ref = x.reference()
    assert torch.equal(torch.isneginf(out.cpu()), torch.isneginf(ref))
    assert calc_diff(out.cpu()[torch.isfinite(ref)], ref[torch.isfinite(ref)]) < 1e-3
