"""The result check: what a provider's kernel returns is checked against the op's contract on every
call (type, shape, dtype, device, layout) and, with MQA_VALIDATE=full, for non-finite values inside
the windows; a mismatch names the provider and its distribution. Real temp-installed providers."""

import re
import textwrap

import pytest
import torch

import mqa_core
from mqa_core.testing import make_inputs, make_paged_inputs

PROBLEM = mqa_core.Problem(6, 40, 4, 64)

# Each kernel body computes the right answer with torch_ref (``out``), then spoils it one way.
WRONG = {
    "list": ("out.tolist()", "got builtins.list"),
    "tuple of tensor": ("(out,)", "got builtins.tuple"),
    "numpy": ("out.numpy()", "got numpy.ndarray"),
    "shape": ("out[:, :-1]", "shape [6, 39] (expected [6, 40])"),
    "transposed shape": ("out.T.contiguous()", "shape [40, 6] (expected [6, 40])"),
    "1-D": ("out.reshape(-1)", "shape [240] (expected [6, 40])"),
    "dtype": ("out.half()", "dtype float16 (expected float32)"),
    "float64": ("out.double()", "dtype float64 (expected float32)"),
    "device": ("torch.empty(out.shape, device='meta')", "device meta (expected cpu, q's)"),
    "last dim strided": ("out.T.contiguous().T", "last dim not contiguous"),
    "overlapping rows": ("torch.as_strided(out, out.shape, (1, 1))", "rows overlap (row stride < 40)"),
}


def plugin(body, paged_body="return out"):
    return textwrap.dedent(f"""
        import torch
        from mqa_core import ProviderSpec, hookimpl
        from mqa_provider_torch_ref.kernels import KERNELS as REF

        class Kernels:
            def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
                out = REF.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean_logits)
                return {body}

            def fp8_paged_mqa_logits(self, q, kv_cache, weights, lens, tables, max_len, *, clean_logits=True):
                out = REF.fp8_paged_mqa_logits(q, kv_cache, weights, lens, tables, max_len, clean_logits=clean_logits)
                {paged_body}

        KERNELS = Kernels()

        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name="wrong", ops={{"fp8_mqa_logits", "fp8_paged_mqa_logits"}}, archs={{"cpu"}},
                                 dtypes={{"float8_e4m3fn"}}, priority=500, load="wrong_plugin:KERNELS")]
        """)


def install(install_dist, body, paged_body="return out"):
    install_dist("wrong-dist", "3.1", {"wrong_plugin.py": plugin(body, paged_body)},
                 {"mqa_core.providers": {"wrong": "wrong_plugin"}})


@pytest.mark.parametrize("kind", WRONG, ids=list(WRONG))
def test_each_kind_of_wrong_result_is_refused_naming_the_provider(install_dist, kind):
    body, words = WRONG[kind]
    install(install_dist, body)
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    head = "provider wrong (wrong-dist==3.1) returned a wrong result from fp8_mqa_logits: expected a float32"
    for call in (lambda: mqa_core.fp8_mqa_logits(*inp.args()),
                 lambda: mqa_core.get_provider("cpu").fp8_mqa_logits(*inp.args())):
        with pytest.raises(mqa_core.ProviderResultError) as err:
            call()
        assert str(err.value).startswith(head) and words in str(err.value), str(err.value)
        assert (err.value.provider, err.value.distribution) == ("wrong", "wrong-dist")


def test_torch_ops_path_checks_too(install_dist):
    from mqa_core import torch_ops  # noqa: F401

    install(install_dist, "out.half()")
    inp = make_inputs(PROBLEM, seed=2)
    with pytest.raises(mqa_core.ProviderResultError, match="dtype float16"):
        torch.ops.mqa.fp8_mqa_logits(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke)


@pytest.mark.parametrize("body", [
    "torch.as_strided(torch.nn.functional.pad(out, (0, 24)), out.shape, (64, 1))",  # padded rows
    "out[:, :]",
])
def test_right_results_in_allowed_layouts_pass(install_dist, body):
    install(install_dist, body)
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    out = mqa_core.fp8_mqa_logits(*inp.args())
    torch.testing.assert_close(out.double(), inp.reference(), rtol=1e-5, atol=1e-5, equal_nan=False)


