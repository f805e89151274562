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


def test_signatures_follow_deep_gemm():
    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    empty = inspect.Parameter.empty
    assert params(deep_gemm.fp8_mqa_logits) == [
        ("q", empty), ("kv", empty), ("weights", empty), ("cu_seq_len_k_start", empty),
        ("cu_seq_len_k_end", empty), ("clean_logits", True), ("max_seqlen_k", 0)]
    assert params(deep_gemm.get_paged_mqa_logits_metadata) == [
        ("context_lens", empty), ("block_kv", empty), ("num_sms", empty)]
    assert params(deep_gemm.fp8_paged_mqa_logits) == [
        ("q", empty), ("kv_cache", empty), ("weights", empty), ("context_lens", empty),
        ("block_table", empty), ("schedule_meta", empty), ("max_context_len", empty),
        ("clean_logits", False)]


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
