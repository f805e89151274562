"""The paged op's oracle and layout helpers against first principles, and torch_ref against the oracle."""

from __future__ import annotations

import pytest
import torch
from paged_definition import brute_force

from mqa_core.reference import fp8_paged_mqa_logits_ref, split_paged_cache, visible_lengths
from mqa_core.testing import calc_diff, make_paged_inputs


def build_cache(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's layout written out by hand: per block, block_size*D fp8 bytes then block_size fp32."""
    blocks, block_size, d = values.shape
    raw = torch.cat([values.view(torch.uint8).reshape(blocks, -1),
                     scales.float().contiguous().view(torch.uint8).reshape(blocks, -1)], dim=1)
    return raw.reshape(blocks, block_size, 1, d + 4)


def test_split_paged_cache_inverts_the_layout():
    g = torch.Generator().manual_seed(0)
    values = (torch.randn(5, 16, 32, generator=g) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(5, 16, generator=g) + 0.1
    v, s = split_paged_cache(build_cache(values, scales))
    assert torch.equal(v.view(torch.float8_e4m3fn).view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(s, scales)


def test_visible_lengths():
    lens = torch.tensor([5, 1, 0], dtype=torch.int32)
    assert visible_lengths(lens, 2).tolist() == [4, 5, 0, 1, -1, 0]
    lens2 = torch.tensor([[3, 7], [0, 2]], dtype=torch.int32)
    assert visible_lengths(lens2, 2).tolist() == [3, 7, 0, 2]


@pytest.mark.parametrize("lens_2d", [False, True])
def test_reference_matches_definition(lens_2d):
    g = torch.Generator().manual_seed(1)
    b, next_n, h, d, block_size, blocks = 2, 2, 3, 8, 4, 7
    values = (torch.randn(blocks, block_size, d, generator=g) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(blocks, block_size, generator=g) + 0.1
    q = (torch.randn(b, next_n, h, d, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(b * next_n, h, generator=g)
    tables = torch.tensor([[6, 0, 3], [2, 5, 1]], dtype=torch.int32)
    lens = (torch.tensor([[5, 9], [0, 3]]) if lens_2d else torch.tensor([9, 2])).to(torch.int32)
    cache = build_cache(values, scales)
    got = fp8_paged_mqa_logits_ref(q, cache, weights, lens, tables, 11)
    want = brute_force(q, values.float(), scales, weights, lens, tables, 11)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[torch.isfinite(want)], want[torch.isfinite(want)], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("memory_mb", [None, "0.01"])  # default bound, and one that forces many chunks
@pytest.mark.parametrize("batch,next_n,h,d,ctx,bs,lens_2d", [
    (3, 1, 16, 64, 200, 64, False),
    (2, 2, 32, 128, 130, 16, True),
    (1, 2, 16, 64, 20, 64, False),
])
def test_torch_ref_paged_matches_reference(monkeypatch, memory_mb, batch, next_n, h, d, ctx, bs, lens_2d):
    from mqa_provider_torch_ref.kernels import KERNELS

    if memory_mb:
        monkeypatch.setenv("MQA_TORCH_REF_MEMORY_MB", memory_mb)
    inp = make_paged_inputs(batch, next_n, h, d, ctx, block_size=bs, lens_2d=lens_2d, seed=ctx)
    out = KERNELS.fp8_paged_mqa_logits(*inp.args())
    ref = inp.reference()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    assert calc_diff(out, ref) < 1e-6


def test_public_op_serves_paged_on_cpu():
    import mqa_core

    inp = make_paged_inputs(2, 2, 16, 64, 90, seed=5)
    out = mqa_core.fp8_paged_mqa_logits(*inp.args())
    assert out.shape == (4, 90) and calc_diff(out, inp.reference()) < 1e-6
