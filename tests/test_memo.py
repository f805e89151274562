"""The per-call memory (mqa_core.memo): a repeated call signature skips the argument checks and the
choice of provider; a call whose signature differs in any way (strides, dtypes, devices, the clean
flag, scalar types) is judged afresh and ends exactly as it would with nothing remembered; reload()
forgets everything; MQA_VALIDATE=full checks every call, values included. Paged problems carry
next_n and block_size, and tuning and shape limits use them."""

from __future__ import annotations

import warnings

import pytest
import torch

import mqa_core
from mqa_core import Problem, memo, registry, validate
from mqa_core.testing import calc_diff, make_inputs, make_paged_inputs
from mqa_core.tuning import Bucket, Entry, TuningTable, current_stamp, key_of

PROBLEM = Problem(6, 40, 4, 64)


@pytest.fixture
def checks(monkeypatch):
    """How many times each op's argument checks ran."""
    count = {"mqa": 0, "paged": 0}
    real_mqa, real_paged = validate.mqa_logits_args, validate.paged_mqa_logits_args

    def mqa(*a, **k):
        count["mqa"] += 1
        return real_mqa(*a, **k)

    def paged(*a, **k):
        count["paged"] += 1
        return real_paged(*a, **k)

    monkeypatch.setattr(validate, "mqa_logits_args", mqa)
    monkeypatch.setattr(validate, "paged_mqa_logits_args", paged)
    return count


def outcome(fn):
    """What a call ends with: its exception's type and message, or the result's shape and values."""
    try:
        out = fn()
    except Exception as exc:
        return type(exc), str(exc)
    return "ok", tuple(out.shape), out.double().nan_to_num(neginf=-1e300).sum().item()


def judged_afresh(call, change, checks, op):
    """``call(**change)`` ends as it does with nothing remembered, after a good call was remembered:
    checked once more (a signature not seen yet), while the good call stays remembered."""
    unremembered = outcome(lambda: call(**change))
    mqa_core.reload()
    good = outcome(call)
    assert good[0] == "ok" and outcome(call) == good
    before = checks[op]
    assert outcome(lambda: call(**change)) == unremembered
    assert checks[op] == before + 1, "a signature not seen yet is checked"
    assert outcome(call) == good and checks[op] == before + 1, "the good one is still remembered"


@pytest.fixture
def x():
    return make_inputs(PROBLEM, window="ragged", seed=3)


