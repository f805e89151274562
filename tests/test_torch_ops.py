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


@pytest.mark.parametrize("n", [45, 64])
def test_eager_op_returns_the_providers_result_in_its_own_layout(n):
    """torch_ref returns contiguous rows: the op passes them on as they are, whatever N."""
    inp, args = prefill_args(n=n)
    out = torch.ops.mqa.fp8_mqa_logits(*args)
    assert tuple(out.shape) == (7, n) and out.stride() == (n, 1)
    want = mqa_core.fp8_mqa_logits(*inp.args())
    assert torch.equal(out, want)
    assert calc_diff(out, inp.reference()) < 1e-6


def test_meta_tensors_get_the_fake_with_contiguous_rows():
    _, args = prefill_args(m=5, n=37)
    out = torch.ops.mqa.fp8_mqa_logits(*[a.to("meta") for a in args])
    assert out.device.type == "meta" and tuple(out.shape) == (5, 37) and out.dtype == torch.float32
    paged = make_paged_inputs(2, 2, 16, 64, 100, seed=2)
    out = torch.ops.mqa.fp8_paged_mqa_logits(*[a.to("meta") if isinstance(a, torch.Tensor) else a
                                                for a in paged.args()])
    assert out.device.type == "meta" and tuple(out.shape) == (4, 100)


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
    counting = counting_eager()

    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=counting, fullgraph=True, dynamic=True)
    for n in (40, 53, 77):
        _, args = prefill_args(m=9, n=n, seed=n)
        assert torch.equal(compiled(*args)[1], indexer_step(*args)[1])
    assert counting.compiles == 1


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
    counting = counting_eager()

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
    assert len(calls) == 2 and counting.compiles == 1
    assert torch.equal(probed, plain * 2.0)


# -- layout: the provider's result is never copied -------------------------------------------------

LAYOUT_PROBE = """
import torch
from mqa_core import ProviderSpec, hookimpl
from mqa_provider_torch_ref.kernels import KERNELS as REF

#: Row stride = ceil((N + extra) / align) * align floats, the view starting at [row0, col0] of its
#: buffer; or a degenerate layout the result check allows ("one row": [1, N] with row stride 1,
#: "one column": [M, 1] with column stride M).
LAYOUT = {"align": 256, "extra": 256, "row0": 0, "col0": 0, "degenerate": None}
RETURNED = []


def _lay_out(out):
    m, n = out.shape
    if LAYOUT["degenerate"] == "one row":
        view = torch.empty(n, 1).T
    elif LAYOUT["degenerate"] == "one column":
        view = torch.empty(1, m).T
    else:
        a, r0, c0 = LAYOUT["align"], LAYOUT["row0"], LAYOUT["col0"]
        row = -(-(n + LAYOUT["extra"] + c0) // a) * a
        view = torch.full((m + r0, row), float("nan"))[r0:, c0:c0 + n]
    view.copy_(out)
    RETURNED.append(view)
    return view


class Kernels:
    def fp8_mqa_logits(self, *args, **kwargs):
        return _lay_out(REF.fp8_mqa_logits(*args, **kwargs))

    def fp8_paged_mqa_logits(self, *args, **kwargs):
        return _lay_out(REF.fp8_paged_mqa_logits(*args, **kwargs))


KERNELS = Kernels()


@hookimpl
def mqa_providers():
    return [ProviderSpec(name="padded", ops={"fp8_mqa_logits", "fp8_paged_mqa_logits"}, archs={"cpu"},
                         dtypes={"float8_e4m3fn"}, priority=10, load="layout_probe:KERNELS")]
"""

#: (align, extra): DeepGEMM prefill align(N + 256, 256); AITER 256; the Triton kernels 16; torch_ref 1.
LAYOUTS = {"deepgemm": (256, 256), "aiter": (256, 0), "triton": (16, 0), "contiguous": (1, 0)}


@pytest.fixture
def layout_probe(install_dist):
    install_dist("layout-probe", "1.0", {"layout_probe.py": LAYOUT_PROBE},
                 entry_points={"mqa_core.providers": {"padded": "layout_probe"}})
    import layout_probe

    return layout_probe


