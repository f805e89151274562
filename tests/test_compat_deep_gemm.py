"""mqa_core.compat.deep_gemm: DeepGEMM's names, positional order and defaults, served through
mqa-core's choice, checked against the float64 oracles on the CPU."""

from __future__ import annotations

import inspect

import pytest
import torch

import mqa_core
from mqa_core.compat import deep_gemm
from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache
from mqa_core.spec import Problem
from mqa_core.testing import calc_diff, make_inputs, make_paged_inputs

#: DeepGEMM 54e2261, csrc/apis/attention.hpp, register_apis: every name, in order, with its default.
EMPTY = inspect.Parameter.empty
DEEP_GEMM_SIGNATURES = {
    "fp8_fp4_mqa_logits": [("q", EMPTY), ("kv", EMPTY), ("weights", EMPTY), ("cu_seq_len_k_start", EMPTY),
                           ("cu_seq_len_k_end", EMPTY), ("clean_logits", True), ("max_seqlen_k", 0),
                           ("logits_dtype", torch.float32)],
    "get_paged_mqa_logits_metadata": [("context_lens", EMPTY), ("block_kv", EMPTY), ("num_sms", EMPTY),
                                      ("indices", None)],
    "fp8_fp4_paged_mqa_logits": [("q", EMPTY), ("kv_cache", EMPTY), ("weights", EMPTY), ("context_lens", EMPTY),
                                 ("block_table", EMPTY), ("schedule_meta", EMPTY), ("max_context_len", EMPTY),
                                 ("clean_logits", False), ("logits_dtype", torch.float32), ("indices", None)],
    "fp8_mqa_logits": [("q", EMPTY), ("kv", EMPTY), ("weights", EMPTY), ("cu_seq_len_k_start", EMPTY),
                       ("cu_seq_len_k_end", EMPTY), ("clean_logits", True), ("max_seqlen_k", 0)],
    "fp8_paged_mqa_logits": [("q", EMPTY), ("kv_cache", EMPTY), ("weights", EMPTY), ("context_lens", EMPTY),
                             ("block_table", EMPTY), ("schedule_meta", EMPTY), ("max_context_len", EMPTY),
                             ("clean_logits", False), ("indices", None)],
}


@pytest.mark.parametrize("name", list(DEEP_GEMM_SIGNATURES))
def test_signatures_follow_deep_gemm(name):
    got = [(p.name, p.default) for p in inspect.signature(getattr(deep_gemm, name)).parameters.values()]
    assert got == DEEP_GEMM_SIGNATURES[name]
    assert name in deep_gemm.__all__


def test_prefill_full_layout_is_mqa_core():
    x = make_inputs(Problem(37, 83, 16, 64), window="ragged", seed=1)
    ref = x.reference()
    out = deep_gemm.fp8_mqa_logits(*x.args())  # clean_logits=True by default, as in DeepGEMM
    assert out.shape == (37, 83)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)) and calc_diff(out, ref) < 1e-6


@pytest.mark.parametrize("chunk_bytes", [None, 1000])  # 1000: one row per chunk
@pytest.mark.parametrize("window", ["ragged", "causal", "chunk"])
def test_prefill_compressed_layout(monkeypatch, chunk_bytes, window):
    if chunk_bytes:
        monkeypatch.setattr(deep_gemm, "COMPRESSED_CHUNK_BYTES", chunk_bytes)
    x = make_inputs(Problem(29, 90, 16, 64), window=window, seed=2)
    ref = x.reference()
    ks, ke = x.ks.long(), x.ke.long()
    width = int((ke.clamp(max=90) - ks).clamp(min=0).max()) + 3  # a little wider than the longest
    out = deep_gemm.fp8_mqa_logits(*x.args(), False, width)
    assert out.shape == (29, width) and out.dtype == torch.float32
    for i in range(29):
        for j in range(width):
            p = int(ks[i]) + j
            if 0 <= p < min(int(ke[i]), 90):
                assert abs(float(out[i, j]) - float(ref[i, p])) <= 1e-5 * (1 + abs(float(ref[i, p]))), (i, j)
            else:  # past the window: unspecified in DeepGEMM, -inf here
                assert float(out[i, j]) == float("-inf"), (i, j)


