"""torch.ops.mqa.fp8_mqa_topk / fp8_paged_mqa_topk / topk_per_row: eager results equal the public ops,
the fake (meta) implementation states the shapes, torch.compile(fullgraph=True) traces them whole."""

from __future__ import annotations

import pytest
import torch
from test_torch_ops import counting_eager
from torch._subclasses.fake_tensor import FakeTensorMode

import mqa_core
from mqa_core import torch_ops
from mqa_core.spec import Problem
from mqa_core.testing import make_inputs, make_paged_inputs

OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def prefill(m: int = 7, n: int = 45, seed: int = 0) -> tuple[torch.Tensor, ...]:
    x = make_inputs(Problem(m, n, 16, 64), seed=seed)
    return x.q, x.k, x.k_scale, x.weights, x.ks, x.ke


def test_schemas_name_the_ops() -> None:
    ns = torch_ops.register()
    assert "int topk, *, str positions=\"relative\", bool return_values=False) -> (Tensor, Tensor)" in str(
        ns.fp8_mqa_topk.default._schema)
    assert "SymInt max_context_len, int topk, *, Tensor? schedule=None" in str(ns.fp8_paged_mqa_topk.default._schema)
    assert "topk_per_row(Tensor logits, Tensor ks, Tensor ke, int topk" in str(ns.topk_per_row.default._schema)


@pytest.mark.parametrize("positions", ["relative", "absolute"])
def test_eager_ops_equal_the_public_ops(positions: str) -> None:
    q, k, s, w, ks, ke = prefill()
    idx, vals = torch.ops.mqa.fp8_mqa_topk(q, k, s, w, ks, ke, 8, positions=positions)
    assert torch.equal(idx, mqa_core.fp8_mqa_topk(q, (k, s), w, ks, ke, 8, positions=positions))
    assert vals.shape == (0, 8) and vals.dtype == torch.float32
    out = torch.ops.mqa.fp8_mqa_topk(q, k, s, w, ks, ke, 8, positions=positions, return_values=True)
    want = mqa_core.fp8_mqa_topk(q, (k, s), w, ks, ke, 8, positions=positions, return_values=True)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    assert torch.equal(torch_ops.topk_indices(out), want[0]) and torch_ops.topk_indices(out, True) is out

    x = make_paged_inputs(3, 2, 16, 64, 120, seed=1, lens_2d=True)
    idx, vals = torch.ops.mqa.fp8_paged_mqa_topk(*x.args(), 16, return_values=True)
    want = mqa_core.fp8_paged_mqa_topk(*x.args(), 16, return_values=True)
    assert torch.equal(idx, want[0]) and torch.equal(vals, want[1]) and idx.shape == (6, 16)

    logits = torch.randn(5, 60)[:, :50]  # any row stride
    lks, lke = torch.zeros(5, dtype=torch.int32), torch.full((5,), 50, dtype=torch.int32)
    idx, vals = torch.ops.mqa.topk_per_row(logits, lks, lke, 4, positions=positions)
    assert torch.equal(idx, mqa_core.topk_per_row(logits, lks, lke, 4, positions=positions)) and vals.numel() == 0


def test_meta_and_fake_tensors_get_the_shapes() -> None:
    args = [a.to("meta") for a in prefill(m=5, n=37)]
    idx, vals = torch.ops.mqa.fp8_mqa_topk(*args, 9)
    assert idx.device.type == "meta" and idx.shape == (5, 9) and idx.dtype == torch.int32 and vals.shape == (0, 9)
    idx, vals = torch.ops.mqa.fp8_mqa_topk(*args, 9, return_values=True)
    assert vals.shape == (5, 9) and vals.dtype == torch.float32
    x = make_paged_inputs(2, 3, 16, 64, 100, seed=2)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in x.args()]
        idx, vals = torch.ops.mqa.fp8_paged_mqa_topk(*fake, 32, return_values=True)
        assert idx.shape == (6, 32) and vals.shape == (6, 32) and idx.dtype == torch.int32
        logits = mode.from_tensor(torch.randn(4, 70, dtype=torch.bfloat16))
        ks = mode.from_tensor(torch.zeros(4, dtype=torch.int32))
        idx, vals = torch.ops.mqa.topk_per_row(logits, ks, ks, 3)
        assert idx.shape == (4, 3) and vals.shape == (0, 3)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        torch.ops.mqa.fp8_mqa_topk(*prefill()[:-1], args[-1], 9)


def test_opcheck() -> None:
    torch.library.opcheck(torch.ops.mqa.fp8_mqa_topk.default, prefill(m=5, n=37) + (6,),
                          {"return_values": True}, test_utils=OPCHECKS)
    x = make_paged_inputs(2, 2, 16, 64, 100, seed=2)
    torch.library.opcheck(torch.ops.mqa.fp8_paged_mqa_topk.default, x.args() + (8,), {}, test_utils=OPCHECKS)
    logits = torch.randn(4, 30)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 30, dtype=torch.int32)
    torch.library.opcheck(torch.ops.mqa.topk_per_row.default, (logits, ks, ke, 5), {"positions": "absolute"},
                          test_utils=OPCHECKS)


def indexer_step(q, k, s, w, ks, ke):
    """What an engine compiles: the indexer step's positions, then something that uses them."""
    idx, values = torch.ops.mqa.fp8_mqa_topk(q, k, s, w, ks, ke, 8, positions="absolute", return_values=True)
    only = torch_ops.topk_indices(torch.ops.mqa.fp8_mqa_topk(q, k, s, w, ks, ke, 8))
    return idx.clamp(min=0) + 1, values * 2.0, only


def decode_step(q, cache, w, lens, tables, max_len: int):
    idx = torch.ops.mqa.fp8_paged_mqa_topk(q, cache, w, lens, tables, max_len, 16)[0]
    logits = torch.randn(q.shape[0] * q.shape[1], 40)
    zero = torch.zeros(logits.shape[0], dtype=torch.int32)
    sel = torch.ops.mqa.topk_per_row(logits, zero, zero + 40, 4)[0]
    return idx + 0, sel.shape


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend: str) -> None:
    args = prefill()
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=backend, fullgraph=True)
    for got, want in zip(compiled(*args), indexer_step(*args)):
        assert torch.equal(got, want)
    x = make_paged_inputs(2, 2, 16, 64, 90, seed=4)
    compiled_decode = torch.compile(decode_step, backend="aot_eager", fullgraph=True)
    got, shape = compiled_decode(*x.args())
    assert torch.equal(got, decode_step(*x.args())[0]) and tuple(shape) == (4, 4)


def test_compile_dynamic_shapes_one_graph() -> None:
    counting = counting_eager()

    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=counting, fullgraph=True, dynamic=True)
    for m, n in ((9, 40), (11, 53), (6, 77)):
        args = prefill(m=m, n=n, seed=n)
        assert torch.equal(compiled(*args)[0], indexer_step(*args)[0])
    assert counting.compiles == 1