def counting_eager():
    """A dynamo backend that runs the graph as traced and counts how many graphs it was given."""
    def backend(gm, example_inputs):
        backend.compiles += 1
        return gm.forward

    backend.compiles = 0
    return backend


def counting_inductor():
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        backend.compiles += 1
        return compile_fx(gm, example_inputs)

    backend.compiles = 0
    return backend


def assert_passed_on(out, probe, ref):
    """``out`` is the provider's own result (same memory, same strides) and holds the right values."""
    got = probe.RETURNED[-1]
    assert (out.data_ptr(), out.stride(), out.shape) == (got.data_ptr(), got.stride(), got.shape)
    assert calc_diff(out, ref) < 1e-9 and torch.equal(torch.isneginf(out), torch.isneginf(ref))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("layout", [*LAYOUTS, "offset"])
def test_no_provider_layout_is_copied(layout_probe, layout, backend):
    align, extra = LAYOUTS.get(layout, (256, 256))
    layout_probe.LAYOUT.update(align=align, extra=extra, row0=2 if layout == "offset" else 0,
                               col0=5 if layout == "offset" else 0)
    torch._dynamo.reset()
    fn = indexer_step if backend == "eager" else torch.compile(indexer_step, backend=backend, fullgraph=True)
    for n in (45, 64):
        inp, args = prefill_args(n=n, seed=n)
        out = fn(*args)[1]
        assert_passed_on(out, layout_probe, inp.reference())
        if layout == "deepgemm":
            assert out.stride() == (-(-(n + 256) // 256) * 256, 1)  # 512 for N=45 and N=64


def test_one_graph_for_every_n_and_every_providers_layout(layout_probe, monkeypatch):
    """The fake states a row stride read from the result at run time: dynamic N, a provider switched
    by reload(), each with its own layout, all run the one compiled graph without a copy."""
    backend = counting_inductor()
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, backend=backend, fullgraph=True, dynamic=True)
    for n, layout in ((40, "deepgemm"), (53, "aiter"), (77, "triton"), (91, "contiguous")):
        layout_probe.LAYOUT.update(align=LAYOUTS[layout][0], extra=LAYOUTS[layout][1])
        inp, args = prefill_args(m=9, n=n, seed=n)
        assert_passed_on(compiled(*args)[1], layout_probe, inp.reference())
    monkeypatch.setenv("MQA_PROVIDER", "torch_ref")
    mqa_core.reload()
    inp, args = prefill_args(m=9, n=61, seed=61)
    out = compiled(*args)[1]
    assert out.stride() == (61, 1) and calc_diff(out, inp.reference()) < 1e-9
    assert backend.compiles == 1


def logits_and_max(q, k, k_scale, w, ks, ke):
    logits = torch.ops.mqa.fp8_mqa_logits(q, k, k_scale, w, ks, ke)
    return logits.amax(dim=-1), logits


@pytest.mark.parametrize("degenerate, m, n", [("one row", 1, 45), ("one column", 7, 1)])
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_degenerate_layouts_become_views_with_the_stated_strides(layout_probe, degenerate, m, n, backend):
    """One row (or one column) lets a provider's other stride be anything: the op returns a view of the
    same memory whose last dim is contiguous and whose row stride is at least N, as the fake states."""
    layout_probe.LAYOUT.update(degenerate=degenerate)
    torch._dynamo.reset()
    fn = logits_and_max if backend == "eager" else torch.compile(logits_and_max, backend=backend, fullgraph=True)
    inp, args = prefill_args(m=m, n=n, seed=3)
    out = fn(*args)[1]
    assert out.stride(1) == 1 and out.stride(0) >= n and out.data_ptr() == layout_probe.RETURNED[-1].data_ptr()
    assert calc_diff(out, inp.reference()) < 1e-9 or torch.isneginf(inp.reference()).all()
    assert torch.equal(torch.isneginf(out), torch.isneginf(inp.reference()))


def paged_logits(q, cache, w, lens, tables, max_len: int):
    logits = torch.ops.mqa.fp8_paged_mqa_logits(q, cache, w, lens, tables, max_len)
    return logits, logits.topk(4, dim=-1).indices


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_paged_op_passes_the_providers_layout_on(layout_probe, backend):
    layout_probe.LAYOUT.update(align=256, extra=0)  # DeepGEMM's paged rows: align(align(N, 256), 256)
    torch._dynamo.reset()
    fn = paged_logits if backend == "eager" else torch.compile(paged_logits, backend=backend, fullgraph=True)
    inp = make_paged_inputs(2, 2, 16, 64, 300, seed=7)
    out = fn(*inp.args())[0]
    assert out.stride() == (512, 1)
    assert_passed_on(out, layout_probe, inp.reference())


def test_compiled_op_with_torch_ref_matches_the_reference():
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, fullgraph=True)
    for m, n in ((7, 45), (16, 128), (3, 9)):
        inp, args = prefill_args(m=m, n=n, seed=m + n)
        out = compiled(*args)[1]
        ref = inp.reference()
        assert calc_diff(out, ref) < 1e-9 or torch.isneginf(ref).all()
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref))


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
    torch._dynamo.reset()  # inductor's CUDA graphs: the op's data-dependent row stride is captured too
    graphed = torch.compile(lambda *a: call(*a) * 1.0, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        got = graphed(*static)
    assert torch.equal(got, eager)


# -- trust (issue 37) ------------------------------------------------------------------------------

@pytest.mark.parametrize("which", [0, 3, 5])
def test_one_argument_on_meta_is_refused_with_the_public_message(which):
    """The dispatcher runs the Meta kernel (the fake) when any argument is on meta: mixed devices get
    the public op's refusal, not uninitialised memory."""
    inp, args = prefill_args()
    mixed = [a.to("meta") if i == which else a for i, a in enumerate(args)]
    with pytest.raises(ValueError, match="fp8_mqa_logits: all tensors must be on one device") as err:
        torch.ops.mqa.fp8_mqa_logits(*mixed)
    with pytest.raises(ValueError) as public:
        mqa_core.fp8_mqa_logits(mixed[0], (mixed[1], mixed[2]), *mixed[3:])
    assert str(err.value) == str(public.value)
    paged = list(make_paged_inputs(2, 2, 16, 64, 100, seed=2).args())
    paged[4] = paged[4].to("meta")  # block_tables
    with pytest.raises(ValueError, match="fp8_paged_mqa_logits: all tensors must be on one device; .*"
                                         "block_tables on meta") as err:
        torch.ops.mqa.fp8_paged_mqa_logits(*paged)
    with pytest.raises(ValueError) as public:
        mqa_core.fp8_paged_mqa_logits(*paged)
    assert str(err.value) == str(public.value)


def test_the_ops_declare_no_mutation_and_compiled_calls_mutate_nothing():
    for op in (torch.ops.mqa.fp8_mqa_logits.default, torch.ops.mqa.fp8_paged_mqa_logits.default):
        schema = op._schema
        assert not schema.is_mutable and all(a.alias_info is None for a in schema.arguments)
        assert all(r.alias_info is None for r in schema.returns)
    _, args = prefill_args()
    paged = make_paged_inputs(2, 2, 16, 64, 90, seed=4).args()
    tensors = [a for a in (*args, *paged) if isinstance(a, torch.Tensor)]
    before = [t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone() for t in tensors]
    torch._dynamo.reset()
    got = torch.compile(indexer_step, backend="inductor", fullgraph=True)(*args)[1]
    got_paged = torch.compile(paged_step, backend="aot_eager", fullgraph=True)(*paged)
    for t, b in zip(tensors, before):
        assert torch.equal(t.view(torch.uint8) if t.element_size() == 1 else t, b)
    from mqa_core.result import overlap

    assert overlap(got, tuple(tensors)) is None and overlap(got_paged, tuple(tensors)) is None