def prefill(x, **change):
    a = {"q": x.q, "kv": (x.k, x.k_scale), "weights": x.weights, "ks": x.ks, "ke": x.ke, "clean_logits": True}
    a.update(change)
    return a


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values and shape with other strides: the last dim of a wider buffer."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def _moved(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A copy of ``t`` whose start address is ``nbytes`` past a 64-byte aligned one (a residue modulo
    16 that the checks accept and compiled kernels specialise on)."""
    step = nbytes // t.element_size()
    buf = torch.empty(t.numel() + step, dtype=t.dtype)
    assert buf.data_ptr() % 64 == 0
    return buf[step:].view(t.shape).copy_(t)


PREFILL_VARIANTS = {
    "k strided": lambda x: {"kv": (_strided(x.k), x.k_scale)},
    "q other strides": lambda x: {"q": x.q.transpose(0, 1).contiguous().transpose(0, 1)},
    "k_scale [N, 1]": lambda x: {"kv": (x.k, x.k_scale[:, None])},
    "kv a list": lambda x: {"kv": [x.k, x.k_scale]},
    "kv of three": lambda x: {"kv": (x.k, x.k_scale, x.k_scale)},
    "weights float64": lambda x: {"weights": x.weights.double()},
    "q fnuz": lambda x: {"q": x.q.view(torch.uint8).view(torch.float8_e4m3fnuz)},
    "k_scale another dtype": lambda x: {"kv": (x.k, x.k_scale.view(torch.int32))},
    "ke on meta": lambda x: {"ke": x.ke.to("meta")},
    "all on meta": lambda x: {k: v.to("meta") if isinstance(v, torch.Tensor) else
                              tuple(t.to("meta") for t in v) if isinstance(v, tuple) else v
                              for k, v in prefill(x).items()},
    "clean False": lambda x: {"clean_logits": False},
    "clean 1": lambda x: {"clean_logits": 1},
    "clean None": lambda x: {"clean_logits": None},
    "q a list": lambda x: {"q": [1, 2]},
    "q subclass": lambda x: {"q": torch.nn.Parameter(x.q, requires_grad=False)},
}


@pytest.mark.parametrize("variant", PREFILL_VARIANTS, ids=list(PREFILL_VARIANTS))
@pytest.mark.parametrize("level", ["api", "provider"])
def test_prefill_signature_that_differs_is_judged_afresh_with_the_same_result(x, checks, variant, level):
    def call(**change):
        a = prefill(x, **change)
        fn = mqa_core.fp8_mqa_logits if level == "api" else mqa_core.get_provider("cpu").fp8_mqa_logits
        return fn(a["q"], a["kv"], a["weights"], a["ks"], a["ke"], clean_logits=a["clean_logits"])

    judged_afresh(call, PREFILL_VARIANTS[variant](x), checks, "mqa")


def test_a_repeated_call_is_checked_once_and_chooses_once(x, checks, monkeypatch):
    chosen = []
    real = registry.provider_for

    def spy(*a, **k):
        chosen.append(a[:3])
        return real(*a, **k)

    monkeypatch.setattr(registry, "provider_for", spy)
    outs = [mqa_core.fp8_mqa_logits(*x.args()) for _ in range(5)]
    assert checks["mqa"] == 1 and len(chosen) == 1
    assert all(torch.equal(o, outs[0]) for o in outs) and calc_diff(outs[0], x.reference()) < 1e-9
    p = mqa_core.get_provider("cpu")
    for _ in range(3):
        p.fp8_mqa_logits(*x.args())
    assert checks["mqa"] == 2  # the bound provider remembers on its own (it also checks its arch and pairs)


def test_reload_forgets_every_signature(x, checks):
    mqa_core.fp8_mqa_logits(*x.args())
    p = mqa_core.get_provider("cpu")
    p.fp8_mqa_logits(*x.args())
    s = registry.state()
    assert len(s.mqa_calls) == 1 and len(p._passed_mqa) == 1
    mqa_core.reload()
    fresh = registry.state()
    assert fresh is not s and fresh.mqa_calls == {} and fresh.paged_calls == {}
    assert mqa_core.get_provider("cpu") is not p and mqa_core.get_provider("cpu")._passed_mqa == {}
    before = checks["mqa"]
    mqa_core.fp8_mqa_logits(*x.args())
    assert checks["mqa"] == before + 1


def test_reload_with_another_forced_provider_is_obeyed_for_a_remembered_signature(x, monkeypatch):
    mqa_core.fp8_mqa_logits(*x.args())
    assert {e[1].name for e in registry.state().mqa_calls.values()} == {"torch_ref"}
    monkeypatch.setenv("MQA_PROVIDER", "example_chunked")
    mqa_core.fp8_mqa_logits(*x.args())  # not reloaded: settings are read once
    assert {e[1].name for e in registry.state().mqa_calls.values()} == {"torch_ref"}
    mqa_core.reload()
    mqa_core.fp8_mqa_logits(*x.args())
    assert {e[1].name for e in registry.state().mqa_calls.values()} == {"example_chunked"}


def test_full_validation_checks_every_call_and_its_values(x, checks, monkeypatch):
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    assert registry.state().mqa_calls is None and registry.state().paged_calls is None
    p = mqa_core.get_provider("cpu")
    for _ in range(3):
        mqa_core.fp8_mqa_logits(*x.args())
        p.fp8_mqa_logits(*x.args())
    assert checks["mqa"] == 6
    bad = x.k_scale.clone()
    bad[5] = 0  # same signature, a value only a device sync sees
    for fn in (mqa_core.fp8_mqa_logits, p.fp8_mqa_logits):
        with pytest.raises(ValueError, match=r"k_scale must be > 0 everywhere \(MQA_VALIDATE=full\)"):
            fn(x.q, (x.k, bad), x.weights, x.ks, x.ke)

    y = make_paged_inputs(2, 2, 4, 64, 100, block_size=16, seed=1)
    mqa_core.fp8_paged_mqa_logits(*y.args())
    tables = y.block_tables.clone()
    tables[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block ids outside"):
        mqa_core.fp8_paged_mqa_logits(y.q, y.kv_cache, y.weights, y.context_lens, tables, y.max_context_len)
    assert checks["paged"] == 2


def test_tables_are_bounded(monkeypatch, checks):
    monkeypatch.setattr(memo, "MAX_SIGNATURES", 3)
    for m in range(1, 8):
        inp = make_inputs(Problem(m, 40, 4, 64), seed=m)
        assert calc_diff(mqa_core.fp8_mqa_logits(*inp.args()), inp.reference()) < 1e-9
        assert len(registry.state().mqa_calls) <= 3
    assert checks["mqa"] == 7


# -- the paged op ---------------------------------------------------------------------------------

@pytest.fixture
def y():
    return make_paged_inputs(2, 2, 4, 64, 100, block_size=16, seed=5)


def paged(y, **change):
    a = {"q": y.q, "kv_cache": y.kv_cache, "weights": y.weights, "context_lens": y.context_lens,
         "block_tables": y.block_tables, "max_context_len": y.max_context_len, "clean_logits": True}
    a.update(change)
    return a


def _padded_rows(cache: torch.Tensor) -> torch.Tensor:
    """The cache's bytes with rows of D + 8 bytes: stride(1) is not D + 4 (no layout takes it)."""
    nb, bs, _, d4 = cache.shape
    wide = torch.zeros(nb, bs, 1, d4 + 4, dtype=cache.dtype)
    wide[..., :d4] = cache
    return wide[..., :d4]


