"""The real DeepGEMM against the float64 reference on an sm_90/sm_100 GPU (``pytest -m cuda``).

Skips, naming what is missing, without a CUDA GPU of those archs or without ``deep_gemm``. With both,
deepgemm must be usable (``MQA_PROVIDER=deepgemm``); if it is not, the test fails with the decision
table, since that is what someone running these tests wants to know. Each case goes through the
conformance kit's case runner: the output's storage is poisoned, so cells DeepGEMM leaves unwritten
show as NaN; the -inf mask is checked exactly and every in-window cell within the per-cell bound of
the fp8 matrix units' accumulation.
"""

from __future__ import annotations

import importlib.util
import zlib

import pytest
import torch
from deepgemm_inputs import paged

import mqa_core
from mqa_core import Problem
from mqa_core.testing.providers import provider_named
from mqa_core.testing.runner import Draw, run_paged, run_prefill

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def arch() -> str:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        pytest.skip(f"needs an NVIDIA GPU (torch {torch.__version__}, CUDA {torch.version.cuda})")
    arch = mqa_core.detect_arch()
    if arch not in ("sm_90", "sm_100"):
        pytest.skip(f"DeepGEMM's MQA-logits kernels need sm_90/sm_100; this GPU is {arch}")
    if importlib.util.find_spec("deep_gemm") is None:
        pytest.skip("deep_gemm is not importable (build DeepGEMM and put it on PYTHONPATH)")
    return arch


@pytest.fixture(scope="module")
def deepgemm(arch: str) -> mqa_core.Provider:
    try:
        return provider_named("deepgemm", arch)
    except mqa_core.ProviderUnavailableError as exc:
        pytest.fail(f"deepgemm is not usable on this {arch} GPU:\n{exc}", pytrace=False)


@pytest.fixture(scope="module")
def deepgemm_paged(arch: str) -> mqa_core.Provider:
    return provider_named("deepgemm", arch, op="fp8_paged_mqa_logits")


def _draw(seed: int) -> Draw:
    """On the GPU, with the fp8 matrix units' error model (DeepGEMM sums fp8 products with Hopper's MMA)."""
    return Draw.on(torch.device("cuda"), seed)


@pytest.mark.parametrize("window", ["causal", "full", "chunk", "ragged", "edges", "empty"])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("h, d", [(32, 128), (64, 128), (64, 64), (32, 32)])
def test_prefill(deepgemm, window, clean, h, d):
    seed = zlib.crc32(f"{window}{clean}{h}{d}".encode())
    run_prefill(deepgemm, _draw(seed), Problem(271, 1331, h, d), window=window, clean=clean, k_scale_2d=(h == 64))


@pytest.mark.parametrize("m, n", [(1, 1), (1, 4099), (300, 17), (128, 1024), (257, 2049), (2048, 8192)])
def test_prefill_sizes(deepgemm, m, n):
    run_prefill(deepgemm, _draw(m + n), Problem(m, n, 64, 128), window="ragged", clean=True, what="sizes")


@pytest.mark.parametrize("batch, next_n, lens_2d, clean", [
    (1, 1, False, True), (4, 1, False, True), (2, 2, False, True), (3, 2, True, True), (4, 2, True, False),
    (3, 3, False, True), (2, 4, True, True)])
@pytest.mark.parametrize("h, d", [(32, 128), (64, 128), (64, 64)])
@pytest.mark.parametrize("pool_pad", [0, 512])
def test_paged(deepgemm_paged, batch, next_n, lens_2d, clean, h, d, pool_pad):
    seed = batch * 100 + next_n * 10 + h + d + pool_pad
    x = paged(batch, next_n, h, d, 2100, seed=seed, lens_2d=lens_2d, pool_pad=pool_pad, device="cuda")
    run_paged(deepgemm_paged, _draw(seed), x, clean=clean, what=f"batch={batch} next_n={next_n} pool_pad={pool_pad}")
