"""The adapter's conversions, checked numerically against the float64 reference on the CPU.

The provider chosen through the real entry point (``MQA_PROVIDER=deepgemm``) calls a stand-in DeepGEMM
with the real entries' signatures, checks and memory behaviour (unsigned windows, padded rows, block
ranges computed past windows, paged work sized by the last length column, no paged clean). The only
substitution is the device-to-arch function, so CPU tensors can play sm_90/sm_100 tensors; the real
device check is tested separately and rejects them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from deepgemm_inputs import paged as _paged
from deepgemm_inputs import prefill as _prefill_inputs
from mqa_provider_deepgemm import clean
from mqa_provider_deepgemm.kernel import KERNEL, DeepGEMMKernel

from mqa_core import Problem
from mqa_core.testing import make_inputs, make_paged_inputs
from mqa_core.testing.checks import Case
from mqa_core.testing.providers import provider_named
from mqa_core.testing.runner import check_paged, check_prefill


def _deepgemm_as(arch: str) -> DeepGEMMKernel:
    provider = provider_named("deepgemm", arch)
    assert provider.spec.distribution == "mqa-provider-deepgemm"
    return type(provider.impl)(arch_of_device=lambda device: arch)


def _calls() -> list:
    from deep_gemm import CALLS  # the stand-in's record of each call

    return CALLS


def _case(op, what, problem, seed=0):
    return Case("deepgemm", op, what, problem, seed, seed)


# -- prefill -------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", ["fp8_fp4", "legacy"])
@pytest.mark.parametrize("window", ["causal", "full", "chunk", "ragged", "edges", "empty"])
@pytest.mark.parametrize("clean_logits", [True, False])
def test_prefill_windows_match_the_reference(deep_gemm, generation, window, clean_logits):
    deep_gemm(generation)
    m, n, h, d = 37, 515, 32, 64
    x = _prefill_inputs(m, n, h, d, window, seed=11)
    out = _deepgemm_as("sm_90").fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    check_prefill(out, x, _case("fp8_mqa_logits", window, Problem(m, n, h, d)), clean=clean_logits)
    call = _calls()[-1]
    assert call["generation"] == generation and call["clean_logits"] is clean_logits
    # The windows DeepGEMM saw: int32, contiguous, 0 <= ks <= ke <= N, same visible keys.
    ks, ke = call["ks"], call["ke"]
    assert ks.dtype == ke.dtype == torch.int32
    assert bool((ks >= 0).all() and (ks <= ke).all() and (ke <= n).all())
    want_ks, want_ke = x.ks.long().clamp(0, n), x.ke.long().clamp(0, n)
    nonempty = want_ke > want_ks
    assert torch.equal(ks.long()[nonempty], want_ks[nonempty]) and torch.equal(ke.long()[nonempty], want_ke[nonempty])
    assert bool((ks == ke)[~nonempty].all())


@pytest.mark.parametrize("h, d", [(32, 32), (32, 128), (64, 64), (64, 128)])
@pytest.mark.parametrize("m, n, k_scale_2d", [(1, 1, False), (1, 300, True), (64, 256, False), (129, 1027, True)])
def test_prefill_sizes_heads_dims_and_k_scale_layouts(deep_gemm, h, d, m, n, k_scale_2d):
    deep_gemm("fp8_fp4")
    x = _prefill_inputs(m, n, h, d, "ragged", seed=1000 * h + m, k_scale_2d=k_scale_2d)
    out = _deepgemm_as("sm_90").fp8_mqa_logits(*x.args())
    check_prefill(out, x, _case("fp8_mqa_logits", "sizes", Problem(m, n, h, d)), clean=True)
    call = _calls()[-1]
    assert call["k_scale"].shape == (n,) and call["k_scale"].data_ptr() == x.k_scale.data_ptr()  # a view
    assert call["q"] is x.q and call["k"] is x.k and call["weights"] is x.weights  # nothing copied
    assert out.stride(-1) == 1 and out.stride(0) == -(-(n + 256) // 256) * 256  # DeepGEMM's padded rows


def test_strided_and_misaligned_inputs_are_copied_only_where_deepgemm_would_misread(deep_gemm):
    deep_gemm("fp8_fp4")
    m, n, h, d = 20, 333, 64, 128
    x = _prefill_inputs(m, n, h, d, "causal", seed=3)
    wide = torch.zeros(m, h + 8)
    wide[:, :h] = x.weights
    weights = wide[:, :h]  # stride(1) == 1 passes DeepGEMM's assert, but its TMA reads rows of H
    buf = torch.zeros(n + 1)
    buf[1:] = x.k_scale
    k_scale = buf[1:]  # 4 bytes past an aligned base: not a TMA address
    q = x.q.transpose(0, 1).contiguous().transpose(0, 1)
    args = (q, (x.k, k_scale), weights, x.ks, x.ke)

    from deep_gemm import fp8_mqa_logits as raw

    wrong = raw(x.q, (x.k, x.k_scale), weights, x.ks, x.ke, True)  # what DeepGEMM does with these weights
    ref = x.reference()
    assert not torch.allclose(wrong.double()[torch.isfinite(ref)], ref[torch.isfinite(ref)], rtol=1e-2)

    out = _deepgemm_as("sm_90").fp8_mqa_logits(*args)
    check_prefill(out, x, _case("fp8_mqa_logits", "strided", Problem(m, n, h, d)), clean=True)
    call = _calls()[-1]
    assert call["weights"].is_contiguous() and call["q"].is_contiguous()
    assert call["k_scale"].data_ptr() % 16 == 0


def test_raw_deepgemm_faults_on_the_windows_the_adapter_clamps(deep_gemm):
    deep_gemm("fp8_fp4")
    m, n = 8, 100
    x = _prefill_inputs(m, n, 32, 64, "full", seed=5)
    ks = torch.full((m,), -7, dtype=torch.int32)
    ke = torch.full((m,), 5, dtype=torch.int32)
    from deep_gemm import fp8_mqa_logits as raw

    with pytest.raises(RuntimeError, match="illegal memory access"):
        raw(x.q, (x.k, x.k_scale), x.weights, ks, ke, True)
    x = replace(x, ks=ks, ke=ke)
    out = _deepgemm_as("sm_90").fp8_mqa_logits(*x.args())
    check_prefill(out, x, _case("fp8_mqa_logits", "ks<0", Problem(m, n, 32, 64)), clean=True)


@pytest.mark.parametrize("m, n", [(0, 64), (5, 0), (0, 0)])
@pytest.mark.parametrize("clean_logits", [True, False])
def test_empty_problems_launch_nothing(deep_gemm, m, n, clean_logits):
    deep_gemm("fp8_fp4")
    x = make_inputs(Problem(m, n, 32, 128), seed=0)
    out = _deepgemm_as("sm_90").fp8_mqa_logits(*x.args(), clean_logits=clean_logits)
    assert out.shape == (m, n) and out.dtype == torch.float32
    if clean_logits:
        assert bool(torch.isneginf(out).all())
    assert _calls() == []


# -- paged ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("generation", ["fp8_fp4", "legacy"])
@pytest.mark.parametrize("batch, next_n, lens_2d, clean_logits", [
    (1, 1, False, True), (4, 1, False, True), (3, 2, False, True), (3, 2, True, True), (4, 2, True, False),
    (2, 3, False, True), (2, 4, True, True), (3, 1, False, False)])
def test_paged_matches_the_reference(deep_gemm, generation, batch, next_n, lens_2d, clean_logits):
    deep_gemm(generation)
    h, d, ctx = 32, 64, 333
    x = _paged(batch, next_n, h, d, ctx, seed=batch * 10 + next_n, lens_2d=lens_2d)
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args(), clean_logits=clean_logits)
    what = f"B={batch} next_n={next_n} lens={x.context_lens.tolist()}"
    check_paged(out, x, _case("fp8_paged_mqa_logits", what, Problem(batch * next_n, ctx, h, d)),
                 clean=clean_logits)
    calls = _calls()
    assert len(calls) == -(-next_n // 2)  # next_n > 2 runs in groups of 2
    for call in calls:
        assert call["context_lens"].dim() == 2 and call["clean_logits"] is False
        assert call["kv_cache"] is x.kv_cache  # the cache itself, never a copy
    if next_n <= 2:  # 1-D lengths go in as lens[b] - next_n + j + 1, clamped; 2-D with the last the longest
        want = x.context_lens if lens_2d else (x.context_lens[:, None] - next_n + torch.arange(1, next_n + 1))
        want = want.clamp(0, ctx).to(torch.int32)
        want[:, -1] = want.amax(dim=1)
        assert torch.equal(calls[0]["context_lens"], want)


@pytest.mark.parametrize("lens", [
    [[290, 5, 130, 299], [64, 200, 1, 250]],  # next_n 4, in groups of 2: no group's last is its longest
    [[290, 5], [64, 200], [1, 0]],  # next_n 2: a longer first row (H200, 2026-12-02: left unwritten)
], ids=["next_n4", "next_n2"])
@pytest.mark.parametrize("clean_logits", [True, False])
def test_paged_arbitrary_2d_lengths(deep_gemm, lens, clean_logits):
    # DeepGEMM sizes a sequence's work by the last column: arbitrary 2-D lengths must still be served.
    deep_gemm("fp8_fp4")
    lens = torch.tensor(lens, dtype=torch.int32)
    b, next_n = lens.shape
    x = replace(_paged(b, next_n, 32, 64, 300, seed=12), context_lens=lens)
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args(), clean_logits=clean_logits)
    check_paged(out, x, _case("fp8_paged_mqa_logits", "2-D", Problem(b * next_n, 300, 32, 64)),
                clean=clean_logits)


@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_paged_transposed_2d_lengths_reach_deepgemm_contiguous(deep_gemm, next_n):
    # DeepGEMM asserts context_lens.is_contiguous() (attention.hpp:206); a clone keeps a transposed
    # tensor's strides, so the kit's transposed layout failed on the H200 (2026-12-02) until the adapter
    # made the lengths contiguous.
    deep_gemm("fp8_fp4")
    b = 3
    lens = (torch.arange(b * next_n, dtype=torch.int32).view(next_n, b) * 37 % 290 + 5).t()
    assert not lens.is_contiguous() or next_n == 1
    x = replace(_paged(b, next_n, 32, 64, 300, seed=13), context_lens=lens)
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args(), clean_logits=True)
    assert all(c["context_lens"].is_contiguous() for c in _calls())
    check_paged(out, x, _case("fp8_paged_mqa_logits", "transposed", Problem(b * next_n, 300, 32, 64)), clean=True)


@pytest.mark.parametrize("generation", ["fp8_fp4", "legacy"])
def test_paged_strided_page_pool_passes_through(deep_gemm, generation):
    deep_gemm(generation)
    x = _paged(3, 2, 64, 128, 260, seed=4, pool_pad=64)
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args())
    check_paged(out, x, _case("fp8_paged_mqa_logits", "pool", Problem(6, 260, 64, 128)), clean=True)
    call = _calls()[-1]
    assert call["kv_cache"].data_ptr() == x.kv_cache.data_ptr() and call["kv_cache"].stride(0) == x.kv_cache.stride(0)


def test_paged_unaligned_pool_stride_is_copied_not_misread(deep_gemm):
    deep_gemm("fp8_fp4")
    x = _paged(2, 1, 32, 64, 200, seed=6, pool_pad=4)  # stride(0) % 16 != 0: TMA cannot address it
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args())
    check_paged(out, x, _case("fp8_paged_mqa_logits", "pool+4", Problem(2, 200, 32, 64)), clean=True)
    assert _calls()[-1]["kv_cache"].is_contiguous()


def test_paged_lengths_past_the_table_or_max_context_are_clamped(deep_gemm):
    deep_gemm("fp8_fp4")
    x = _paged(2, 2, 32, 64, 192, seed=8)
    lens = torch.tensor([1000, 130], dtype=torch.int32)  # 1000 > what the 3-block table covers
    x = replace(x, context_lens=lens)
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args())
    check_paged(out, x, _case("fp8_paged_mqa_logits", "long", Problem(4, 192, 32, 64)), clean=True)


def test_paged_block_size_is_refused_where_deepgemm_does_not_take_it(deep_gemm, monkeypatch):
    deep_gemm("fp8_fp4")
    x = _paged(2, 1, 32, 64, 100, seed=9, block_size=32)
    with pytest.raises(ValueError, match=r"deepgemm \(fp8_fp4 DeepGEMM 2.6.1\+54e2261\) takes kv_cache blocks "
                                         r"of 64 tokens on sm_90; got block_size=32"):
        _deepgemm_as("sm_90").fp8_paged_mqa_logits(*x.args())
    monkeypatch.setenv("MQA_TEST_DEEPGEMM_ARCH", "sm_100")
    out = _deepgemm_as("sm_100").fp8_paged_mqa_logits(*x.args())
    check_paged(out, x, _case("fp8_paged_mqa_logits", "bs32", Problem(2, 100, 32, 64)), clean=True)


@pytest.mark.parametrize("batch, max_len", [(0, 128), (2, 0)])
def test_paged_empty_problems_launch_nothing(deep_gemm, batch, max_len):
    deep_gemm("fp8_fp4")
    x = make_paged_inputs(max(batch, 1), 2, 32, 64, 64, seed=1)
    q = x.q[:batch]
    out = _deepgemm_as("sm_90").fp8_paged_mqa_logits(q, x.kv_cache, x.weights[: batch * 2], x.context_lens[:batch],
                                                     x.block_tables[:batch], max_len)
    assert out.shape == (batch * 2, max_len) and _calls() == []


def test_real_device_check_rejects_cpu_tensors(deep_gemm):
    deep_gemm("fp8_fp4")
    x = make_inputs(Problem(4, 64, 32, 128), seed=0)
    with pytest.raises(RuntimeError, match=r"run on sm_90 and sm_100 GPUs; the tensors are on cpu \(cpu\)"):
        KERNEL.fp8_mqa_logits(*x.args())
    with pytest.raises(ValueError, match="serves sm_100, sm_90; the tensors are on cpu"):
        provider_named("deepgemm", "sm_90").fp8_mqa_logits(*x.args())


def test_adapter_refuses_when_deepgemm_cannot_serve(deep_gemm):
    deep_gemm("gemm_only")
    x = make_inputs(Problem(4, 64, 32, 128), seed=0)
    with pytest.raises(RuntimeError, match="deepgemm cannot run on sm_90: DeepGEMM 2.6.1.* exports neither"):
        DeepGEMMKernel(arch_of_device=lambda device: "sm_90").fp8_mqa_logits(*x.args())


# -- the tail clean ------------------------------------------------------------------------------

@pytest.mark.parametrize("triton_interpret", [False, True])
def test_fill_tail_writes_only_past_each_length(monkeypatch, triton_interpret):
    if triton_interpret:
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows, width, stride = 5, 2500, 2560
    base = torch.full((rows, stride), float("nan"))
    logits = base[:, :width]
    lens = torch.tensor([0, 1, 1024, 2000, 2500], dtype=torch.int32)
    clean.fill_tail(logits, lens)
    cols = torch.arange(width)
    tail = cols[None, :] >= lens[:, None]
    assert bool(torch.isneginf(logits[tail]).all())
    assert bool(torch.isnan(logits[~tail]).all())  # nothing before a length was touched
    assert bool(torch.isnan(base[:, width:]).all())  # nor the row padding


def test_fill_tail_compiles_for_sm_90_and_reads_only_the_lengths():
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = clean._triton_kernel(interpret=False).kernel
    src = ASTSource(fn=fn, constexprs={"BLOCK_COLS": clean.BLOCK},
                    signature={"logits_ptr": "*fp32", "lens_ptr": "*i32", "stride_row": "i32", "width": "i32",
                               "BLOCK_COLS": "constexpr"})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    loads = [ln for ln in ptx.splitlines() if "ld.global" in ln]
    stores = [ln for ln in ptx.splitlines() if "st.global" in ln]
    assert len(loads) == 1 and ".b32" in loads[0]  # the row's length; logits are never read
    assert stores and all(ln.strip().startswith("@%p") for ln in stores)  # predicated: only the tail
