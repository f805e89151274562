"""A paged call's schedule: how it is computed, checked, and handed only to kernels that name it."""

from __future__ import annotations

import pytest
import torch

import mqa_core
from mqa_core import Provider
from mqa_core.compat import deep_gemm
from mqa_core.testing import calc_diff, make_paged_inputs


def logits_only(spec):
    """``spec`` declaring only the logits ops: the stand-in kernels here implement no top-k op."""
    from dataclasses import replace

    from mqa_core.spec import LOGITS_OPS

    return replace(spec, ops=spec.ops & set(LOGITS_OPS))



def _expected(longest: list[int], programs: int, tile: int = 64) -> list[list[int]]:
    """The even split, item by item in Python: program i starts at item floor(i * total / programs)."""
    items = [(b, t) for b, n in enumerate(longest) for t in range(-(-max(n, 0) // tile))]
    total = len(items)
    rows = []
    for i in range(programs + 1):
        at = i * total // programs
        rows.append(list(items[at]) if at < total else [len(longest), 0])
    return rows


@pytest.mark.parametrize("lens_2d", [False, True])
@pytest.mark.parametrize("programs", [1, 5, 132])
def test_paged_schedule_is_the_even_split_of_the_tiles(lens_2d, programs):
    g = torch.Generator().manual_seed(programs)
    lens = torch.randint(0, 3000, (37, 2) if lens_2d else (37,), generator=g, dtype=torch.int32)
    lens[3] = 0  # an empty sequence
    longest = (lens.max(dim=1).values if lens_2d else lens).tolist()
    got = mqa_core.paged_schedule(lens, programs)
    assert got.dtype == torch.int32 and got.shape == (programs + 1, 2)
    assert got.tolist() == _expected(longest, programs)
    assert torch.equal(deep_gemm.get_paged_mqa_logits_metadata(lens, 64, programs), got)


def test_paged_schedule_says_what_is_wrong():
    with pytest.raises(TypeError, match="int32"):
        mqa_core.paged_schedule(torch.ones(3), 4)
    with pytest.raises(TypeError, match="num_sms must be a positive int"):
        mqa_core.paged_schedule(torch.ones(3, dtype=torch.int32), 0)
    assert mqa_core.paged_schedule(torch.zeros(0, dtype=torch.int32), 3).tolist() == [[0, 0]] * 4


def test_paged_schedule_works_on_the_cpu_without_num_sms():
    """Issue 36 item 9: the README's decode example on a CPU. One program there (a hint the CPU's
    providers do not read); the annotation says what comes back (item 15)."""
    lens = torch.tensor([5, 130, 64], dtype=torch.int32)
    assert mqa_core.paged_schedule(lens).tolist() == mqa_core.paged_schedule(lens, 1).tolist() == [[0, 0], [3, 0]]
    # Typed (not Any); torch is imported lazily, so the annotations stay strings that
    # typing.get_type_hints cannot resolve without importing torch (README says so).
    assert mqa_core.paged_schedule.__annotations__["return"] == "torch.Tensor"


@pytest.fixture
def y():
    return make_paged_inputs(5, 2, 4, 64, 300, block_size=16, lens_2d=True, seed=11)


@pytest.mark.parametrize("bad,match", [(torch.zeros(9, 2, dtype=torch.int64), "int32"),
                                       (torch.zeros(9, 3, dtype=torch.int32), r"\[num_programs \+ 1, 2\]"),
                                       (torch.zeros(1, 2, dtype=torch.int32), r"\[num_programs \+ 1, 2\]"),
                                       ([[0, 0], [5, 0]], "list")])
def test_a_bad_schedule_is_refused_before_any_kernel_runs(y, bad, match, monkeypatch):
    p = mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits")
    class Refusing:
        def fp8_paged_mqa_logits(self, *a, **k):
            pytest.fail("the kernel ran")

    monkeypatch.setattr(p, "impl", Refusing())
    for fn in (mqa_core.fp8_paged_mqa_logits, p.fp8_paged_mqa_logits):
        with pytest.raises(TypeError, match="fp8_paged_mqa_logits: schedule"):
            fn(*y.args(), schedule=bad)
        with pytest.raises(TypeError, match=match):
            fn(*y.args(), schedule=bad)


class Scheduled:
    """A kernel object that names ``schedule`` in its op and its prepare (as the Gluon provider's
    does), recording what each got, and computes with the reference provider."""

    def __init__(self, inner) -> None:
        self.inner, self.seen = inner, []
        self.fp8_mqa_logits = inner.fp8_mqa_logits

    def fp8_paged_mqa_logits(self, q, kv_cache, weights, lens, tables, n, *, clean_logits=True, schedule=None):
        self.seen.append(("call", schedule))
        return self.inner.fp8_paged_mqa_logits(q, kv_cache, weights, lens, tables, n, clean_logits=clean_logits)

    def prepare_fp8_paged_mqa_logits(self, q, kv_cache, weights, lens, tables, n, *, clean_logits=True,
                                     schedule=None):
        self.seen.append(("prepare", schedule))

        def call(q, kv_cache, weights, lens, tables, schedule=None):
            self.seen.append(("prepared", schedule))
            return self.inner.fp8_paged_mqa_logits(q, kv_cache, weights, lens, tables, n, clean_logits=clean_logits)
        return call


class Unscheduled:
    """Takes every keyword through ``**kwargs``: hints go only to parameters named outright."""

    def __init__(self, inner) -> None:
        self.inner, self.kwargs = inner, []
        self.fp8_mqa_logits = inner.fp8_mqa_logits

    def fp8_paged_mqa_logits(self, *args, **kwargs):
        self.kwargs.append(sorted(kwargs))
        return self.inner.fp8_paged_mqa_logits(*args, **kwargs)


def test_the_schedule_reaches_only_kernels_that_name_it(y):
    ref = mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits")
    schedule = mqa_core.paged_schedule(y.context_lens, 7)
    expected = y.reference()
    kernel = Scheduled(ref.impl)
    p = Provider(logits_only(ref.spec), kernel)
    outs = [p.fp8_paged_mqa_logits(*y.args(), schedule=schedule) for _ in range(3)]
    assert [(what, s is schedule) for what, s in kernel.seen] == [("call", True), ("prepare", True),
                                                                  ("prepared", True), ("prepared", True)]
    assert all(calc_diff(o, expected) < 1e-9 for o in outs)
    kernel.seen.clear()
    p.fp8_paged_mqa_logits(*y.args())  # without: another signature, and the kernel sees None
    assert kernel.seen[0] == ("call", None)
    other = Unscheduled(ref.impl)
    out = Provider(logits_only(ref.spec), other).fp8_paged_mqa_logits(*y.args(), schedule=schedule)
    assert other.kwargs == [["clean_logits"]] and calc_diff(out, expected) < 1e-9


def test_results_do_not_depend_on_the_schedule(y):
    """The public op, the torch op and the compat layer with the step's schedule, another step's and
    none: the same logits (the reference provider does not read it; the GPU tests cover the one that
    does, on any table)."""
    from mqa_core import torch_ops

    base = mqa_core.fp8_paged_mqa_logits(*y.args())
    for schedule in (mqa_core.paged_schedule(y.context_lens, 4), mqa_core.paged_schedule(y.context_lens * 0, 9),
                     torch.randint(-5, 50, (3, 2), dtype=torch.int32)):
        assert torch.equal(mqa_core.fp8_paged_mqa_logits(*y.args(), schedule=schedule), base)
        assert torch.equal(torch_ops.fp8_paged_mqa_logits(*y.args()[:6], clean_logits=True, schedule=schedule),
                           base)
    meta = deep_gemm.get_paged_mqa_logits_metadata(y.context_lens, 64, 8)
    assert torch.equal(deep_gemm.fp8_paged_mqa_logits(*y.args()[:5], meta, y.max_context_len, True), base)


def test_a_kernel_whose_signature_cannot_be_read_gets_no_hints(y):
    """inspect.signature of a third party's callable may raise anything: the provider still serves,
    without hints."""
    ref = mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits")

    class Opaque:
        def __init__(self) -> None:
            self.fp8_mqa_logits = ref.impl.fp8_mqa_logits
            self.kwargs = []

        def __call__(self, *args, **kwargs):
            self.kwargs.append(sorted(kwargs))
            return ref.impl.fp8_paged_mqa_logits(*args, **kwargs)

        @property
        def __signature__(self):
            raise RuntimeError("no signature here")

    class Kernels:
        def __init__(self) -> None:
            self.fp8_mqa_logits = ref.impl.fp8_mqa_logits
            self.fp8_paged_mqa_logits = Opaque()

    kernels = Kernels()
    schedule = mqa_core.paged_schedule(y.context_lens, 3)
    out = Provider(logits_only(ref.spec), kernels).fp8_paged_mqa_logits(*y.args(), schedule=schedule)
    assert kernels.fp8_paged_mqa_logits.kwargs == [["clean_logits"]] and calc_diff(out, y.reference()) < 1e-9
