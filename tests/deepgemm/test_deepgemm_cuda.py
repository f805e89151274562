"""The real DeepGEMM against the float64 reference on an sm_90/sm_100 GPU (``pytest -m cuda``).

Skips, naming what is missing, without a CUDA GPU of those archs or without ``deep_gemm``. With both,
deepgemm must be usable (``MQA_PROVIDER=deepgemm``); if it is not, the test fails with the decision
table, since that is what someone running these tests wants to know. Every call follows a poisoned
allocator, so cells DeepGEMM leaves unwritten show as NaN.
"""

from __future__ import annotations

import importlib.util
import zlib
from dataclasses import replace

import pytest
import torch

import mqa_core
from mqa_core import Problem
from mqa_core.testing import make_inputs, make_paged_inputs
from mqa_core.testing.cases import make_windows, short_context_lens
from mqa_core.testing.checks import Case, check_logits, poisoned_call
from mqa_core.testing.providers import provider_named

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


@pytest.mark.parametrize("window", ["causal", "full", "chunk", "ragged", "edges", "empty"])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("h, d", [(32, 128), (64, 128), (64, 64), (32, 32)])
def test_prefill(deepgemm, window, clean, h, d):
    m, n = 271, 1331
    seed = zlib.crc32(f"{window}{clean}{h}{d}".encode())
    x = make_inputs(Problem(m, n, h, d), device="cuda", window="full", seed=seed, k_scale_2d=(h == 64))
    ks, ke = make_windows(window, m, n, seed)
    x = replace(x, ks=ks.cuda(), ke=ke.cuda())
    out = poisoned_call(lambda: deepgemm.fp8_mqa_logits(*x.args(), clean_logits=clean), x.q.device, m, n)
    check_logits(out, x.reference(), Case("deepgemm", "fp8_mqa_logits", window, Problem(m, n, h, d), seed, seed),
                 clean=clean, windows=(ks, ke))


@pytest.mark.parametrize("m, n", [(1, 1), (1, 4099), (300, 17), (128, 1024), (257, 2049), (2048, 8192)])
def test_prefill_sizes(deepgemm, m, n):
    x = make_inputs(Problem(m, n, 64, 128), device="cuda", window="ragged", seed=m + n)
    out = poisoned_call(lambda: deepgemm.fp8_mqa_logits(*x.args()), x.q.device, m, n)
    check_logits(out, x.reference(), Case("deepgemm", "fp8_mqa_logits", "sizes", Problem(m, n, 64, 128), 0, 0),
                 clean=True)


@pytest.mark.parametrize("batch, next_n, lens_2d, clean", [
    (1, 1, False, True), (4, 1, False, True), (2, 2, False, True), (3, 2, True, True), (4, 2, True, False),
    (3, 3, False, True), (2, 4, True, True)])
@pytest.mark.parametrize("h, d", [(32, 128), (64, 128), (64, 64)])
@pytest.mark.parametrize("pool_pad", [0, 512])
def test_paged(deepgemm_paged, batch, next_n, lens_2d, clean, h, d, pool_pad):
    ctx = 2100
    seed = batch * 100 + next_n * 10 + h + d + pool_pad
    x = make_paged_inputs(batch, next_n, h, d, ctx, seed=seed)
    lens = short_context_lens(x.context_lens, next_n, ctx)
    if lens_2d:
        lens = lens[:, None] - next_n + torch.arange(1, next_n + 1, dtype=lens.dtype)[None, :]
    cache = x.kv_cache
    if pool_pad:  # a strided page pool
        blocks, bs, _, d4 = cache.shape
        pool = torch.zeros((blocks, bs * d4 + pool_pad), dtype=torch.uint8)
        pool[:, : bs * d4] = cache.reshape(blocks, -1)
        cache = pool[:, : bs * d4].view(blocks, bs, 1, d4)
    x = replace(x, q=x.q.cuda(), kv_cache=cache.cuda(), weights=x.weights.cuda(), context_lens=lens.cuda(),
                block_tables=x.block_tables.cuda())
    out = poisoned_call(lambda: deepgemm_paged.fp8_paged_mqa_logits(*x.args(), clean_logits=clean),
                        x.q.device, batch * next_n, ctx)
    what = f"B={batch} next_n={next_n} lens={lens.tolist()} pool_pad={pool_pad}"
    check_logits(out, x.reference(), Case("deepgemm", "fp8_paged_mqa_logits", what,
                                          Problem(batch * next_n, ctx, h, d), seed, seed), clean=clean)
