"""The paged op's engine-facing inputs on the CPU: strided page pools, arbitrary 2-D lengths, block
ids out of range, empty contexts; the oracle against first principles, torch_ref and the public op
against the oracle, and the layout checks of mqa_core.validate."""

from __future__ import annotations

import pytest
import torch
from paged_definition import brute_force

import mqa_core
from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache, split_paged_cache
from mqa_core.testing import calc_diff, make_paged_inputs


def arbitrary_lens(batch: int, next_n: int, ctx: int, seed: int) -> torch.Tensor:
    """[B, next_n] int32 lengths that follow no rule: not increasing along j, the last column not
    the row maximum, zeros, and lengths past max_context_len."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, ctx + 1, (batch, next_n), generator=g)
    lens[0, -1] = 0  # the last column below the others
    if batch > 1:
        lens[1, 0] = ctx + 17  # past max_context_len: capped
    return lens.to(torch.int32)


def same(out: torch.Tensor, ref: torch.Tensor, clean: bool = True, tol: float = 1e-6) -> None:
    inside = torch.isfinite(ref)
    assert out.shape == ref.shape
    assert not out[inside].isnan().any(), "visible cells left unwritten"
    assert calc_diff(out[inside], ref[inside]) < tol
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside), "-inf mask differs"


@pytest.mark.parametrize("gap", [4, 100, 4096])
def test_strided_pool_is_read_in_place(gap):
    inp = make_paged_inputs(3, 2, 8, 64, 150, block_size=16, seed=gap)
    pool = pad_paged_cache(inp.kv_cache, gap)
    assert pool.stride(0) == 16 * 68 + gap and not pool.is_contiguous()
    values, scales = split_paged_cache(pool)
    assert values.data_ptr() == pool.data_ptr()  # views, not copies
    v0, s0 = split_paged_cache(inp.kv_cache)
    assert torch.equal(values, v0) and torch.equal(scales, s0)
    # The gaps hold garbage that a reader assuming contiguous blocks would pick up.
    flat = torch.as_strided(pool, (pool.shape[0] * 16 * 68,), (1,))
    assert not torch.equal(flat.view(pool.shape[0], -1), inp.kv_cache.reshape(pool.shape[0], -1))
    ref = inp.reference()
    got = fp8_paged_mqa_logits_ref(inp.q, pool, inp.weights, inp.context_lens, inp.block_tables, 150)
    assert torch.equal(got.isinf(), ref.isinf()) and torch.equal(got[ref.isfinite()], ref[ref.isfinite()])
    same(mqa_core.fp8_paged_mqa_logits(inp.q, pool, *inp.args()[2:]), ref)


@pytest.mark.parametrize("next_n", [1, 2, 3])
def test_arbitrary_2d_lengths(next_n):
    inp = make_paged_inputs(4, next_n, 4, 32, 70, block_size=16, seed=next_n)
    lens = arbitrary_lens(4, next_n, 70, seed=next_n)
    assert not torch.equal(lens[:, -1], lens.max(dim=1).values) or next_n == 1
    values, scales = split_paged_cache(inp.kv_cache)
    want = brute_force(inp.q, values.view(torch.float8_e4m3fn).float(), scales, inp.weights, lens,
                       inp.block_tables, 70)
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 70)
    assert torch.equal(ref.isinf(), want.isinf())
    assert torch.allclose(ref[want.isfinite()], want[want.isfinite()], rtol=1e-9, atol=1e-9)
    for clean in (True, False):
        out = mqa_core.fp8_paged_mqa_logits(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 70,
                                            clean_logits=clean)
        same(out, ref, clean)


def test_block_ids_out_of_range_are_neg_inf_and_never_read():
    inp = make_paged_inputs(3, 2, 8, 64, 130, block_size=16, seed=3)
    inp.context_lens[:] = 130
    tables = inp.block_tables.clone()
    blocks = inp.kv_cache.shape[0]
    tables[0, 1] = -1  # negative: used to wrap around to the last block
    tables[1, 3] = blocks  # one past the end: used to raise a raw IndexError
    tables[2, 0] = 2**31 - 1
    values, scales = split_paged_cache(inp.kv_cache)
    want = brute_force(inp.q, values.view(torch.float8_e4m3fn).float(), scales, inp.weights,
                       inp.context_lens, tables, 130)
    assert torch.isneginf(want[0:2, 16:32]).all() and torch.isneginf(want[2:4, 48:64]).all()
    ref = fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, inp.context_lens, tables, 130)
    assert torch.equal(ref.isinf(), want.isinf())
    out = mqa_core.fp8_paged_mqa_logits(inp.q, inp.kv_cache, inp.weights, inp.context_lens, tables, 130)
    same(out, want)


def test_empty_contexts_and_sizes():
    inp = make_paged_inputs(3, 2, 8, 64, 90, block_size=16, seed=4)
    lens = torch.zeros(3, dtype=torch.int32)
    out = mqa_core.fp8_paged_mqa_logits(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 90)
    assert out.shape == (6, 90) and torch.isneginf(out).all()
    lens1 = torch.tensor([1, 0, 90], dtype=torch.int32)  # shorter than next_n: row 0 sees nothing
    out = mqa_core.fp8_paged_mqa_logits(inp.q, inp.kv_cache, inp.weights, lens1, inp.block_tables, 90)
    same(out, fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens1, inp.block_tables, 90))
    assert torch.isneginf(out[0]).all() and torch.isfinite(out[1, :1]).all()
    out = mqa_core.fp8_paged_mqa_logits(*inp.args()[:5], 0)
    assert out.shape == (6, 0)
    no_blocks = inp.kv_cache[:0]
    out = mqa_core.fp8_paged_mqa_logits(inp.q, no_blocks, *inp.args()[2:])
    assert torch.isneginf(out).all()


def _cache_with(cache: torch.Tensor, size, stride, offset: int = 0) -> torch.Tensor:
    return torch.as_strided(cache, size, stride, offset)


def test_layouts_the_cache_cannot_hold_are_rejected_naming_kv_cache():
    inp = make_paged_inputs(2, 1, 4, 64, 64, block_size=16, seed=5)
    args = list(inp.args())
    raw = torch.zeros(4 * 2176 + 64, dtype=torch.uint8)
    nb = 3
    cases = {
        "stride\\(0\\) >= block_size \\* \\(D \\+ 4\\) = 1088": ((nb, 16, 1, 68), (1000, 68, 68, 1)),
        "stride\\(0\\) a multiple of 4": ((nb, 16, 1, 68), (1090, 68, 68, 1)),
        "stride\\(1\\) == D \\+ 4 = 68": ((nb, 16, 1, 68), (1088 * 2, 136, 68, 1)),
    }
    for msg, (size, stride) in cases.items():
        bad = _cache_with(raw, size, stride)
        with pytest.raises(ValueError, match=f"kv_cache does not hold DeepGEMM's paged layout.*{msg}"):
            mqa_core.fp8_paged_mqa_logits(args[0], bad, *args[2:])
    bad = _cache_with(raw, (nb, 16, 1, 68), (1088, 68, 68, 1), offset=2)  # scales not 4-byte aligned
    with pytest.raises(ValueError, match="kv_cache does not hold .*a 4-byte aligned start"):
        mqa_core.fp8_paged_mqa_logits(args[0], bad, *args[2:])
    transposed = torch.zeros(nb, 68, 1, 16, dtype=torch.uint8).permute(0, 3, 2, 1)
    with pytest.raises(ValueError, match="kv_cache does not hold .*stride\\(3\\) == 1"):
        mqa_core.fp8_paged_mqa_logits(args[0], transposed, *args[2:])


def test_scales_must_be_aligned_block_size_times_d():
    """D = 6 with block_size 1: the scales would start 6 bytes into the block (issue 9 item 8)."""
    q = (torch.randn(1, 1, 4, 6) * 2).to(torch.float8_e4m3fn)
    cache = torch.zeros(5, 1, 1, 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"kv_cache does not hold .*block_size \* D = 6 a multiple of 4"):
        mqa_core.fp8_paged_mqa_logits(q, cache, torch.randn(1, 4), torch.tensor([1], dtype=torch.int32),
                                      torch.zeros(1, 1, dtype=torch.int32), 1)


def test_unaligned_d_that_the_layout_holds_is_served():
    """D = 6, block_size 2: 12 value bytes then two scales, 4-byte aligned; torch_ref serves it."""
    g = torch.Generator().manual_seed(6)
    values = (torch.randn(4, 2, 6, generator=g) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(4, 2, generator=g) + 0.1
    cache = torch.cat([values.view(torch.uint8).reshape(4, -1), scales.view(torch.uint8).reshape(4, -1)], 1)
    cache = cache.reshape(4, 2, 1, 10)
    q = (torch.randn(2, 1, 3, 6, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(2, 3, generator=g)
    lens = torch.tensor([3, 4], dtype=torch.int32)
    tables = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    want = brute_force(q, values.float(), scales, w, lens, tables, 4)
    same(mqa_core.fp8_paged_mqa_logits(q, cache, w, lens, tables, 4), want)


def test_torch_ref_strided_pool_memory_bound(monkeypatch):
    """Many column chunks over a strided pool with 2-D lengths."""
    from mqa_provider_torch_ref.kernels import KERNELS

    monkeypatch.setenv("MQA_TORCH_REF_MEMORY_MB", "0.01")
    inp = make_paged_inputs(2, 2, 16, 64, 200, block_size=64, seed=8)
    lens = arbitrary_lens(2, 2, 200, seed=8)
    pool = pad_paged_cache(inp.kv_cache, 36)
    out = KERNELS.fp8_paged_mqa_logits(inp.q, pool, inp.weights, lens, inp.block_tables, 200)
    same(out, fp8_paged_mqa_logits_ref(inp.q, inp.kv_cache, inp.weights, lens, inp.block_tables, 200))
