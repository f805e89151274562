"""FP4 through the deepgemm provider: declared on sm_100 (where DeepGEMM 54e2261 serves it), routed there
by selection, passed to DeepGEMM's fp8_fp4 entries as (values, scales); refused on sm_90. The stand-in
DeepGEMM (tests/deepgemm/standin_deep_gemm.py) checks the real asserts and computes with the oracle."""

from __future__ import annotations

import pytest
import torch

import mqa_core
from mqa_core import fp4
from mqa_core.reference import fp4_mqa_logits_ref, fp4_paged_mqa_logits_ref
from mqa_core.spec import FP4, FP4_PAIR
from mqa_core.testing.providers import provider_named


def _calls() -> list:
    from deep_gemm import CALLS

    return CALLS


@pytest.fixture(autouse=True)
def _sm100(monkeypatch):
    """The stand-in DeepGEMM pretends to run on sm_100 (its asserts follow the arch)."""
    monkeypatch.setenv("MQA_TEST_DEEPGEMM_ARCH", "sm_100")


def _as(arch: str):
    provider = provider_named("deepgemm", arch, dtype=FP4) if arch == "sm_100" else provider_named("deepgemm", arch)
    return type(provider.impl)(arch_of_device=lambda device: arch)


def test_declared_on_sm100_only():
    from mqa_provider_deepgemm import SPEC

    assert FP4_PAIR in SPEC.pairs_for("sm_100") and FP4_PAIR not in SPEC.pairs_for("sm_90")
    assert SPEC.dtypes == {"float8_e4m3fn"}


@pytest.mark.parametrize("op", ["fp8_mqa_logits", "fp8_paged_mqa_logits"])
def test_selection_routes_fp4_to_deepgemm_on_sm100_and_refuses_it_on_sm90(deep_gemm, op):
    deep_gemm("fp8_fp4")
    d = mqa_core.explain("sm_100", op=op, dtype=FP4)
    assert d.chosen == "deepgemm", str(d)
    assert d.candidate("gluon").code == "dtype"
    d90 = mqa_core.explain("sm_90", op=op, dtype=FP4)
    assert d90.chosen is None and d90.candidate("deepgemm").code == "dtype", str(d90)
    assert "asked for (float4_e2m1fn_x2, float4_e2m1fn_x2)" in d90.candidate("deepgemm").reason


@pytest.mark.parametrize("clean", [True, False])
def test_prefill_goes_to_fp8_fp4_with_q_sf(deep_gemm, clean):
    deep_gemm("fp8_fp4")
    g = torch.Generator().manual_seed(3)
    m, n, h, d = 30, 300, 16, 128
    q = fp4.quantize(torch.randn(m, h, d, generator=g))
    k = fp4.quantize(torch.randn(n, d, generator=g))
    w = torch.randn(m, h, generator=g)
    ks = torch.randint(-2, n // 2, (m,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(0, n, (m,), generator=g, dtype=torch.int32)
    out = _as("sm_100").fp8_mqa_logits(q, k, w, ks, ke, clean_logits=clean)
    call = _calls()[-1]
    assert call["fp4"] and call["q_sf"] is not None and call["k_scale"].dtype == torch.int32
    ref = fp4_mqa_logits_ref(*q, *k, w, ks, ke)
    inside = torch.isfinite(ref)
    assert torch.allclose(out[inside].double(), ref[inside], rtol=1e-5, atol=1e-5)
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside)


def test_paged_goes_to_fp8_fp4_with_q_sf(deep_gemm):
    deep_gemm("fp8_fp4")
    g = torch.Generator().manual_seed(4)
    b, next_n, h, d, bs, ctx = 3, 3, 8, 64, 64, 200
    blocks = b * 4
    cache = fp4.paged_cache(*fp4.quantize(torch.randn(blocks, bs, d, generator=g)))
    table = torch.randperm(blocks, generator=g).view(b, 4).to(torch.int32)
    q = fp4.quantize(torch.randn(b, next_n, h, d, generator=g))
    w = torch.randn(b * next_n, h, generator=g)
    lens = torch.tensor([200, 3, 130], dtype=torch.int32)
    out = _as("sm_100").fp8_paged_mqa_logits(q, cache, w, lens, table, ctx, clean_logits=True)
    call = _calls()[-1]
    assert call["op"] == "paged" and call["fp4"] and call["context_lens"].shape == (b, next_n)
    ref = fp4_paged_mqa_logits_ref(*q, cache, w, lens, table, ctx)
    inside = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(out), ~inside)
    assert torch.allclose(out[inside].double(), ref[inside], rtol=1e-5, atol=1e-5)


def test_legacy_deepgemm_says_it_has_no_fp4(deep_gemm):
    deep_gemm("legacy")
    q = fp4.quantize(torch.randn(4, 16, 64))
    k = fp4.quantize(torch.randn(8, 64))
    with pytest.raises(RuntimeError, match="FP4 inputs need DeepGEMM's fp8_fp4 entries on sm_100"):
        _as("sm_100").fp8_mqa_logits(q, k, torch.randn(4, 16), torch.zeros(4, dtype=torch.int32),
                                     torch.full((4,), 8, dtype=torch.int32))