def test_degenerate_shapes_pass():
    for p in (mqa_core.Problem(0, 7, 4, 64), mqa_core.Problem(3, 0, 4, 64), mqa_core.Problem(1, 1, 4, 64)):
        assert mqa_core.fp8_mqa_logits(*make_inputs(p).args()).shape == (p.m, p.n)


def first_inside(inp):
    ks, ke = inp.ks.clamp(min=0), inp.ke.clamp(max=inp.k.shape[0])
    m = int(torch.nonzero(ke > ks)[0])
    return m, int(ks[m])


@pytest.mark.parametrize("value, words", [("float('nan')", "non-finite value(s) inside the windows"),
                                           ("float('inf')", "non-finite value(s) inside the windows"),
                                           ("float('-inf')", "non-finite value(s) inside the windows")])
def test_full_validation_finds_non_finite_values_inside_windows(install_dist, monkeypatch, value, words):
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    m, n = first_inside(inp)
    install(install_dist, f"out.index_put_((torch.tensor([{m}]), torch.tensor([{n}])), torch.tensor({value}))")
    mqa_core.fp8_mqa_logits(*inp.args())  # the cheap check does not look at values
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    with pytest.raises(mqa_core.ProviderResultError, match=rf"{re.escape(words)}.*first at \[{m}, {n}\]"):
        mqa_core.fp8_mqa_logits(*inp.args())


def test_full_validation_wants_minus_inf_outside_windows_when_clean(install_dist, monkeypatch):
    install(install_dist, "torch.where(torch.isinf(out), torch.zeros_like(out), out)")
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    with pytest.raises(mqa_core.ProviderResultError, match="outside the windows are not -inf"):
        mqa_core.fp8_mqa_logits(*inp.args())
    out = mqa_core.fp8_mqa_logits(*inp.args(), clean_logits=False)  # unspecified outside: accepted
    assert out.shape == (6, 40)


def test_full_validation_accepts_torch_ref(monkeypatch):
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    for window in ("ragged", "causal", "full"):
        inp = make_inputs(PROBLEM, window=window, seed=5)
        mqa_core.fp8_mqa_logits(*inp.args())
    pinp = make_paged_inputs(2, 2, 4, 64, 100, block_size=16)
    mqa_core.fp8_paged_mqa_logits(*pinp.args())


def test_paged_results_are_checked(install_dist, monkeypatch):
    install(install_dist, "out", paged_body="return out[:, 1:]")
    pinp = make_paged_inputs(2, 2, 4, 64, 100, block_size=16)
    with pytest.raises(mqa_core.ProviderResultError,
                       match=r"from fp8_paged_mqa_logits: .*shape \[4, 99\] \(expected \[4, 100\]\)"):
        mqa_core.fp8_paged_mqa_logits(*pinp.args())


def test_paged_full_validation_finds_nan(install_dist, monkeypatch):
    install(install_dist, "out", paged_body="out[0, 0] = float('nan')\n                return out")
    pinp = make_paged_inputs(2, 2, 4, 64, 100, block_size=16)
    mqa_core.fp8_paged_mqa_logits(*pinp.args())
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    with pytest.raises(mqa_core.ProviderResultError, match=r"fp8_paged_mqa_logits: 1 non-finite .*\[0, 0\]"):
        mqa_core.fp8_paged_mqa_logits(*pinp.args())


# -- trust: a result is exactly torch.Tensor and memory of its own (issue 37) ---------------------

SUBCLASS = """
class Liar(torch.Tensor):
    @property
    def shape(self):  # lies: the contract's shape, whatever it holds
        return torch.Size((6, 40))
"""


@pytest.mark.parametrize("body", ["out.as_subclass(Liar)", "torch.nn.Parameter(out, requires_grad=False)",
                                  "out[:, :3].as_subclass(Liar)"])
def test_a_tensor_subclass_is_refused_even_when_it_looks_right(install_dist, body):
    install_dist("wrong-dist", "3.1", {"wrong_plugin.py": plugin(body) + textwrap.dedent(SUBCLASS)},
                 {"mqa_core.providers": {"wrong": "wrong_plugin"}})
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    for call in (lambda: mqa_core.fp8_mqa_logits(*inp.args()),
                 lambda: mqa_core.get_provider("cpu").fp8_mqa_logits(*inp.args())):
        for _ in range(3):  # the first call and the remembered signature's
            with pytest.raises(mqa_core.ProviderResultError, match="a subclass of it, .*exactly torch.Tensor"):
                call()


