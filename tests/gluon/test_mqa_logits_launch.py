"""The launchers' host path: per-signature plans and direct launches of bound kernels.

Without a GPU, Triton's host path runs whole under a host-only driver (``host_driver``): kernels
compile for sm_90 for real and the C launcher call is recorded instead of made. A direct launch must
hand the launcher exactly what Triton's own path hands it (same compiled binary, same arguments,
descriptors encoded from the same pointer, shape and strides) for every call in a sequence whose data
pointers, sizes, strides and alignments change. On an H200 the ``cuda`` tests compare outputs.
"""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from mqa_core.reference import fp8_mqa_logits_ref
from mqa_core.spec import Problem
from mqa_core.testing import calc_diff, make_inputs

triton = pytest.importorskip("triton")

from mqa_provider_gluon import launch  # noqa: E402
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402
from mqa_provider_gluon.ops import mqa_logits_triton as op  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_triton import TritonConfig  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402

FN = torch.float8_e4m3fn
SMALL = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2)
SMALL_TMA = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2, tma=True)
pytestmark = pytest.mark.usefixtures("fresh_plans")


#: Direct launches are written for one triton release; elsewhere the launchers keep triton's launch
#: (and the tests below check that instead).
DIRECT = launch.direct_launch_unsupported() is None


# ---- what Triton's specialisation reads from an int ---------------------------------------------

def test_int_class_is_what_triton_specialises_on():
    backend = type(make_backend(GPUTarget("cuda", 90, 32)))
    values = [0, 1, 2, 3, 15, 16, 17, 32, 48, 100, 128, 2**20, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**40]
    for a, b in itertools.product(values, repeat=2):
        same = launch.int_class(a) == launch.int_class(b)
        triton_same = native_specialize_impl(backend, a, False, True, True) == \
            native_specialize_impl(backend, b, False, True, True)
        assert same == triton_same, (a, b)


def test_version_gate():
    assert launch.direct_launch_unsupported("3.9.0") is not None
    assert "3.9.0" in launch.direct_launch_unsupported("3.9.0")
    assert launch.direct_launch_unsupported("3.5.1") is not None
    if getattr(torch.version, "hip", None) is None:
        assert launch.direct_launch_unsupported("3.6.0") is None


def test_what_cannot_be_bound_stays_on_triton_launches():
    from types import SimpleNamespace as NS

    assert launch.bind(None) is False  # a compile hook cancelled the launch
    assert launch.bind(object()) is False  # not a compiled kernel (the interpreter's result)
    sig = NS(signature={"a": "*fp32", "d": "tensordesc<fp8e4nv[64, 128]>"})

    def kernel(launcher):
        return NS(run=launcher, src=sig, function=1, packed_metadata=(), hash="h")

    plain = NS(global_scratch_size=0, profile_scratch_size=0, launch=print, launch_cooperative_grid=False,
               launch_pdl=False)
    assert launch.bind(kernel(plain)) is False  # a descriptor argument, but no wrapper to take apart
    scratch = NS(**{**vars(plain), "global_scratch_size": 64})
    assert launch.bind(kernel(scratch)) is False  # triton allocates scratch per launch
    with pytest.raises(launch.DirectLaunchUnavailable, match="unknown shape"):
        launch.BoundKernel(kernel(plain))


# ---- the host-only world: Triton's host path without a GPU --------------------------------------