def test_prefill_compressed_argument_errors():
    x = make_inputs(Problem(4, 16, 16, 64), seed=3)
    with pytest.raises(ValueError, match="needs clean_logits=False, as in DeepGEMM"):
        deep_gemm.fp8_mqa_logits(*x.args(), True, 8)
    with pytest.raises(TypeError, match="max_seqlen_k must be a non-negative int"):
        deep_gemm.fp8_mqa_logits(*x.args(), False, -1)
    assert deep_gemm.fp8_mqa_logits(*make_inputs(Problem(0, 16, 16, 64)).args(), False, 8).shape == (0, 8)


def split_of(lens: torch.Tensor, block_kv: int, num_sms: int) -> list[tuple[int, int]]:
    """The even split written out: program i starts at item i * total // num_sms of the flattened
    (sequence, tile) list; the last row is (B, 0)."""
    longest = lens.tolist() if lens.dim() == 1 else lens.max(dim=1).values.tolist()
    items = [(b, t) for b, n in enumerate(longest) for t in range(-(-max(n, 0) // block_kv))]
    rows = []
    for i in range(num_sms + 1):
        w = i * len(items) // num_sms
        rows.append(items[w] if w < len(items) else (len(longest), 0))
    return rows


@pytest.mark.parametrize("lens", [
    torch.tensor([[100, 130], [0, 0], [5000, 4999], [64, 1]]),  # 2-D, last column not always the max
    torch.tensor([1, 0, 700, 64, 65]),
    torch.tensor([0, 0]),
    torch.zeros(0, dtype=torch.int64),
])
@pytest.mark.parametrize("num_sms", [1, 7, 132])
def test_metadata_shape_and_split(lens, num_sms):
    lens = lens.to(torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, num_sms)
    assert meta.shape == (num_sms + 1, 2) and meta.dtype == torch.int32 and meta.device == lens.device
    assert [tuple(r) for r in meta.tolist()] == split_of(lens, 64, num_sms)


def test_metadata_argument_errors():
    with pytest.raises(TypeError, match="context_lens must be int32"):
        deep_gemm.get_paged_mqa_logits_metadata(torch.ones(3), 64, 4)
    with pytest.raises(TypeError, match="num_sms must be a positive int"):
        deep_gemm.get_paged_mqa_logits_metadata(torch.ones(3, dtype=torch.int32), 64, 0)


@pytest.mark.parametrize("clean", [False, True])
def test_paged_drop_in(clean):
    """DeepGEMM's call sequence: metadata from 2-D lengths, then the op with schedule_meta sixth,
    on a strided page pool with arbitrary 2-D lengths."""
    inp = make_paged_inputs(4, 2, 16, 64, 200, block_size=64, seed=4)
    lens = torch.tensor([[200, 3], [0, 0], [77, 150], [1, 64]], dtype=torch.int32)
    pool = pad_paged_cache(inp.kv_cache, 256)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, 132)
    args = (inp.q, pool, inp.weights, lens, inp.block_tables, meta, 200)
    out = deep_gemm.fp8_paged_mqa_logits(*args, clean) if clean else deep_gemm.fp8_paged_mqa_logits(*args)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 200)
    inside = torch.isfinite(ref)
    assert out.shape == (8, 200) and calc_diff(out[inside], ref[inside]) < 1e-6
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside)


def test_paged_schedule_meta_is_checked():
    inp = make_paged_inputs(2, 1, 16, 64, 64, seed=5)
    with pytest.raises(TypeError, match=r"schedule_meta must be int32 \[num_sms \+ 1, 2\]"):
        deep_gemm.fp8_paged_mqa_logits(*inp.args()[:5], torch.zeros(3, 2), 64)
    with pytest.raises(TypeError, match="schedule_meta must be int32"):
        deep_gemm.fp8_paged_mqa_logits(*inp.args()[:5], 64, 64)  # the old 6th argument
    with pytest.raises(TypeError, match="schedule_meta must be int32.*got NoneType"):
        deep_gemm.fp8_paged_mqa_logits(*inp.args()[:5], None, 64)  # DeepGEMM requires one
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp.context_lens, 64, 4)
    deep_gemm.fp8_paged_mqa_logits(*inp.args()[:5], meta, 64)  # a known signature from here on
    for wrong in (meta.long(), meta[:, :1], meta[:1], meta.flatten()):
        with pytest.raises(TypeError, match="schedule_meta must be int32"):
            deep_gemm.fp8_paged_mqa_logits(*inp.args()[:5], wrong, 64)
    with pytest.raises(TypeError, match="weights must be float32"):  # not the schedule's fault
        deep_gemm.fp8_paged_mqa_logits(inp.q, inp.kv_cache, inp.weights.double(), *inp.args()[3:5], meta, 64)