def _misaligned(cache: torch.Tensor) -> torch.Tensor:
    """The same shape and strides, starting 1 byte into an aligned buffer: the scales misaligned."""
    buf = torch.empty(cache.numel() + 4, dtype=cache.dtype)
    out = buf[1:1 + cache.numel()].view(cache.shape)
    return out.copy_(cache)


PAGED_VARIANTS = {
    "cache rows padded": lambda y: {"kv_cache": _padded_rows(y.kv_cache)},
    "cache start misaligned": lambda y: {"kv_cache": _misaligned(y.kv_cache)},
    "lens 2-D": lambda y: {"context_lens": y.context_lens[:, None].expand(2, 2).contiguous()},
    "lens int64": lambda y: {"context_lens": y.context_lens.long()},
    "tables strided": lambda y: {"block_tables": _strided(y.block_tables)},
    "tables on meta": lambda y: {"block_tables": y.block_tables.to("meta")},
    "weights float64": lambda y: {"weights": y.weights.double()},
    "max_context_len + 1": lambda y: {"max_context_len": y.max_context_len + 1},
    "max_context_len float": lambda y: {"max_context_len": float(y.max_context_len)},
    "max_context_len True": lambda y: {"max_context_len": True},
    "max_context_len -1": lambda y: {"max_context_len": -1},
    "clean 0": lambda y: {"clean_logits": 0},
    "clean False": lambda y: {"clean_logits": False},
}