@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):
    """CPU tensors launched as if on one H200: the launchers see sm_90 with 132 SMs, Triton sees the
    host-only driver, and the kernels are fresh JIT objects (so nothing compiled here, bound to the
    recording launcher, stays in the module's kernels for a real GPU later in the process)."""
    from mqa_provider_gluon.host_driver import HostOnlyDriver, host_only
    from triton.experimental import gluon

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(op, "_device_facts", lambda index: ("sm_90", 4 * 132))
    held = {"triton": triton.jit(op._mqa_logits_kernel,
                                 do_not_specialize=["M", "N", "num_splits", "tiles_per_split"])}
    monkeypatch.setattr(op, "kernel", lambda interpret=None: held["triton"])
    if _gluon_ready() is None:
        monkeypatch.setattr(g, "gluon_supported", lambda device=None: None)
        monkeypatch.setattr(g, "_multiprocessors", lambda index: 132)
        held["gluon"] = {name: gluon.jit(fn.fn, do_not_specialize=fn.do_not_specialize)
                         for name, fn in g._kernels().items()}
        monkeypatch.setattr(g, "_kernels", lambda: held["gluon"])
    calls = []
    real_call = launch.BoundKernel.__call__
    monkeypatch.setattr(launch.BoundKernel, "__call__", lambda self, *a: calls.append(1) or real_call(self, *a))
    # Name the pointers a call allocates (its output, copies made for the kernel), so two calls'
    # launches compare equal when they pass the same kinds of tensors in the same places.
    labels: dict[int, str] = {}
    for mod in (op, g):
        real_out, real_prep = mod._new_output, mod._prepare

        def new_output(*a, real_out=real_out):
            out = real_out(*a)
            labels.setdefault(out.data_ptr(), "out")
            return out

        def prepare(*a, real_prep=real_prep):
            ts = real_prep(*a)
            for i, t in enumerate(ts):
                labels.setdefault(t.data_ptr(), f"prepared {i}")
            return ts

        monkeypatch.setattr(mod, "_new_output", new_output)
        monkeypatch.setattr(mod, "_prepare", prepare)
    with host_only(HostOnlyDriver()) as drv:
        drv.direct_calls = calls
        drv.labels = labels
        yield drv
        # Drop every kernel compiled here while this driver is active: later tritons unload a
        # kernel's module through the active driver when the kernel is collected.
        op.clear_caches()
        g.clear_caches()
        monkeypatch.undo()
        held.clear()
        gc.collect()


def _variants(problem: Problem, seed: int):
    """Inputs for one problem in layouts a caller may send: fresh tensors (new data pointers), k with
    a 16-byte-multiple row pitch, k with an unaligned pitch, k at an unaligned base, [N, 1] k_scale,
    a transposed weights view, int64 windows."""
    inp = make_inputs(problem, window="ragged", seed=seed)
    n, d = problem.n, problem.d
    yield "fresh", inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke
    again = make_inputs(problem, window="causal", seed=seed + 1)
    yield "same shapes, other tensors", again.q, again.k, again.k_scale, again.weights, again.ks, again.ke
    wide = torch.zeros(n, d + 32, dtype=torch.uint8).view(FN)
    wide[:, :d] = inp.k
    yield "k row pitch d+32", inp.q, wide[:, :d], inp.k_scale, inp.weights, inp.ks, inp.ke
    odd = torch.zeros(n, d + 8, dtype=torch.uint8).view(FN)
    odd[:, :d] = inp.k
    yield "k row pitch d+8", inp.q, odd[:, :d], inp.k_scale, inp.weights, inp.ks, inp.ke
    flat = torch.zeros(n * d + 8, dtype=torch.uint8).view(FN)
    shifted = flat[8:].view(n, d)
    shifted.copy_(inp.k)
    yield "k base off by 8 bytes", inp.q, shifted, inp.k_scale, inp.weights, inp.ks, inp.ke
    yield "k_scale [N, 1]", inp.q, inp.k, inp.k_scale[:, None], inp.weights, inp.ks, inp.ke
    yield "weights transposed view", inp.q, inp.k, inp.k_scale, inp.weights.t().contiguous().t(), inp.ks, inp.ke
    yield "int64 windows", inp.q, inp.k, inp.k_scale, inp.weights, inp.ks.long(), inp.ke.long()


PROBLEMS = [Problem(13, 70, 16, 64), Problem(1, 45, 32, 128), Problem(40, 130, 16, 64)]


def _labelled(value, labels: dict[int, str]):
    if isinstance(value, tuple):
        return tuple(_labelled(v, labels) for v in value)
    return labels.get(value, value) if isinstance(value, int) and not isinstance(value, bool) else value


def _same_launches(drv, call, inputs) -> None:
    """Triton's own path, then the direct path twice (binding at the latest on the first, bound on
    the second; with a triton direct launches are not written for, triton's path all three times):
    the C launcher gets the same thing each time. Pointers are compared by what they point at: an
    input (by position), this call's output, or a copy made for the kernel."""
    seen = []
    for direct in (False, True, True):
        drv.labels.clear()
        drv.labels.update({t.data_ptr(): f"input {i}" for i, t in enumerate(inputs)})
        before = len(drv.direct_calls)
        call(direct)
        seen.append(_labelled(drv.launches[-1], drv.labels))
    assert len(drv.direct_calls) == before + DIRECT, "the third call did not launch the bound kernel"
    triton_path, first, bound = seen
    assert first == triton_path
    assert bound == triton_path, "a direct launch differs from triton's (stale key or descriptor?)"