def test_dispatch_follows_mqa_core_choice(monkeypatch):
    """The compat functions go through mqa_core's selection: MQA_PROVIDER applies, and a forced
    provider that cannot serve fails loudly rather than being replaced."""
    inp = make_paged_inputs(3, 2, 16, 64, 150, block_size=64, lens_2d=True, seed=6)
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp.context_lens, 64, 8)
    args = (*inp.args()[:5], meta, 150, True)
    monkeypatch.setenv("MQA_PROVIDER", "triton")
    mqa_core.reload()
    with pytest.raises(LookupError, match="triton"):  # the Triton provider needs the interpreter on CPU
        deep_gemm.fp8_paged_mqa_logits(*args)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mqa_core.reload()
    seen = []
    real = mqa_core.fp8_paged_mqa_logits
    monkeypatch.setattr(mqa_core, "fp8_paged_mqa_logits", lambda *a, **k: seen.append(k) or real(*a, **k))
    out = deep_gemm.fp8_paged_mqa_logits(*args)
    assert len(seen) == 1 and seen[0]["clean_logits"] is True and seen[0]["schedule"] is meta  # passed on
    ref = inp.reference()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)) and calc_diff(out, ref) < 1e-6


# -- DeepGEMM's current names: fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits ------------------------

def check_one_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32 logits within DeepGEMM's bar of the float64 oracle; bf16 ones the oracle rounded once:
    at most half a bf16 ulp (u = 2**-8 relative) beyond a float32 sum's error."""
    assert calc_diff(got.float(), want) < (1e-5 if got.dtype == torch.bfloat16 else 1e-6)
    if got.dtype == torch.bfloat16:
        err = (got.double() - want).abs()
        assert bool((err <= 2.0 ** -8 * want.abs() * (1 + 1e-5) + 1e-6 * want.abs().max()).all())


@pytest.mark.parametrize("q_form", ["tensor", "pair"])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clean", [True, False])
def test_fp8_fp4_mqa_logits_against_the_oracle(q_form, logits_dtype, clean):
    """q as a tensor or (q, None), float32 or bf16 logits: the float64 oracle's values (bf16: within
    one rounding, 2**-8 relative), the -inf mask exact with clean_logits."""
    x = make_inputs(Problem(37, 83, 16, 64), window="ragged", seed=11)
    ref = x.reference()
    q = x.q if q_form == "tensor" else (x.q, None)
    args = (q, (x.k, x.k_scale), x.weights, x.ks, x.ke)
    out = deep_gemm.fp8_fp4_mqa_logits(*args, clean, 0, logits_dtype)
    assert out.shape == (37, 83) and out.dtype == logits_dtype
    inside = torch.isfinite(ref)
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside)
    check_one_rounding(out[inside], ref[inside])
    legacy = deep_gemm.fp8_mqa_logits(x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke, clean)
    same = out if clean else out[inside]
    assert torch.equal(same, (legacy if clean else legacy[inside]).to(logits_dtype))


def test_fp8_fp4_mqa_logits_keyword_call_as_vllm_makes_it():
    """vLLM's indexer: fp8_fp4_mqa_logits((q, q_scale), (k, k_scale), w, ks, ke, clean_logits=False)."""
    x = make_inputs(Problem(20, 50, 32, 128), window="causal", seed=12)
    out = deep_gemm.fp8_fp4_mqa_logits((x.q, None), (x.k, x.k_scale), x.weights, x.ks, x.ke, clean_logits=False)
    ref = x.reference()
    inside = torch.isfinite(ref)
    assert out.dtype == torch.float32 and calc_diff(out[inside], ref[inside]) < 1e-6


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_fp8_fp4_mqa_logits_compressed(logits_dtype):
    x = make_inputs(Problem(29, 90, 16, 64), window="chunk", seed=13)
    full = deep_gemm.fp8_fp4_mqa_logits(x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke, False, 0, logits_dtype)
    width = 40
    out = deep_gemm.fp8_fp4_mqa_logits((x.q, None), (x.k, x.k_scale), x.weights, x.ks, x.ke, False, width,
                                       logits_dtype)
    assert out.shape == (29, width) and out.dtype == logits_dtype
    ks, ke = x.ks.long(), x.ke.long().clamp(max=90)
    for i in range(29):
        for j in range(width):
            p = int(ks[i]) + j
            want = full[i, p] if 0 <= p < int(ke[i]) else torch.tensor(float("-inf"), dtype=logits_dtype)
            assert torch.equal(out[i, j], want), (i, j)