@pytest.mark.parametrize("variant", PAGED_VARIANTS, ids=list(PAGED_VARIANTS))
@pytest.mark.parametrize("level", ["api", "provider"])
def test_paged_signature_that_differs_is_judged_afresh_with_the_same_result(y, checks, variant, level):
    def call(**change):
        a = paged(y, **change)
        fn = (mqa_core.fp8_paged_mqa_logits if level == "api"
              else mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits").fp8_paged_mqa_logits)
        return fn(a["q"], a["kv_cache"], a["weights"], a["context_lens"], a["block_tables"], a["max_context_len"],
                  clean_logits=a["clean_logits"])

    judged_afresh(call, PAGED_VARIANTS[variant](y), checks, "paged")


MOVED = {  # start addresses the checks accept (the cache's stays 4-byte aligned): not in a signature
    "mqa": lambda x: {"q": _moved(x.q, 8), "kv": (_moved(x.k, 4), _moved(x.k_scale, 4)),
                      "weights": _moved(x.weights, 8), "ks": _moved(x.ks, 4), "ke": _moved(x.ke, 12)},
    "paged": lambda y: {"q": _moved(y.q, 8), "kv_cache": _moved(y.kv_cache, 8), "weights": _moved(y.weights, 4),
                        "context_lens": _moved(y.context_lens, 4), "block_tables": _moved(y.block_tables, 12)},
}


@pytest.mark.parametrize("op", ["mqa", "paged"])
@pytest.mark.parametrize("level", ["api", "provider"])
def test_moved_start_addresses_keep_the_signature_and_the_result(x, y, checks, op, level):
    """Data pointers are per call, not part of a signature (a prepared call that depends on their
    alignment checks it itself): tensors at other addresses, same values, are not checked again and
    give the same result."""
    if op == "mqa":
        fn = mqa_core.fp8_mqa_logits if level == "api" else mqa_core.get_provider("cpu").fp8_mqa_logits
        a, b = prefill(x), prefill(x, **MOVED["mqa"](x))
        call = lambda a: fn(a["q"], a["kv"], a["weights"], a["ks"], a["ke"], clean_logits=True)  # noqa: E731
    else:
        fn = (mqa_core.fp8_paged_mqa_logits if level == "api"
              else mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits").fp8_paged_mqa_logits)
        a, b = paged(y), paged(y, **MOVED["paged"](y))
        call = lambda a: fn(a["q"], a["kv_cache"], a["weights"], a["context_lens"], a["block_tables"],  # noqa: E731
                            a["max_context_len"], clean_logits=True)
    tensors = [t for v in b.values() for t in (v if isinstance(v, tuple) else (v,)) if isinstance(t, torch.Tensor)]
    assert len(tensors) == (6 if op == "mqa" else 5) and all(t.data_ptr() % 16 for t in tensors)
    first = outcome(lambda: call(a))
    assert first[0] == "ok" and outcome(lambda: call(b)) == first and checks[op] == 1


def test_paged_problems_carry_next_n_and_block_size(y):
    mqa_core.fp8_paged_mqa_logits(*y.args())
    (problem, provider, prepared, out_check), = registry.state().paged_calls.values()
    assert problem == Problem(4, 100, 4, 64, next_n=2, block_size=16) and provider.name == "torch_ref"
    assert prepared is None  # torch_ref's kernel object prepares nothing: its method serves every call
    inputs = y.args()[:5]
    assert out_check(torch.empty(4, 100), inputs) and not out_check(torch.empty(4, 101), inputs)
    q = y.args()[0]  # an output that overlaps an input fails the signature's check
    assert not out_check(torch.empty(0).set_(q.untyped_storage(), 0, (4, 100), (100, 1)), inputs)
    p = mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits")
    p.fp8_paged_mqa_logits(*y.args())
    assert [e[:3] for e in p._passed_paged.values()] == [(problem, p, None)]
    assert str(problem) == "M=4,N=100,H=4,D=64,next_n=2,block_size=16"
    assert key_of("fp8_paged_mqa_logits", problem)[-1] == 2


class Preparing:
    """A kernel object that prepares a call per signature for both ops (what the Triton provider's
    does), counting what it prepares and serves; ``wrong`` makes the prepared call return a
    transposed result, ``alter`` (a function of the result) whatever it returns."""

    def __init__(self, inner, wrong: bool = False) -> None:
        self.inner, self.wrong, self.prepared, self.served = inner, wrong, [], 0
        self.alter = None

    def fp8_mqa_logits(self, *a, **k):
        return self.inner.fp8_mqa_logits(*a, **k)

    def fp8_paged_mqa_logits(self, *a, **k):
        return self.inner.fp8_paged_mqa_logits(*a, **k)

    def _prepare(self, op, args, clean_logits):
        self.prepared.append((tuple(args[0].shape), args[5:], clean_logits))
        scalars = args[5:]  # the paged op's max_context_len: fixed by the signature

        def call(*tensors):
            self.served += 1
            out = getattr(self.inner, op)(*tensors, *scalars, clean_logits=clean_logits)
            if self.alter is not None:
                return self.alter(out)
            return out.t() if self.wrong else out
        return call

    def prepare_fp8_mqa_logits(self, *args, clean_logits):
        return self._prepare("fp8_mqa_logits", args, clean_logits)

    def prepare_fp8_paged_mqa_logits(self, *args, clean_logits):
        return self._prepare("fp8_paged_mqa_logits", args, clean_logits)


def op_inputs(op: str, size: int, seed: int):
    """Inputs of ``op`` whose signature follows ``size`` (the paged batch, a third of prefill's M)."""
    if op == "fp8_paged_mqa_logits":
        return make_paged_inputs(size, 2, 4, 64, 100, block_size=16, seed=seed)
    return make_inputs(Problem(3 * size, 40, 4, 64), window="ragged", seed=seed)


OP_NAMES = ["fp8_mqa_logits", "fp8_paged_mqa_logits"]


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("level", ["api", "provider"])
def test_a_prepared_call_serves_the_later_calls_of_its_signature(checks, monkeypatch, level, op):
    """The kernel object is asked once per signature, after its first call passed and ran; the later
    calls of that signature go to the prepared call, and its result is checked like any other."""
    p = mqa_core.get_provider("cpu", op=op)
    kernel = Preparing(p.impl)
    monkeypatch.setattr(p, "impl", kernel)
    fn = getattr(mqa_core if level == "api" else p, op)
    inp = op_inputs(op, 2, seed=5)
    outs = [fn(*inp.args()) for _ in range(3)]
    counted = "mqa" if op == "fp8_mqa_logits" else "paged"
    assert kernel.prepared == [(tuple(inp.q.shape), inp.args()[5:], True)]
    assert kernel.served == 2 and checks[counted] == 1
    assert all(torch.equal(o, outs[0]) for o in outs)
    fn(*op_inputs(op, 3, seed=6).args())  # another batch: another signature
    assert len(kernel.prepared) == 2 and kernel.served == 2 and checks[counted] == 2
    kernel.wrong = True
    m, n = outs[0].shape
    with pytest.raises(mqa_core.ProviderResultError, match=rf"shape \[{n}, {m}\] \(expected \[{m}, {n}\]\)"):
        fn(*inp.args())


def _logits_in_wider_rows(out):
    wide = torch.full((out.shape[0], out.shape[1] + 3), float("nan"))
    wide[:, :out.shape[1]] = out
    return wide[:, :out.shape[1]]


#: Results a prepared call may hand back after its signature's first: (alteration, the full check's
#: complaint or None where the contract allows the result).
LATER_RESULTS = {
    "same layout": (lambda out: out.clone(), None),
    "padded rows": (_logits_in_wider_rows, None),
    "float64": (lambda out: out.double(), r"dtype float64 \(expected float32\)"),
    "columns strided": (lambda out: torch.stack([out, out], -1)[..., 0], r"last dim not contiguous"),
    "a list": (lambda out: out.tolist(), r"got builtins.list"),
    "meta": (lambda out: out.to("meta"), r"device meta"),
}


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("later", list(LATER_RESULTS))
def test_later_results_of_a_signature_are_held_to_the_contract(monkeypatch, op, later):
    """A remembered signature's results are checked against its first (one C++ guard); one that
    differs in any way gets the full check, which passes what the contract allows (rows padded) and
    names what it does not."""
    from mqa_core import result

    full = []
    check_logits = result.check_logits
    monkeypatch.setattr(result, "check_logits", lambda *a: (full.append(1), check_logits(*a))[1])
    p = mqa_core.get_provider("cpu", op=op)
    kernel = Preparing(p.impl)
    monkeypatch.setattr(p, "impl", kernel)
    inp = op_inputs(op, 2, seed=7)
    fn = getattr(p, op)
    first = fn(*inp.args())
    fn(*inp.args())
    assert kernel.served == 1 and len(full) == 1  # the first call's: the prepared one's passed the guard
    alter, complaint = LATER_RESULTS[later]
    kernel.alter = alter
    if complaint is None:
        out = fn(*inp.args())
        assert torch.equal(out, first)
        assert len(full) == (1 if later == "same layout" else 2)
    else:
        with pytest.raises(mqa_core.ProviderResultError, match=complaint):
            fn(*inp.args())
        assert len(full) == 2


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("errors", [False, True], ids=["warnings", "warnings as errors"])
@pytest.mark.parametrize("broken", ["raises", "exits", "not callable", "GeneratorExit", "BaseException",
                                    "str() raises"])
def test_a_broken_prepare_costs_the_shortcut_not_the_call(monkeypatch, broken, op, errors):
    """prepare_<op> is optional: when it raises anything short of KeyboardInterrupt (SystemExit,
    GeneratorExit, a BaseException of its own, an exception whose str() raises) or hands back
    something that cannot be called, the call still returns the kernel's result, a warning names the
    provider (which cannot itself raise, even with warnings as errors), and later calls of the
    signature take the op's method."""
    p = mqa_core.get_provider("cpu", op=op)
    kernel = Preparing(p.impl)

    class Own(BaseException):
        pass

    class Unprintable(Exception):
        def __str__(self):
            raise SystemExit("str")

    def prepare(*a, **k):
        if broken == "raises":
            raise RuntimeError("no launch bound")
        if broken == "exits":
            raise SystemExit(3)
        if broken == "GeneratorExit":
            raise GeneratorExit()
        if broken == "BaseException":
            raise Own("own")
        if broken == "str() raises":
            raise Unprintable()
        return 42

    monkeypatch.setattr(kernel, f"prepare_{op}", prepare)
    monkeypatch.setattr(p, "impl", kernel)
    inp = op_inputs(op, 2, seed=5)
    expected = getattr(kernel.inner, op)(*inp.args(), clean_logits=True)
    if errors:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = getattr(p, op)(*inp.args())
    else:
        with pytest.warns(RuntimeWarning, match=rf"provider torch_ref .*prepare_{op}"):
            first = getattr(p, op)(*inp.args())
    assert torch.equal(first, expected)
    table = p._passed_mqa if op == "fp8_mqa_logits" else p._passed_paged
    assert list(table.values())[0][2] is None
    assert torch.equal(getattr(p, op)(*inp.args()), expected) and kernel.served == 0


def test_problem_refuses_bad_next_n_and_block_size():
    for k, v in (("next_n", 0), ("block_size", -1), ("next_n", True), ("block_size", 1.5)):
        with pytest.raises(ValueError, match=f"Problem.{k} must be a positive int or None"):
            Problem(1, 1, 1, 1, **{k: v})
    assert str(Problem(1, 2, 3, 4)) == "M=1,N=2,H=3,D=4"


SLOW_PAGED = """
from mqa_core import ProviderSpec, hookimpl
from mqa_provider_torch_ref.kernels import KERNELS as REF

CALLS = []

class Kernels:
    def fp8_paged_mqa_logits(self, *args, **kwargs):
        CALLS.append(1)
        return REF.fp8_paged_mqa_logits(*args, **kwargs)

KERNELS = Kernels()

@hookimpl
def mqa_providers():
    def limits(problem):
        if problem.block_size is not None and problem.block_size != 16:
            return f"block_size {problem.block_size} is not 16"
        return None

    return [ProviderSpec(name="other", ops={"fp8_paged_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                         priority=-5, load="other_paged:KERNELS", shape_limits=limits)]
"""


def test_tuning_and_shape_limits_see_next_n_and_block_size(install_dist, tmp_path, monkeypatch):
    """A decode table measured per next_n chooses per next_n; shape limits judge the block size."""
    install_dist("other-paged", "1.0", {"other_paged.py": SLOW_PAGED},
                 {"mqa_core.providers": {"other": "other_paged"}})
    stamp = current_stamp(torch.device("cpu"), {"torch_ref": "mqa-provider-torch-ref", "other": "other-paged"})
    entries = tuple(Entry(Bucket("fp8_paged_mqa_logits", 4, 64, (4, 8), (64, 128), nn), times)
                    for nn, times in ((1, {"torch_ref": 1.0, "other": 2.0}), (2, {"torch_ref": 2.0, "other": 1.0})))
    path = tmp_path / "t.json"
    TuningTable(stamp, entries).write(str(path))
    monkeypatch.setenv("MQA_TUNING", str(path))
    mqa_core.reload()
    calls = __import__("other_paged").CALLS

    def chosen(next_n, block_size=16):
        z = make_paged_inputs(4 // next_n, next_n, 4, 64, 100, block_size=block_size, seed=next_n)
        before = len(calls)
        out = mqa_core.fp8_paged_mqa_logits(*z.args())
        assert calc_diff(out, z.reference()) < 1e-9
        return "other" if len(calls) > before else "torch_ref"

    assert chosen(2) == "other"
    assert chosen(1) == "torch_ref"
    assert chosen(2, block_size=32) == "torch_ref"  # its shape limits refuse this block size


# -- the last signature found, asked first -----------------------------------------------------------

@pytest.mark.parametrize("op", ["mqa", "paged"])
@pytest.mark.parametrize("level", ["api", "provider"])
def test_the_last_signature_is_served_by_torch_s_tensor_check(x, y, checks, monkeypatch, op, level):
    """From a signature's second call on, the table keeps it with torch's C++ tensor check, and a later
    call that passes the check (and has the same other arguments) is served without building its
    signature: no full-path lookup, the same entry, the same result."""
    if op == "mqa":
        fn = mqa_core.fp8_mqa_logits if level == "api" else mqa_core.get_provider("cpu").fp8_mqa_logits
        args = x.args()
    else:
        fn = (mqa_core.fp8_paged_mqa_logits if level == "api"
              else mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits").fp8_paged_mqa_logits)
        args = y.args()
    first = fn(*args)
    fn(*args)  # the second call finds the signature the full way and keeps its check
    table = next(t for t in _tables(op) if t.last is not None)
    check, _, key, entry = table.last
    assert table[key] is entry and table.guards[key] is check
    full_lookups = []
    real = memo._found
    monkeypatch.setattr(memo, "_found", lambda *a: full_lookups.append(a) or real(*a))
    again = [fn(*args) for _ in range(3)]
    assert not full_lookups and checks[op] == 1 and table.last[2] is key
    assert all(torch.equal(o, first) for o in again)


def _tables(op: str) -> list[memo.CallTable]:
    """The public op's table and every loaded provider's, for ``op`` ("mqa" or "paged")."""
    s = registry.state()
    name = "mqa" if op == "mqa" else "paged"
    tables = [s.mqa_calls if op == "mqa" else s.paged_calls]
    tables += [getattr(p, f"_passed_{name}") for p in s.providers.values()]
    return [t for t in tables if t is not None]


def test_without_torch_s_tensor_check_every_call_takes_the_full_path(y, checks, monkeypatch):
    """Where torch has no guard type (or refuses the tensors) the last signature is not kept, and calls
    are remembered and served exactly as before."""
    monkeypatch.setattr(memo, "_tensor_check", lambda tensors: False)
    outs = [mqa_core.fp8_paged_mqa_logits(*y.args()) for _ in range(4)]
    assert registry.state().paged_calls.last is None and checks["paged"] == 1
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert memo._tensor_check((object(),)) is False  # the real one, on what it cannot guard


def test_a_schedule_changes_the_signature_the_fast_path_serves(y, checks):
    """The schedule is part of the other arguments the fast path compares: a call given one after calls
    without (and the other way round) is a new signature, checked, with the same logits."""
    sched = mqa_core.paged_schedule(y.context_lens, 4)
    plain = [mqa_core.fp8_paged_mqa_logits(*y.args()) for _ in range(2)]
    given = mqa_core.fp8_paged_mqa_logits(*y.args(), schedule=sched)
    assert checks["paged"] == 2 and torch.equal(given, plain[0])
    mqa_core.fp8_paged_mqa_logits(*y.args(), schedule=sched)
    assert torch.equal(mqa_core.fp8_paged_mqa_logits(*y.args()), plain[0]) and checks["paged"] == 2


def test_a_tensor_that_needs_grad_is_not_served_as_one_that_does_not(x, checks, monkeypatch):
    """torch's check also compares requires_grad (the signature does not): such a call fails it, takes
    the full path, finds the signature there, and ends as before."""
    first = [mqa_core.fp8_mqa_logits(*x.args()) for _ in range(2)]
    full_lookups = []
    real = memo._found
    monkeypatch.setattr(memo, "_found", lambda *a: full_lookups.append(a) or real(*a))
    mqa_core.fp8_mqa_logits(*x.args())
    assert not full_lookups  # the same tensors pass the check
    w = x.weights.clone().requires_grad_(True)
    out = mqa_core.fp8_mqa_logits(x.q, (x.k, x.k_scale), w, x.ks, x.ke)
    assert len(full_lookups) == 1 and checks["mqa"] == 1 and torch.equal(out.detach(), first[0])


def test_the_kept_check_holds_no_tensor(y):
    """An engine's cache may be gigabytes: a table keeps its signatures and checks, never the tensors
    they were built from."""
    import gc
    import weakref

    cache = y.kv_cache.clone()
    args = (y.q, cache, *y.args()[2:])
    for _ in range(3):
        mqa_core.fp8_paged_mqa_logits(*args)
    assert registry.state().paged_calls.last is not None
    ref = weakref.ref(cache)
    del cache, args
    gc.collect()
    assert ref() is None