@pytest.mark.parametrize("config", [SMALL, SMALL_TMA, None], ids=["plain", "tma", "default"])
def test_triton_direct_launch_matches_triton(host, config):
    for problem, seed in zip(PROBLEMS, (1, 2, 3)):
        for _name, q, k, ksc, w, ks, ke in _variants(problem, seed):
            _same_launches(host, lambda direct: op.fp8_mqa_logits_triton(
                q, k, ksc, w, ks, ke, True, config=config, direct=direct), (q, k, ksc, w, ks, ke))
    # the sequence bound one kernel per signature, not one per call
    assert 0 < len(op._BOUND) < 3 * 8 if DIRECT else not op._BOUND


def test_triton_descriptor_follows_the_tensor(host):
    """Same signature, new k each call: each launch's TMA descriptor carries that call's k."""
    problem = Problem(9, 64, 16, 64)
    for seed in range(4):
        inp = make_inputs(problem, seed=seed)
        op.fp8_mqa_logits_triton(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, True, config=SMALL_TMA)
        desc = list(_encoded_descriptors(host.launches[-1]))
        assert len(desc) == 1 and desc[0][1] == inp.k.data_ptr()
    assert len(host.direct_calls) == 3 * DIRECT


def _encoded_descriptors(launch_args):
    for a in launch_args:
        if isinstance(a, tuple) and a[:1] == ("tma",):
            yield a
        elif isinstance(a, tuple):
            yield from _encoded_descriptors(a)