ALIASING = """
import torch
from mqa_core import ProviderSpec, hookimpl
from mqa_provider_torch_ref.kernels import KERNELS as REF


def _into(buffer, out):
    # the result written over the caller's buffer, and handed back as a view of it
    view = torch.empty(0, dtype=torch.float32, device=out.device)
    view.set_(buffer.untyped_storage(), buffer.storage_offset() * buffer.element_size() // 4, out.shape,
              (out.shape[1], 1))
    return view.copy_(out)


class Kernels:
    def __init__(self):
        self.calls = {"mqa": 0, "paged": 0}

    def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
        self.calls["mqa"] += 1
        out = REF.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean_logits)
        return _into(q, out) if self.calls["mqa"] > FRESH else out

    def fp8_paged_mqa_logits(self, q, kv_cache, weights, lens, tables, max_len, *, clean_logits=True):
        self.calls["paged"] += 1
        out = REF.fp8_paged_mqa_logits(q, kv_cache, weights, lens, tables, max_len, clean_logits=clean_logits)
        return _into(kv_cache, out) if self.calls["paged"] > FRESH else out


KERNELS = Kernels()


@hookimpl
def mqa_providers():
    return [ProviderSpec(name="wrong", ops={"fp8_mqa_logits", "fp8_paged_mqa_logits"}, archs={"cpu"},
                         dtypes={"float8_e4m3fn"}, priority=500, load="wrong_plugin:KERNELS")]
"""


@pytest.mark.parametrize("fresh", [0, 2], ids=["first call", "remembered signature"])
@pytest.mark.parametrize("level", ["api", "provider", "torch.ops"])
def test_an_output_in_an_inputs_memory_is_refused(install_dist, fresh, level):
    """A kernel that writes its result into an input's memory and returns a view of it, from the first
    call on, or only once the signature is remembered (the fast path checks too)."""
    from mqa_core import torch_ops  # noqa: F401

    install_dist("wrong-dist", "3.1", {"wrong_plugin.py": f"FRESH = {fresh}\n" + ALIASING},
                 {"mqa_core.providers": {"wrong": "wrong_plugin"}})
    inp = make_inputs(PROBLEM, window="ragged", seed=2)
    pinp = make_paged_inputs(2, 2, 4, 64, 100, block_size=16)
    if level == "api":
        calls = (lambda: mqa_core.fp8_mqa_logits(*inp.args()), lambda: mqa_core.fp8_paged_mqa_logits(*pinp.args()))
    elif level == "provider":
        calls = (lambda: mqa_core.get_provider("cpu").fp8_mqa_logits(*inp.args()),
                 lambda: mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits").fp8_paged_mqa_logits(*pinp.args()))
    else:
        calls = (lambda: torch.ops.mqa.fp8_mqa_logits(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke),
                 lambda: torch.ops.mqa.fp8_paged_mqa_logits(*pinp.args()))
    for call, name in zip(calls, ("q", "kv_cache")):
        for _ in range(fresh):
            call()
        with pytest.raises(mqa_core.ProviderResultError, match=f"the output overlaps input {name} in memory"):
            call()


def test_outputs_next_to_inputs_in_one_buffer_pass():
    """Disjoint is disjoint: an input and the output may share a storage without overlapping."""
    from mqa_core.memo import MQA, output_check
    from mqa_core.result import overlap

    pool = torch.zeros(1000)
    a, b, out = pool[:100], pool[900:], pool[100:900].view(20, 40)
    assert overlap(out, (a, b)) is None and overlap(out, (a, pool[899:901])) == 1
    assert overlap(out, (torch.empty(0),)) is None and overlap(out[:0], (pool,)) is None
    check = output_check(out, (a, b))
    assert check is not None and check(out, (a, b)) and not check(out, (a, pool[899:999]))
    assert MQA.tensors((1, (2, 3), 4, 5, 6)) == (1, 2, 3, 4, 5, 6, None)  # no q_sf: fp8
