"""torch.ops.mqa.*: registration, fake (meta) shapes and strides, torch.compile without graph breaks,
provider changes under a compiled graph, and (on an NVIDIA GPU) CUDA-graph capture and replay."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import mqa_core
from mqa_core import torch_ops
from mqa_core.reference import fp8_mqa_logits_ref, fp8_paged_mqa_logits_ref
from mqa_core.spec import Problem
from mqa_core.testing import calc_diff, make_inputs, make_paged_inputs

# test_schema compares inputs before and after with allclose, which fp8 lacks on the CPU; the ops
# declare mutates_args=() and test_inputs_untouched checks that byte for byte instead.
OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def prefill_args(m: int = 7, n: int = 45, h: int = 16, d: int = 64, device: str = "cpu", seed: int = 0):
    inp = make_inputs(Problem(m, n, h, d), device=device, seed=seed)
    return inp, (inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)


def test_import_mqa_core_does_not_import_torch():
    code = "import sys, mqa_core; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_is_idempotent_and_names_the_ops():
    ns = torch_ops.register()
    assert ns is torch_ops.register() is torch.ops.mqa
    assert "mqa::fp8_mqa_logits(Tensor q, Tensor k, Tensor k_scale" in str(ns.fp8_mqa_logits.default._schema)
    assert "SymInt max_context_len, *, bool clean_logits=True" in str(
        ns.fp8_paged_mqa_logits.default._schema)


@pytest.mark.parametrize("n", [45, 64])  # torch_ref's contiguous rows: copied (45) or passed through (64)
def test_eager_op_matches_the_api_with_the_declared_layout(n):
    inp, args = prefill_args(n=n)
    out = torch.ops.mqa.fp8_mqa_logits(*args)
    assert (tuple(out.shape), out.stride()) == torch_ops.logits_layout(7, n)
    want = mqa_core.fp8_mqa_logits(*inp.args())
    assert torch.equal(out, want)
    assert calc_diff(out, inp.reference()) < 1e-6


def test_inputs_untouched():
    _, args = prefill_args()
    before = [a.clone() for a in args]
    torch.ops.mqa.fp8_mqa_logits(*args)
    for a, b in zip(args, before):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_opcheck_prefill():
    _, args = prefill_args(m=5, n=37)
    torch.library.opcheck(torch.ops.mqa.fp8_mqa_logits.default, args, {"clean_logits": True},
                          test_utils=OPCHECKS)


def test_opcheck_paged():
    inp = make_paged_inputs(2, 2, 16, 64, 100, seed=2)
    torch.library.opcheck(torch.ops.mqa.fp8_paged_mqa_logits.default, inp.args(),
                          {"clean_logits": True}, test_utils=OPCHECKS)


def indexer_step(q, k, k_scale, w, ks, ke):
    """What an engine wraps: logits, then top-k (the op must not break the graph around it)."""
    logits = torch.ops.mqa.fp8_mqa_logits(q, k, k_scale, w, ks, ke)
    return logits.topk(8, dim=-1).indices, logits


def paged_step(q, cache, w, lens, tables, max_len: int):
    logits = torch.ops.mqa.fp8_paged_mqa_logits(q, cache, w, lens, tables, max_len)
    return logits * 2.0


def test_compile_fullgraph_aot_eager_matches_eager():
    _, args = prefill_args()
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend="aot_eager", fullgraph=True)
    got, want = compiled(*args), indexer_step(*args)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])

    inp = make_paged_inputs(2, 2, 16, 64, 90, seed=4)
    compiled_paged = torch.compile(paged_step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled_paged(*inp.args()), paged_step(*inp.args()))


def test_compile_dynamic_shapes_do_not_recompile():
    """The fake works on symbolic sizes (padded row stride included): one graph for several N."""
    compiles = 0

    def counting(gm, example_inputs):
        nonlocal compiles
        compiles += 1
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=counting, fullgraph=True, dynamic=True)
    for n in (40, 53, 77):
        _, args = prefill_args(m=9, n=n, seed=n)
        assert torch.equal(compiled(*args)[1], indexer_step(*args)[1])
    assert compiles == 1


def test_compile_inductor_small():
    _, args = prefill_args(m=4, n=33)
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend="inductor", fullgraph=True)
    got, want = compiled(*args), indexer_step(*args)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


PROBE = """
from mqa_core import ProviderSpec, hookimpl