def test_clean_and_config_are_part_of_the_signature(host):
    inp = make_inputs(Problem(7, 50, 16, 64), seed=4)
    args = (inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    for clean, cfg in itertools.product((True, False), (SMALL, SMALL_TMA)):
        _same_launches(host, lambda direct: op.fp8_mqa_logits_triton(*args, clean, config=cfg, direct=direct),
                       args)
    functions = {launch_args[4] for launch_args in host.launches}
    assert len(functions) == 4  # four compiled kernels: CLEAN x USE_TMA


def test_gate_and_hooks_keep_triton_launching(host, monkeypatch: pytest.MonkeyPatch):
    from triton import knobs

    inp = make_inputs(Problem(7, 50, 16, 64), seed=4)
    args = (inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, True)
    op.fp8_mqa_logits_triton(*args, config=SMALL)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launch.hooks_active()
        op.fp8_mqa_logits_triton(*args, config=SMALL)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not host.direct_calls  # a profiler's hook sees every launch
    op.clear_caches()
    monkeypatch.setattr(op, "direct_launch_unsupported", lambda: "triton 3.9.0")
    for _ in range(3):
        op.fp8_mqa_logits_triton(*args, config=SMALL)
    assert not host.direct_calls and not op._BOUND
    # the same kernel, grid and scalar arguments each time; the freshly allocated output may sit at
    # another address from one call to the next (a clean-clone CI run met that)
    def shape(v):  # addresses (ints past 2**32) as one placeholder, everything else as it is
        if isinstance(v, tuple):
            return tuple(shape(x) for x in v)
        return "address" if isinstance(v, int) and not isinstance(v, bool) and v >= 1 << 32 else v

    assert shape(host.launches[-1]) == shape(host.launches[-2])


def test_fnuz_is_refused_on_nvidia(host):
    inp = make_inputs(Problem(4, 40, 16, 64), seed=9, dtype=torch.float8_e4m3fnuz)
    with pytest.raises(TypeError, match=r"float8_e4m3fnuz.*sm_90"):
        op.fp8_mqa_logits_triton(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, True)


def _gluon_ready() -> str | None:
    return g._triton_version_reason() or g._GLUON_IMPORT_ERROR


@pytest.mark.skipif(_gluon_ready() is not None, reason=str(_gluon_ready()))
@pytest.mark.parametrize("config", [None, {"persistent": False}, {"split": "items"}, {"kernel": "triton"},
                                    {"dynamic": True, "filler": True}],
                         ids=["persistent", "ws", "today", "routed-to-triton", "dynamic"])
def test_gluon_direct_launch_matches_triton(host, config):
    # N and the row stride are specialised (== 1, % 16): they pick the binary too. Without a config the
    # shape rule picks one (here: the filler warp and a balanced split), with {"persistent": False} the
    # non-persistent kernel runs.
    for problem, seed in zip([Problem(128, 2048, 64, 128), Problem(37, 77, 32, 128), Problem(1, 300, 64, 128)],
                             (5, 6, 7)):
        for _name, q, k, ksc, w, ks, ke in _variants(problem, seed):
            _same_launches(host, lambda direct: g.fp8_mqa_logits_gluon(
                q, k, ksc, w, ks, ke, True, config=config, direct=direct), (q, k, ksc, w, ks, ke))


@pytest.mark.skipif(_gluon_ready() is not None, reason=str(_gluon_ready()))
def test_gluon_copies_only_what_needs_copying(host, monkeypatch: pytest.MonkeyPatch):
    prepared = []
    real = g._prepare
    monkeypatch.setattr(g, "_prepare", lambda *a: prepared.append(1) or real(*a))
    inp = make_inputs(Problem(16, 256, 64, 128), seed=8)
    for ksc in (inp.k_scale, inp.k_scale[:, None]):  # both k_scale shapes go in as they are
        g.fp8_mqa_logits_gluon(inp.q, inp.k, ksc, inp.weights, inp.ks, inp.ke, True)
    wide = torch.zeros(256, 160, dtype=torch.uint8).view(FN)[:, :128]
    g.fp8_mqa_logits_gluon(inp.q, wide, inp.k_scale, inp.weights, inp.ks, inp.ke, True)  # TMA takes the pitch
    assert not prepared
    g.fp8_mqa_logits_gluon(inp.q, inp.k, inp.k_scale, inp.weights.t().contiguous().t(), inp.ks, inp.ke, True)
    assert len(prepared) == 1


# ---- the prepared call (mqa-core's per-signature shortcut) ----------------------------------------

def _prepared_launches(drv, launcher, prepare, inputs) -> bool:
    """Triton's path, the bound launch, then the call ``prepare`` returns: the C launcher gets the same
    thing from each (pointers compared by what they point at, as in :func:`_same_launches`). Whether
    there was a prepared call (None where calls of the signature do not take the bound launch)."""
    seen = []
    for direct in (False, True, None):
        drv.labels.clear()
        drv.labels.update({t.data_ptr(): f"input {i}" for i, t in enumerate(inputs)})
        if direct is not None:
            ref = launcher(*inputs, True, direct=direct)
        else:
            prepared = prepare(*inputs, True)
            if prepared is None:
                return False
            before = len(drv.direct_calls)
            q, k, ksc, w, ks, ke = inputs
            out = prepared(q, (k, ksc), w, ks, ke)
            drv.labels[out.data_ptr()] = "out"
            assert len(drv.direct_calls) == before + 1, "the prepared call did not launch the bound kernel"
            assert out.shape == ref.shape and out.stride() == ref.stride()
        seen.append(_labelled(drv.launches[-1], drv.labels))
    assert seen[2] == seen[1] == seen[0], "the prepared call passes what Triton's launcher passes"
    return True


@pytest.mark.parametrize("config", [SMALL, SMALL_TMA, None], ids=["plain", "tma", "default"])
def test_triton_prepared_call_hands_the_launcher_what_the_other_paths_do(host, config):
    prepared = []
    for problem, seed in zip(PROBLEMS, (1, 2, 3)):
        for name, *inputs in _variants(problem, seed):
            if _prepared_launches(host, lambda *a, **k: op.fp8_mqa_logits_triton(*a, config=config, **k),
                                  lambda *a: op.prepare(*a, config=config), inputs):
                prepared.append(name)
    # operands that need a copy (int64 windows) take the launcher; the rest are prepared
    assert ("fresh" in prepared and "int64 windows" not in prepared) if DIRECT else not prepared


@pytest.mark.skipif(_gluon_ready() is not None, reason=str(_gluon_ready()))
def test_gluon_prepared_call_hands_the_launcher_what_the_other_paths_do(host):
    prepared = []
    for problem, seed in zip([Problem(128, 2048, 64, 128), Problem(37, 77, 32, 128)], (5, 6)):
        for name, *inputs in _variants(problem, seed):
            if _prepared_launches(host, g.fp8_mqa_logits_gluon, g.prepare, inputs):
                prepared.append(name)
    # a k pitch TMA cannot take, a transposed weights view, int64 windows: copies, so the launcher
    assert set(prepared) == ({"fresh", "same shapes, other tensors", "k row pitch d+32", "k_scale [N, 1]"}
                             if DIRECT else set())


def test_prepared_call_yields_to_hooks_and_is_none_where_not_bound(host, monkeypatch: pytest.MonkeyPatch):
    """With a launch hook set the prepared call launches through Triton's own path (which hands the
    hook every launch); under the interpreter, for a signature not bound yet, or an empty output,
    there is nothing to prepare. The kernel object prepares through its device's launcher."""
    from mqa_provider_gluon import kernels
    from triton import knobs

    if not DIRECT:
        pytest.skip(str(launch.direct_launch_unsupported()))
    inp = make_inputs(Problem(7, 50, 16, 64), seed=4)
    args = (inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)
    assert op.prepare(*args) is None  # nothing bound yet
    op.fp8_mqa_logits_triton(*args)
    prepared = kernels.TRITON.prepare_fp8_mqa_logits(*inp.args(), clean_logits=True)
    assert isinstance(prepared, op.PreparedCall)
    assert op.prepare(*args, False) is None  # another signature: clean_logits
    empty = make_inputs(Problem(7, 50, 16, 64), seed=4)
    assert op.prepare(empty.q[:0], *args[1:4], empty.ks[:0], empty.ke[:0]) is None
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        prepared(*inp.args())
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not host.direct_calls and len(host.launches) == 2 and host.launches[1][:5] == host.launches[0][:5]
    prepared(*inp.args())
    assert len(host.direct_calls) == 1
    # q 8 bytes past a 16-byte boundary: the same memo signature, another kernel specialisation, so
    # the prepared call takes the full launcher (which compiles for it and launches through Triton)
    q8 = torch.empty(inp.q.numel() + 8, dtype=torch.uint8)[8:].view(inp.q.dtype).view(inp.q.shape).copy_(inp.q)
    prepared(q8, *inp.args()[1:5])
    assert len(host.direct_calls) == 1 and len(host.launches) == 4 and host.launches[3][4] != host.launches[0][4]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert op.prepare(*args) is None


def test_prepared_call_takes_the_hints_its_prepare_takes(host):
    """mqa-core hands a prepared call the hints its ``prepare_<op>`` named: ``logits_dtype`` for bf16
    logits (the H200 kit's bf16 cases failed with a TypeError before the calls took it). The hint
    the signature fixed runs the bound launch; another dtype takes the full path, in that dtype."""
    import inspect

    from mqa_provider_gluon import kernels
    from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as pg
    from mqa_provider_gluon.ops import paged_mqa_logits_triton as pt

    for cls in (op.PreparedCall, g.PreparedCall, pt.PreparedCall, pg.PreparedCall):
        assert "logits_dtype" in inspect.signature(cls.__call__).parameters, cls
    if not DIRECT:
        pytest.skip(str(launch.direct_launch_unsupported()))
    inp = make_inputs(Problem(7, 50, 16, 64), seed=4)
    op.fp8_mqa_logits_triton(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, logits_dtype=torch.bfloat16)
    prepared = kernels.TRITON.prepare_fp8_mqa_logits(*inp.args(), clean_logits=True, logits_dtype=torch.bfloat16)
    assert isinstance(prepared, op.PreparedCall)
    out = prepared(*inp.args(), logits_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and len(host.direct_calls) == 1
    assert prepared(*inp.args(), logits_dtype=torch.float32).dtype == torch.float32
    assert len(host.direct_calls) == 1  # the float32 call took Triton's own path


# ---- the plans under the interpreter: cached decisions, identical results -----------------------

@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real = op._new_output
    monkeypatch.setattr(op, "_new_output", lambda *a: real(*a).fill_(float("nan")))


def test_cached_plans_give_what_fresh_plans_give(interpret):
    """A sequence whose pointers, sizes, strides and dtypes change: each call, made with the plans
    the earlier calls left, equals the same call made with none, and the float64 oracle."""
    for problem, seed in zip([Problem(13, 70, 16, 64), Problem(6, 33, 32, 128)], (11, 12)):
        for name, q, k, ksc, w, ks, ke in _variants(problem, seed):
            cached = op.fp8_mqa_logits_triton(q, k, ksc, w, ks, ke, True, config=SMALL)
            saved = dict(op._PLANS)
            op.clear_caches()
            fresh = op.fp8_mqa_logits_triton(q, k, ksc, w, ks, ke, True, config=SMALL)
            op._PLANS.update(saved)
            assert torch.equal(cached, fresh), name
            ref = fp8_mqa_logits_ref(q, k, ksc.reshape(-1), w, ks, ke)
            inside = torch.isfinite(ref)
            assert not cached[inside].isnan().any(), name
            assert calc_diff(cached[inside], ref[inside]) < 1e-6, name
            assert torch.equal(torch.isneginf(cached), ~inside), name


# ---- on an NVIDIA GPU: the bound launch computes what triton's launch computes ------------------

def _gpu_inputs(m: int, n: int, h: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(m, h, 128, device="cuda", generator=gen).to(FN)
    k = torch.randn(n, 128, device="cuda", generator=gen).to(FN)
    ksc = torch.rand(n, device="cuda", generator=gen) + 0.25
    w = torch.randn(m, h, device="cuda", generator=gen) * h**-0.5
    ks = torch.randint(-5, n // 2 + 1, (m,), device="cuda", generator=gen).to(torch.int32)
    ke = (ks + torch.randint(0, n, (m,), device="cuda", generator=gen)).to(torch.int32)
    return q, k, ksc, w, ks, ke


def _poisoned(fn, m: int, n: int, row: int):
    torch.empty(m * row, device="cuda").fill_(float("nan"))  # the block the next output reuses
    return fn()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("which", ["triton", "gluon"])
def test_gpu_direct_equals_triton_launch(which):
    if which == "gluon" and g.gluon_supported() is not None:
        pytest.skip(str(g.gluon_supported()))
    fn = op.fp8_mqa_logits_triton if which == "triton" else g.fp8_mqa_logits_gluon
    for m, n, h, seed in [(128, 2048, 64, 1), (128, 2048, 64, 2), (37, 333, 32, 3), (1, 4096, 64, 4),
                          (300, 1000, 64, 5)]:
        q, k, ksc, w, ks, ke = _gpu_inputs(m, n, h, seed)
        wide = torch.zeros(n, 160, dtype=torch.uint8, device="cuda").view(FN)[:, :128]
        wide.copy_(k)
        for kk, kscale in ((k, ksc), (wide, ksc[:, None])):
            row = -(-n // 16) * 16
            outs = [_poisoned(lambda: fn(q, kk, kscale, w, ks, ke, True, direct=d), m, n, row)
                    for d in (False, True, True, True)]
            torch.cuda.synchronize()
            for out in outs[1:]:
                assert torch.equal(out, outs[0])
            ref = fp8_mqa_logits_ref(q, k, ksc, w, ks, ke)
            inside = torch.isfinite(ref)
            assert torch.equal(torch.isneginf(outs[-1]), ~inside)
            assert calc_diff(outs[-1][inside], ref[inside]) < 1e-3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("which", ["triton", "gluon"])
def test_gpu_direct_launch_in_a_cuda_graph(which):
    """Captured after warm-up (the bound path), replayed on new data in the same buffers."""
    if which == "gluon" and g.gluon_supported() is not None:
        pytest.skip(str(g.gluon_supported()))
    fn = op.fp8_mqa_logits_triton if which == "triton" else g.fp8_mqa_logits_gluon
    q, k, ksc, w, ks, ke = _gpu_inputs(64, 1024, 64, 7)
    for _ in range(3):
        fn(q, k, ksc, w, ks, ke, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, k, ksc, w, ks, ke, True)
    q2, k2, ksc2, w2, ks2, ke2 = _gpu_inputs(64, 1024, 64, 8)
    for dst, src in zip((q, k, ksc, w, ks, ke), (q2, k2, ksc2, w2, ks2, ke2)):
        dst.copy_(src)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fn(q2, k2, ksc2, w2, ks2, ke2, True, direct=False))
