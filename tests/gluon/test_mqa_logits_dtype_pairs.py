"""(q, k) fp8 dtype pairs: what the gluon/triton specs declare per arch is what the Triton launcher
serves, each pair checked against the float64 oracle in Triton's interpreter, with an fnuz MMA
(gfx942) faked: operands already in the kernel's format reach it untouched, an e4m3fn one is
relabelled once, and a pair an arch does not serve is refused by name."""

from __future__ import annotations

import itertools

import pytest
import torch

from mqa_core.spec import DTYPES, Problem
from mqa_core.testing import calc_diff, make_inputs

triton = pytest.importorskip("triton")

import mqa_provider_gluon as provider  # noqa: E402
from mqa_provider_gluon import fp8, kernels  # noqa: E402
from mqa_provider_gluon.ops import mqa_logits_triton as op  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_triton import TritonConfig  # noqa: E402

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
SMALL = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2)
PAIRS = list(itertools.product((FN, FNUZ), repeat=2))
pytestmark = pytest.mark.usefixtures("fresh_plans")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[torch.dtype, int], ...]]:
    """Interpreter, poisoned outputs, and a record of the (dtype, data pointer) of q and k as the
    kernel receives them, one entry per launch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real_out = op._new_output
    monkeypatch.setattr(op, "_new_output", lambda *a: real_out(*a).fill_(float("nan")))
    seen: list[tuple[tuple[torch.dtype, int], ...]] = []
    real_kernel = op.kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(((args[0].dtype, args[0].data_ptr()), (args[1].dtype, args[1].data_ptr())))
                return real_kernel(True)[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(op, "kernel", lambda interpret=None: Recording())
    return seen


def _inputs(q_dtype: torch.dtype, k_dtype: torch.dtype, seed: int = 7):
    problem = Problem(11, 50, 16, 64)
    a = make_inputs(problem, window="ragged", seed=seed, dtype=q_dtype)
    b = make_inputs(problem, window="ragged", seed=seed + 100, dtype=k_dtype)
    return a.q, b.k, a.k_scale, a.weights, a.ks, a.ke


def _check(out: torch.Tensor, q, k, k_scale, weights, ks, ke) -> None:
    from mqa_core.reference import fp8_mqa_logits_ref

    ref = fp8_mqa_logits_ref(q, k, k_scale, weights, ks, ke)
    inside = torch.isfinite(ref)
    assert not out[inside].isnan().any()
    assert calc_diff(out[inside], ref[inside]) < 1e-6
    assert torch.equal(torch.isneginf(out), ~inside)


def test_declared_pairs_are_exactly_what_the_launcher_serves():
    for arch in provider.ARCHS:
        declared = provider.DTYPE_PAIRS[arch]
        assert declared <= set(itertools.product(DTYPES, repeat=2))
        for q, k in PAIRS:
            if (_name(q), _name(k)) in declared:
                fp8.conversions(arch, q, k)
            else:
                with pytest.raises(TypeError, match=rf"{_name(q)}, {_name(k)}.*{arch}"):
                    fp8.conversions(arch, q, k)
    for arch in ("sm_90", "sm_100", "gfx950"):  # no exact e4m3fnuz relabelling on an OCP MMA
        assert provider.DTYPE_PAIRS[arch] == {("float8_e4m3fn", "float8_e4m3fn")}
    assert fp8.conversions("gfx942", FNUZ, FNUZ) == (False, False)
    assert fp8.conversions("gfx942", FN, FNUZ) == (True, False)  # only q, the small operand
    assert fp8.conversions("gfx942", FN, FN) == (True, True)
    assert all(fp8.conversions("cpu", q, k) == (False, False) for q, k in PAIRS)
    assert fp8.served_pairs("sm_120") == {("float8_e4m3fn", "float8_e4m3fn")}


@pytest.mark.parametrize("q_dtype,k_dtype", PAIRS, ids=lambda d: _name(d)[8:])
def test_interpreter_computes_every_pair_as_it_is(interpret, monkeypatch, q_dtype, k_dtype):
    monkeypatch.setattr(op, "e4m3fn_to_e4m3fnuz", lambda *a: pytest.fail("converted on the CPU"))
    args = _inputs(q_dtype, k_dtype)
    out = op.fp8_mqa_logits_triton(*args, True, config=SMALL)
    _check(out, *args)
    assert interpret == [((q_dtype, args[0].data_ptr()), (k_dtype, args[1].data_ptr()))]


@pytest.mark.parametrize("q_dtype,k_dtype,converted", [(FNUZ, FNUZ, 0), (FN, FNUZ, 1), (FN, FN, 2)],
                         ids=["fnuz-fnuz", "fn-fnuz", "fn-fn"])
def test_gfx942_relabels_only_e4m3fn_operands(interpret, monkeypatch, q_dtype, k_dtype, converted):
    monkeypatch.setattr(op, "_device_facts", lambda index: ("gfx942", 1))
    calls = []
    real = op.e4m3fn_to_e4m3fnuz
    monkeypatch.setattr(op, "e4m3fn_to_e4m3fnuz", lambda x, s: calls.append(x.data_ptr()) or real(x, s))
    args = _inputs(q_dtype, k_dtype)
    for _ in range(2):  # the second call runs the cached plan: still one conversion per operand
        out = op.fp8_mqa_logits_triton(*args, True, config=SMALL)
        _check(out, *args)
    assert len(calls) == 2 * converted
    (q_seen, q_ptr), (k_seen, k_ptr) = interpret[-1]
    assert q_seen == k_seen == FNUZ  # the MFMA's format for both operands
    if q_dtype == FNUZ:
        assert q_ptr == args[0].data_ptr()  # passed through untouched
    if k_dtype == FNUZ:
        assert k_ptr == args[1].data_ptr()
    # the relabelling is exact: the same logits as the interpreter computing the pair natively
    monkeypatch.setattr(op, "_device_facts", lambda index: ("cpu", 1))
    op.clear_caches()
    assert torch.equal(out, op.fp8_mqa_logits_triton(*args, True, config=SMALL))


def test_gfx942_refuses_fnuz_q_with_fn_k(interpret, monkeypatch):
    monkeypatch.setattr(op, "_device_facts", lambda index: ("gfx942", 1))
    with pytest.raises(TypeError, match=r"float8_e4m3fnuz, float8_e4m3fn\).*gfx942"):
        op.fp8_mqa_logits_triton(*_inputs(FNUZ, FN), True, config=SMALL)
    assert not interpret


@pytest.mark.parametrize("obj", [kernels.TRITON, kernels.GLUON], ids=["triton", "gluon"])
def test_kernel_object_serves_the_mixed_pair(interpret, obj):
    q, k, k_scale, w, ks, ke = _inputs(FN, FNUZ)
    out = obj.fp8_mqa_logits(q, (k, k_scale[:, None]), w, ks, ke, clean_logits=True)
    _check(out, q, k, k_scale, w, ks, ke)


# ---- the spec: declares exactly the pairs the launcher serves -----------------------------------

def test_spec_declares_the_launcher_pairs():
    for spec in provider.SPECS:
        for arch, pairs in provider.DTYPE_PAIRS.items():
            assert spec.pairs_for(arch) == pairs