@hookimpl
def mqa_providers():
    return [ProviderSpec(name="probe", ops={"fp8_mqa_logits"}, archs={"cpu"},
                         dtypes={"float8_e4m3fn"}, priority=10, load="probe_provider.kernels:KERNELS")]
"""

PROBE_KERNELS = """
from mqa_provider_torch_ref.kernels import KERNELS as REF

CALLS = []

class Probe:
    def fp8_mqa_logits(self, *args, **kwargs):
        CALLS.append(1)
        return REF.fp8_mqa_logits(*args, **kwargs) * 2.0  # visibly different from torch_ref

KERNELS = Probe()
"""


def test_forced_provider_after_compile_needs_reload_not_recompile(install_dist, monkeypatch):
    """The op is opaque to dynamo: its body asks the registry on every call, so a reload changes
    the provider under an already compiled graph (no recompile). Settings are read once, so
    changing MQA_PROVIDER without mqa_core.reload() changes nothing."""
    install_dist("probe-provider", "1.0", {"probe_provider/__init__.py": PROBE,
                                           "probe_provider/kernels.py": PROBE_KERNELS},
                 entry_points={"mqa_core.providers": {"probe": "probe_provider"}})
    compiles = 0

    def counting(gm, example_inputs):
        nonlocal compiles
        compiles += 1
        return gm.forward

    _, args = prefill_args()
    chosen = mqa_core.get_provider("cpu", op="fp8_mqa_logits").impl  # the probe, by priority
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=counting, fullgraph=True)
    probed = compiled(*args)[1]
    calls = sys.modules["probe_provider.kernels"].CALLS
    assert type(chosen).__name__ == "Probe" and len(calls) == 1

    monkeypatch.setenv("MQA_PROVIDER", "torch_ref")
    compiled(*args)
    assert len(calls) == 2, "settings are read once: no reload, no change"

    mqa_core.reload()
    plain = compiled(*args)[1]
    assert len(calls) == 2 and compiles == 1
    assert torch.equal(probed, plain * 2.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("op", ["fp8_mqa_logits", "fp8_paged_mqa_logits"])
def test_cuda_graph_capture_and_replay_match_eager(op):
    provider = mqa_core.get_provider(op=op)
    if provider.name == "torch_ref":
        pytest.skip("torch_ref synchronises with the host (tolist) and cannot be captured")
    if op == "fp8_mqa_logits":
        _, static = prefill_args(m=300, n=2000, h=64, d=128, device="cuda", seed=1)
        fresh = make_inputs(Problem(300, 2000, 64, 128), device="cuda", seed=2).q
        call = torch.ops.mqa.fp8_mqa_logits
    else:
        inp = make_paged_inputs(8, 2, 64, 128, 3000, device="cuda", seed=1)
        static = inp.args()
        fresh = make_paged_inputs(8, 2, 64, 128, 3000, device="cuda", seed=2).q
        call = torch.ops.mqa.fp8_paged_mqa_logits

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: selection, loading and JIT compilation happen here
        for _ in range(2):
            call(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(*static)

    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, call(*static))
    static[0].copy_(fresh)  # new queries in the captured buffer
    graph.replay()
    torch.cuda.synchronize()
    eager = call(*static)
    assert torch.equal(out, eager)
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in static]
    ref = fp8_mqa_logits_ref(*cpu) if op == "fp8_mqa_logits" else fp8_paged_mqa_logits_ref(*cpu)
    assert calc_diff(out.cpu(), ref) < 1e-3
    assert torch.equal(torch.isneginf(out.cpu()), torch.isneginf(ref))
    compiled = torch.compile(lambda *a: call(*a) * 1.0, fullgraph=True)
    assert torch.equal(compiled(*static), eager)