def test_fp8_fp4_argument_rules():
    x = make_inputs(Problem(4, 16, 16, 64), seed=14)
    kv = (x.k, x.k_scale)
    with pytest.raises(TypeError, match="logits_dtype must be torch.float32 or torch.bfloat16, as in DeepGEMM"):
        deep_gemm.fp8_fp4_mqa_logits(x.q, kv, x.weights, x.ks, x.ke, True, 0, torch.float16)
    with pytest.raises(TypeError, match="q must be a tensor or \\(q, q_sf\\)"):
        deep_gemm.fp8_fp4_mqa_logits((x.q,), kv, x.weights, x.ks, x.ke)
    with pytest.raises(ValueError, match="needs clean_logits=False, as in DeepGEMM"):
        deep_gemm.fp8_fp4_mqa_logits(x.q, kv, x.weights, x.ks, x.ke, True, 8)
    # bfloat16 weights: only with bfloat16 logits (DeepGEMM's rule), then widened exactly
    w16 = x.weights.to(torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 weights need logits_dtype=torch.bfloat16"):
        deep_gemm.fp8_fp4_mqa_logits(x.q, kv, w16, x.ks, x.ke)
    out = deep_gemm.fp8_fp4_mqa_logits(x.q, kv, w16, x.ks, x.ke, logits_dtype=torch.bfloat16)
    want = mqa_core.fp8_mqa_logits(x.q, kv, w16.float(), x.ks, x.ke, logits_dtype=torch.bfloat16)
    assert torch.equal(out, want)


@pytest.mark.parametrize("q_form", ["tensor", "pair"])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_fp8_fp4_paged_against_the_oracle(q_form, logits_dtype):
    """DeepGEMM's current decode call: metadata, then schedule_meta sixth, clean_logits=False by
    default, logits_dtype after it; 2-D lengths on a strided pool."""
    inp = make_paged_inputs(4, 2, 16, 64, 200, block_size=64, seed=15)
    lens = torch.tensor([[200, 3], [0, 0], [77, 150], [1, 64]], dtype=torch.int32)
    pool = pad_paged_cache(inp.kv_cache, 256)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, 132)
    q = inp.q if q_form == "tensor" else (inp.q, None)
    out = deep_gemm.fp8_fp4_paged_mqa_logits(q, pool, inp.weights, lens, inp.block_tables, meta, 200,
                                             logits_dtype=logits_dtype)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 200)
    inside = torch.isfinite(ref)
    assert out.shape == (8, 200) and out.dtype == logits_dtype
    check_one_rounding(out[inside], ref[inside])
    clean = deep_gemm.fp8_fp4_paged_mqa_logits(q, pool, inp.weights, lens, inp.block_tables, meta, 200, True,
                                               logits_dtype)
    assert torch.equal(torch.isneginf(clean), ~inside)  # -inf exact in bf16 too
    legacy = deep_gemm.fp8_paged_mqa_logits(inp.q, pool, inp.weights, lens, inp.block_tables, meta, 200, True)
    assert torch.equal(clean, legacy.to(logits_dtype))


def test_paged_indices_follow_deep_gemm_rules():
    """indices: int32 [B] with next_n = 1 (DeepGEMM's varlen rows); the logits do not change."""
    inp = make_paged_inputs(5, 1, 16, 64, 120, block_size=64, seed=16)
    meta = deep_gemm.get_paged_mqa_logits_metadata(inp.context_lens, 64, 8)
    indices = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    assert torch.equal(deep_gemm.get_paged_mqa_logits_metadata(inp.context_lens, 64, 8, indices), meta)
    args = (*inp.args()[:5], meta, 120, True)
    plain = deep_gemm.fp8_fp4_paged_mqa_logits(*args)
    assert torch.equal(deep_gemm.fp8_fp4_paged_mqa_logits(*args, torch.float32, indices), plain)
    assert torch.equal(deep_gemm.fp8_paged_mqa_logits(*args, indices), plain)
    with pytest.raises(TypeError, match=r"indices must be None or int32 \[B\]"):
        deep_gemm.fp8_fp4_paged_mqa_logits(*args, torch.float32, indices.long())
    two = make_paged_inputs(5, 2, 16, 64, 120, block_size=64, seed=17)
    with pytest.raises(ValueError, match="indices .* need next_n = 1, as in DeepGEMM"):
        deep_gemm.fp8_fp4_paged_mqa_logits(*two.args()[:5], meta, 120, False, torch.float32, indices)
