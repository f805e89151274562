"""bfloat16 logits (``logits_dtype=torch.bfloat16``): the public ops, a bound provider, torch.ops.mqa and
torch_ref; a kernel that writes bf16 itself and one whose float32 result the core rounds."""

from __future__ import annotations

import pytest
import torch

import mqa_core
from mqa_core.provider import Provider
from mqa_core.spec import Problem
from mqa_core.testing.data import make_inputs, make_paged_inputs

OPS = ["fp8_mqa_logits", "fp8_paged_mqa_logits"]

def logits_only(spec):
    """``spec`` declaring only the logits ops: the stand-in kernels here implement no top-k op."""
    from dataclasses import replace

    from mqa_core.spec import LOGITS_OPS

    return replace(spec, ops=spec.ops & set(LOGITS_OPS))



def inputs(op: str, seed: int = 3):
    if op == "fp8_paged_mqa_logits":
        return make_paged_inputs(3, 2, 4, 64, 100, block_size=16, seed=seed)
    return make_inputs(Problem(9, 70, 4, 64), window="ragged", seed=seed)


class Float32Only:
    """A kernel object that knows nothing of logits_dtype (every provider written before it), with a
    prepared call per signature; counts what it serves."""

    def __init__(self, inner) -> None:
        self.inner, self.served, self.prepared = inner, 0, 0

    def fp8_mqa_logits(self, *a, clean_logits=True):
        self.served += 1
        return self.inner.fp8_mqa_logits(*a, clean_logits=clean_logits)

    def fp8_paged_mqa_logits(self, *a, clean_logits=True):
        self.served += 1
        return self.inner.fp8_paged_mqa_logits(*a, clean_logits=clean_logits)

    def _prepare(self, op, args, clean_logits):
        self.prepared += 1
        scalars = args[5:]

        def call(*tensors):
            self.served += 1
            return getattr(self.inner, op)(*tensors, *scalars, clean_logits=clean_logits)
        return call

    def prepare_fp8_mqa_logits(self, *args, clean_logits):
        return self._prepare("fp8_mqa_logits", args, clean_logits)

    def prepare_fp8_paged_mqa_logits(self, *args, clean_logits):
        return self._prepare("fp8_paged_mqa_logits", args, clean_logits)


class IgnoresDtype(Float32Only):
    """Names logits_dtype (so the core trusts it to write bf16) but returns float32 anyway."""

    def fp8_mqa_logits(self, *a, clean_logits=True, logits_dtype=None):
        return super().fp8_mqa_logits(*a, clean_logits=clean_logits)

    def fp8_paged_mqa_logits(self, *a, clean_logits=True, logits_dtype=None):
        return super().fp8_paged_mqa_logits(*a, clean_logits=clean_logits)


@pytest.mark.parametrize("op", OPS)
def test_public_op_rounds_the_float32_logits_once(op):
    """bf16 logits are the float32 ones rounded to nearest even: -inf exact, same shape, same cells."""
    x = inputs(op)
    fn = getattr(mqa_core, op)
    f32 = fn(*x.args())
    explicit = fn(*x.args(), logits_dtype=torch.float32)
    bf16 = fn(*x.args(), logits_dtype=torch.bfloat16)
    again = fn(*x.args(), logits_dtype="bfloat16")
    assert f32.dtype == explicit.dtype == torch.float32 and torch.equal(f32, explicit)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == f32.shape
    assert torch.equal(bf16, f32.to(torch.bfloat16)) and torch.equal(bf16, again)
    assert torch.equal(torch.isneginf(bf16), torch.isneginf(f32)) and bool(torch.isneginf(f32).any())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [torch.float16, torch.float64, "half", 3])
def test_other_logits_dtypes_are_refused_by_name(op, bad):
    x = inputs(op)
    with pytest.raises(TypeError, match=rf"{op}: logits_dtype must be torch.float32 or torch.bfloat16"):
        getattr(mqa_core, op)(*x.args(), logits_dtype=bad)
    with pytest.raises(TypeError, match="logits_dtype"):
        getattr(mqa_core.get_provider("cpu", op=op), op)(*x.args(), logits_dtype=bad)


@pytest.mark.parametrize("op", OPS)
def test_a_float32_kernel_is_rounded_by_the_core_prepared_or_not(op):
    """A kernel whose op function does not name logits_dtype serves bf16 calls too: its float32
    result passes the float32 check and is rounded; its prepared call serves later calls the same way."""
    base = mqa_core.get_provider("cpu", op=op)
    kernel = Float32Only(base.impl)
    p = Provider(logits_only(base.spec), kernel)
    x = inputs(op)
    want = getattr(base, op)(*x.args()).to(torch.bfloat16)
    outs = [getattr(p, op)(*x.args(), logits_dtype=torch.bfloat16) for _ in range(3)]
    assert all(o.dtype == torch.bfloat16 and torch.equal(o, want) for o in outs)
    assert kernel.served == 3 and kernel.prepared == 1
    f32 = getattr(p, op)(*x.args())  # the float32 variant keeps its own table
    assert f32.dtype == torch.float32 and kernel.prepared == 2


@pytest.mark.parametrize("op", OPS)
def test_a_kernel_that_names_logits_dtype_must_return_it(op):
    base = mqa_core.get_provider("cpu", op=op)
    p = Provider(logits_only(base.spec), IgnoresDtype(base.impl))
    x = inputs(op)
    with pytest.raises(mqa_core.ProviderResultError, match=r"dtype float32 \(expected bfloat16\)"):
        getattr(p, op)(*x.args(), logits_dtype=torch.bfloat16)


@pytest.mark.parametrize("op", OPS)
def test_full_validation_checks_bf16_values(op, monkeypatch):
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    x = inputs(op)
    out = getattr(mqa_core, op)(*x.args(), logits_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16


def test_torch_ops_take_logits_dtype():
    import mqa_core.torch_ops  # noqa: F401

    x = inputs("fp8_mqa_logits")
    out = torch.ops.mqa.fp8_mqa_logits(x.q, x.k, x.k_scale, x.weights, x.ks, x.ke, logits_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, mqa_core.fp8_mqa_logits(*x.args()).to(torch.bfloat16))
    y = inputs("fp8_paged_mqa_logits")
    out = torch.ops.mqa.fp8_paged_mqa_logits(*y.args(), logits_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.mqa.fp8_paged_mqa_logits(*(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                                                    for t in y.args()), logits_dtype=torch.bfloat16)
    assert fake.dtype == torch.bfloat16


def test_compiled_op_keeps_bf16():
    import mqa_core.torch_ops  # noqa: F401

    x = inputs("fp8_mqa_logits")

    def f(q, k, s, w, ks, ke):
        return torch.ops.mqa.fp8_mqa_logits(q, k, s, w, ks, ke, logits_dtype=torch.bfloat16) * 1

    out = torch.compile(f, fullgraph=True, backend="eager")(x.q, x.k, x.k_scale, x.weights, x.ks, x.ke)
    assert out.dtype == torch.bfloat16
