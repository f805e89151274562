"""The indexer step in the core: argument checks before any kernel runs, the composed provider's chunk
loops, MQA_PROVIDER and MQA_BATCH_INVARIANT for the top-k ops, result checks naming the provider."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from mqa_provider_torch_ref.kernels import TorchRefKernels

import mqa_core
from mqa_core import composed
from mqa_core.errors import ProviderResultError, ProviderUnavailableError
from mqa_core.reference import fp8_mqa_logits_ref
from mqa_core.selection import select_topk
from mqa_core.testing import make_paged_inputs, make_prefill_inputs

TOPK_OPS = ("fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row")


def _prefill(m: int = 9, n: int = 300, h: int = 16, d: int = 64, seed: int = 0) -> tuple[Any, ...]:
    return make_prefill_inputs(m, n, h, d, window="causal", seed=seed).args()


def _packed(m: int = 12, n: int = 400) -> tuple[Any, ...]:
    """A packed batch of three requests: each row sees a prefix of its own request's keys."""
    q, kv, w, _, _ = make_prefill_inputs(m, n, 16, 64, seed=1).args()
    starts = torch.tensor([0] * 4 + [150] * 4 + [290] * 4, dtype=torch.int32)
    ends = starts + torch.tensor([40, 80, 120, 150, 30, 70, 100, 140, 20, 60, 90, 110], dtype=torch.int32)
    return q, kv, w, starts, ends


# -- clear errors before any kernel runs ---------------------------------------------------------------

@pytest.fixture
def no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every torch_ref kernel (what serves the CPU, composed's parts included) raises if it runs."""
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a kernel ran")
    for op in ("fp8_mqa_logits", "fp8_paged_mqa_logits", *TOPK_OPS):
        monkeypatch.setattr(TorchRefKernels, op, boom)


@pytest.mark.parametrize("change,error,text", [
    ({"topk": 0}, ValueError, "topk must be at least 1"),
    ({"topk": -3}, ValueError, "topk must be at least 1"),
    ({"topk": 2.0}, TypeError, "topk must be an int; got float"),
    ({"topk": True}, TypeError, "topk must be an int; got bool"),
    ({"topk": 2**31}, ValueError, "below 2**31"),
    ({"positions": "abs"}, ValueError, "positions must be one of 'relative', 'absolute'"),
    ({"return_values": 1}, TypeError, "return_values must be a bool"),
    ({"q": "float32"}, (TypeError, ValueError), "q"),
    ({"ks": "int64"}, (TypeError, ValueError), "cu_seqlen_ks"),
    ({"weights": "shape"}, (TypeError, ValueError), "weights"),
    ({"ke": "meta"}, (TypeError, ValueError), "meta"),
])
def test_prefill_topk_refuses_bad_input_before_any_kernel(no_kernel: None, change: dict[str, Any], error: Any,
                                                          text: str) -> None:
    q, kv, w, ks, ke = _prefill()
    kw: dict[str, Any] = {"topk": 8, "positions": "relative", "return_values": False}
    for key in ("topk", "positions", "return_values"):
        kw[key] = change.get(key, kw[key])
    if change.get("q") == "float32":
        q = q.float()
    if change.get("ks") == "int64":
        ks = ks.long()
    if change.get("weights") == "shape":
        w = w[:, :-1]
    if change.get("ke") == "meta":
        ke = ke.to("meta")
    topk = kw.pop("topk")
    with pytest.raises(error, match=text.replace("*", r"\*").replace("(", r"\(")):
        mqa_core.fp8_mqa_topk(q, kv, w, ks, ke, topk, **kw)


@pytest.mark.parametrize("change,error,text", [
    ("topk0", ValueError, "topk must be at least 1"),
    ("float16", (TypeError, ValueError), "logits"),
    ("transposed", ValueError, "contiguous last dim"),
    ("ks_shape", (TypeError, ValueError), "ks"),
    ("ke_dtype", (TypeError, ValueError), "ke"),
    ("positions", ValueError, "positions must be one of"),
])
def test_topk_per_row_refuses_bad_input_before_any_kernel(no_kernel: None, change: str, error: Any,
                                                          text: str) -> None:
    logits = torch.randn(6, 50)
    ks, ke = torch.zeros(6, dtype=torch.int32), torch.full((6,), 50, dtype=torch.int32)
    topk, positions = 4, "relative"
    if change == "topk0":
        topk = 0
    elif change == "float16":
        logits = logits.half()
    elif change == "transposed":
        logits = torch.randn(50, 6).t()
    elif change == "ks_shape":
        ks = ks[:-1]
    elif change == "ke_dtype":
        ke = ke.float()
    else:
        positions = "rel"
    with pytest.raises(error, match=text):
        mqa_core.topk_per_row(logits, ks, ke, topk, positions=positions)


@pytest.mark.parametrize("change,error,text", [
    ("topk0", ValueError, "topk must be at least 1"),
    ("topk_str", TypeError, "topk must be an int"),
    ("lens_dtype", (TypeError, ValueError), "context_lens"),
    ("values", TypeError, "return_values must be a bool"),
])
def test_paged_topk_refuses_bad_input_before_any_kernel(no_kernel: None, change: str, error: Any, text: str) -> None:
    q, cache, w, lens, tables, max_len = make_paged_inputs(2, 2, 16, 64, 200, seed=0).args()
    topk: Any = 16
    kw: dict[str, Any] = {}
    if change == "topk0":
        topk = 0
    elif change == "topk_str":
        topk = "16"
    elif change == "lens_dtype":
        lens = lens.float()
    else:
        kw["return_values"] = None
    with pytest.raises(error, match=text):
        mqa_core.fp8_paged_mqa_topk(q, cache, w, lens, tables, max_len, topk, **kw)


def test_a_window_too_long_for_the_workspace_is_refused_before_any_kernel(no_kernel: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQA_WORKSPACE_MB", "0.001")
    mqa_core.reload()
    q, kv, w, ks, ke = _prefill()
    with pytest.raises(ValueError, match="raise MQA_WORKSPACE_MB"):
        mqa_core.fp8_mqa_topk(q, kv, w, ks, ke, 8)
    x = make_paged_inputs(2, 2, 16, 64, 2000, seed=0)
    with pytest.raises(ValueError, match="raise MQA_WORKSPACE_MB"):
        mqa_core.fp8_paged_mqa_topk(*x.args(), 8)


# -- the composed provider: chunked equals unchunked equals torch_ref -------------------------------------

def _provider(name: str, op: str, monkeypatch: pytest.MonkeyPatch) -> mqa_core.Provider:
    monkeypatch.setenv("MQA_PROVIDER", name)
    mqa_core.reload()
    try:
        return mqa_core.get_provider("cpu", op=op)
    finally:
        monkeypatch.delenv("MQA_PROVIDER")
        mqa_core.reload()


def _greedy_chunks(ks: list[int], ke: list[int], n: int, cells: int, out: int) -> list[tuple[int, int, int, int]]:
    """The chunk rule row by row: a row joins the chunk while rows * (union span) + rows * out fit."""
    chunks, r0, lo, hi = [], 0, n, 0
    for r, (a, b) in enumerate(zip(ks, ke)):
        a, b = max(a, 0), min(b, n)
        a, b = (a, b) if a < b else (n, 0)
        nlo, nhi = min(lo, a), max(hi, b)
        if (r - r0 + 1) * (max(nhi - nlo, 0) + out) > cells:
            chunks.append((r0, r, lo, hi))
            r0, nlo, nhi = r, a, b
        lo, hi = nlo, nhi
    return chunks + [(r0, len(ks), lo, hi)] if r0 < len(ks) else chunks


@pytest.mark.parametrize("seed", range(6))
def test_chunk_plan_is_the_row_by_row_rule(seed: int) -> None:
    """plan_prefill (vectorised: a packed batch has tens of thousands of rows) gives the chunks of the
    row-by-row rule on ragged, empty, out-of-range and packed windows, and refuses a row that cannot
    fit alone before any chunk is planned."""
    g = torch.Generator().manual_seed(seed)
    m, n = 300, 1000
    a = torch.randint(-50, n, (m,), generator=g)
    b = a + torch.randint(-20, 400, (m,), generator=g)
    if seed % 2:  # packed requests, causal inside each
        r = torch.arange(m)
        a, b = (r // 37) * 37, r + 1
    ks, ke = a.tolist(), b.tolist()
    for cells, values in ((4000, False), (9000, True), (10**7, False)):
        out = (2 if values else 1) * 16
        got = [(c.r0, c.r1, c.lo, c.hi) for c in composed.plan_prefill(a.numpy(), b.numpy(), n, cells, 16, values)]
        assert got == _greedy_chunks(ks, ke, n, cells, out)
        assert got[0][0] == 0 and got[-1][1] == m and all(x[1] == y[0] for x, y in zip(got, got[1:]))
    with pytest.raises(ValueError, match="row 3's window"):
        composed.plan_prefill([0, 0, 0, 0], [10, 10, 10, 900], n, 500, 16, False)


@pytest.mark.parametrize("positions", ["relative", "absolute"])
@pytest.mark.parametrize("workspace", [None, 2 * 4 * 2 * (150 + 100)])
def test_rows_of_at_most_topk_keys_are_their_window_unscored(monkeypatch: pytest.MonkeyPatch, positions: str,
                                                            workspace: int | None) -> None:
    """Without values, a row whose window holds at most topk keys is its whole window: the logits
    kernel sees it as empty (and is not called at all when every row is such a row); the result equals
    the oracle's (fp64 logits, then the selection rule) on every row, NaN cells included."""
    q, kv, w, ks, ke = _packed()
    ks, ke = ks.clone(), ke.clone()
    ks[5], ke[5] = -9, 30  # window [0, 30): clipped at the left
    ks[10], ke[10] = 398, 420  # [398, 400): clipped at the right
    ks[11], ke[11] = 500, 510  # past N: empty
    k, scale = kv
    scale = scale.clone()
    scale[155] = float("nan")  # a NaN cell in row 4's window (width 30 <= topk: still selected)
    args = (q, (k, scale), w, ks, ke)
    topk = 100
    ref = fp8_mqa_logits_ref(q, k, scale, w, ks, ke)
    exact = select_topk(ref, ks, ke, topk, positions=positions)[0]
    seen: list[torch.Tensor] = []
    real = TorchRefKernels.fp8_mqa_logits

    def spy(self: Any, q: Any, kv: Any, w: Any, ks: Any, ke: Any, **kw: Any) -> Any:
        seen.append((ke - ks).clamp(min=0))
        return real(self, q, kv, w, ks, ke, **kw)

    monkeypatch.setattr(TorchRefKernels, "fp8_mqa_logits", spy)
    comp = TorchRefKernels()
    budget = workspace or 256 << 20
    got = comp.fp8_mqa_topk(*args, topk, positions=positions, return_values=False, workspace_bytes=budget)[0]
    assert torch.equal(got, exact)
    width = (ke.clamp(max=400) - ks.clamp(min=0, max=400)).clamp(min=0)
    scored = torch.cat(seen)
    assert len(seen) >= (2 if workspace else 1) and int((scored > 0).sum()) == int((width > topk).sum()) == 3
    seen.clear()
    got = comp.fp8_mqa_topk(*args, 150, positions=positions, return_values=False, workspace_bytes=budget)[0]
    assert seen == [] and torch.equal(got, select_topk(ref, ks, ke, 150, positions=positions)[0])


@pytest.mark.parametrize("positions", ["relative", "absolute"])
@pytest.mark.parametrize("inputs", ["causal", "packed"])
def test_composed_chunked_equals_unchunked_and_torch_ref(monkeypatch: pytest.MonkeyPatch, positions: str,
                                                         inputs: str) -> None:
    args = _prefill(m=12, n=400) if inputs == "causal" else _packed()
    comp = mqa_core.get_provider("cpu", op="fp8_mqa_topk")
    assert comp.name == "composed"
    ref = _provider("torch_ref", "fp8_mqa_topk", monkeypatch)
    assert ref.name == "torch_ref"
    chunks: list[list[composed.Chunk]] = []
    plan = composed.prefill_chunks

    def spy(*a: Any, **k: Any) -> Any:  # records the chunks as the loop takes them
        taken: list[composed.Chunk] = []
        chunks.append(taken)
        return (taken.append(c) or c for c in plan(*a, **k))

    monkeypatch.setattr(composed, "prefill_chunks", spy)
    tiny = 2 * 4 * 3 * (160 + 2 * 20)  # three rows of 160 keys (and their outputs) per chunk
    small = comp.fp8_mqa_topk(*args, 20, positions=positions, return_values=True, workspace_bytes=tiny)
    assert len(chunks[-1]) >= 3, chunks[-1]
    n = args[1][0].shape[0]
    assert any(c.lo > 0 or c.hi < n for c in chunks[-1]), chunks[-1]  # k sliced to the chunk's windows
    whole = comp.fp8_mqa_topk(*args, 20, positions=positions, return_values=True)
    assert len(chunks[-1]) == 1
    exact = ref.fp8_mqa_topk(*args, 20, positions=positions, return_values=True)
    for got in (small, whole):
        assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1])
    # the public op under a small MQA_WORKSPACE_MB takes the same chunks
    monkeypatch.setenv("MQA_WORKSPACE_MB", str(tiny / 2**20))
    mqa_core.reload()
    public = mqa_core.fp8_mqa_topk(*args, 20, positions=positions, return_values=True)
    assert len(chunks[-1]) >= 3 and torch.equal(public[0], exact[0]) and torch.equal(public[1], exact[1])


@pytest.mark.parametrize("positions", ["relative", "absolute"])
def test_prefill_chunks_are_planned_after_the_previous_chunks_launch(monkeypatch: pytest.MonkeyPatch,
                                                                      positions: str) -> None:
    """The chunk loop plans chunk i + 1 only after chunk i's logits and selection are enqueued, so the
    GPU does not wait for the whole call's planning; a causal prompt's first rows (windows of at most
    topk keys) share chunks with scored rows and are filled on the device. Every row equals the
    oracle's (fp64 logits, then the selection rule)."""
    q, kv, w, ks, ke = _prefill(m=40, n=60)
    ks, ke = ks.clone(), ke.clone()
    short = torch.tensor([0, 1, 2, 5, 9, 17, 26, 33])  # 1..12 keys, at most topk: filled, not scored, in
    ke[short] = ks[short] + torch.tensor([1, 2, 3, 7, 12, 4, 11, 9], dtype=ke.dtype)  # chunks with scored rows
    ks[20] = -5  # clamped to 0
    ke[30] = ks[30]  # empty
    topk = 12
    events: list[str] = []
    plan = composed.prefill_chunks

    def spy(*a: Any, **k: Any) -> Any:
        def walk() -> Any:
            for c in plan(*a, **k):
                events.append(f"plan {c.r0}")
                yield c
        return walk()

    def logits(q: Any, kv: Any, w: Any, ks: Any, ke: Any) -> torch.Tensor:
        events.append("logits")
        return fp8_mqa_logits_ref(q, kv[0], kv[1], w, ks, ke)

    def select(x: Any, ks: Any, ke: Any, topk: int, positions: str, values: bool, budget: int) -> Any:
        events.append("select")
        return select_topk(x, ks, ke, topk, positions=positions, values=torch.empty(
            x.shape[0], topk) if values else None)

    monkeypatch.setattr(composed, "prefill_chunks", spy)
    tiny = 2 * 4 * 4 * (60 + topk)  # four rows a chunk
    got, _ = composed.chunked_prefill_topk(logits, select, q, kv, w, ks, ke, topk, positions, False, tiny)
    exact = select_topk(fp8_mqa_logits_ref(q, kv[0], kv[1], w, ks, ke), ks, ke, topk, positions=positions)[0]
    assert torch.equal(got, exact)
    plans = [i for i, e in enumerate(events) if e.startswith("plan")]
    assert len(plans) >= 8 and plans[0] == 0, events
    # a chunk is planned right after the previous one's kernels (or after it, unscored, was filled)
    assert all(events[i - 1] == "select" or events[i - 1].startswith("plan") for i in plans[1:]), events
    assert events.count("logits") == events.count("select") >= 6
    assert events.index("logits") < plans[-1]  # kernels ran before the last chunk was planned


@pytest.mark.parametrize("values", [False, True])
@pytest.mark.parametrize("workspace", [1 << 20, 2 * 4 * 2 * (16 + 8)])  # one chunk; two rows a chunk
def test_prefill_windows_at_the_integer_limits(values: bool, workspace: int) -> None:
    """Windows far outside [0, N) (an int32 end at -2**31 with a start past 0, an int64 window past
    2**31, a start below 0) are clamped before any difference or cast: each row equals the oracle's,
    empty windows only -1, in a chunk whose keys start past 0 too."""
    q, kv, w, _, _ = make_prefill_inputs(6, 16, 2, 16, window="causal", seed=0).args()
    logits = lambda q, kv, w, a, b: fp8_mqa_logits_ref(q, kv[0], kv[1], w, a, b)  # noqa: E731

    def select(x: Any, a: Any, b: Any, k: int, positions: str, v: bool, budget: int) -> Any:
        return select_topk(x, a, b, k, positions=positions, values=torch.empty(x.shape[0], k) if v else None)

    i32 = dict(dtype=torch.int32)
    cases = [(torch.tensor([0, 3, 9, 10, -7, 8], **i32), torch.tensor([16, -2**31, 16, -2**31, 5, 16], **i32)),
             (torch.tensor([2**32 + 3, 0, 9, 2**40, -2**40, 12]), torch.tensor([2**32 + 5, 16, 16, 2**41, 16, 15]))]
    for ks, ke in cases:
        ref = fp8_mqa_logits_ref(q, kv[0], kv[1], w, ks.clamp(-1, 17).int(), ke.clamp(-1, 17).int())
        for positions in ("relative", "absolute"):
            want = select_topk(ref, ks.clamp(-1, 17), ke.clamp(-1, 17), 4, positions=positions)[0]
            got, vals = composed.chunked_prefill_topk(logits, select, q, kv, w, ks, ke, 4, positions, values, workspace)
            assert torch.equal(got, want), (ks, ke, positions, got, want)
            empty = (ke.clamp(0, 16) <= ks.clamp(0, 16))
            assert (got[empty] == -1).all()


def test_composed_paged_chunks_whole_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny workspace: chunks of whole sequences (each logits call sees next_n rows per sequence),
    the result equal to the unchunked one and torch_ref's."""
    x = make_paged_inputs(5, 2, 16, 64, 300, seed=4, lens_2d=True)
    calls: list[tuple[int, int]] = []
    real = TorchRefKernels.fp8_paged_mqa_logits

    def spy(self: Any, q: torch.Tensor, cache: Any, w: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        calls.append((q.shape[0], w.shape[0]))
        return real(self, q, cache, w, *a, **k)
    monkeypatch.setattr(TorchRefKernels, "fp8_paged_mqa_logits", spy)
    comp = mqa_core.get_provider("cpu", op="fp8_paged_mqa_topk")
    assert comp.name == "composed"
    per_seq = 2 * (300 + 2 * 32) * 4
    small = comp.fp8_paged_mqa_topk(*x.args(), 32, return_values=True, workspace_bytes=2 * 2 * per_seq)
    assert len(calls) == 3 and all(w == 2 * b for b, w in calls) and [b for b, _ in calls] == [2, 2, 1], calls
    calls.clear()
    whole = comp.fp8_paged_mqa_topk(*x.args(), 32, return_values=True)
    assert calls == [(5, 10)]
    ref = _provider("torch_ref", "fp8_paged_mqa_topk", monkeypatch).fp8_paged_mqa_topk(*x.args(), 32,
                                                                                        return_values=True)
    for got in (small, whole):
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


# -- MQA_PROVIDER and MQA_BATCH_INVARIANT for the top-k ops ------------------------------------------------

def test_mqa_provider_rules_for_topk_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    # A logits-only provider: the fused ops go to composed, whose logits part is that provider.
    monkeypatch.setenv("MQA_PROVIDER", "example_chunked")
    mqa_core.reload()
    p = mqa_core.get_provider("cpu", op="fp8_mqa_topk")
    assert p.name == "composed"
    q, kv, w, ks, ke = _prefill()
    logits_p, select_p = composed.Composed._parts(q, "fp8_mqa_logits", None,
                                                  mqa_core.Problem(9, 300, 16, 64))
    assert logits_p.name == "example_chunked" and select_p.name == "torch_ref"
    assert mqa_core.fp8_mqa_topk(q, kv, w, ks, ke, 8).shape == (9, 8)
    assert mqa_core.get_provider("cpu", op="topk_per_row").name == "torch_ref"  # chosen by the other rules
    # A provider that declares the op: that provider itself.
    monkeypatch.setenv("MQA_PROVIDER", "torch_ref")
    mqa_core.reload()
    for op in TOPK_OPS:
        assert mqa_core.get_provider("cpu", op=op).name == "torch_ref"
    # composed by name: the fused ops; the other ops are chosen by the other rules (no warning).
    monkeypatch.setenv("MQA_PROVIDER", "composed")
    mqa_core.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mqa_core.get_provider("cpu", op="fp8_mqa_topk").name == "composed"
        assert mqa_core.get_provider("cpu", op="fp8_paged_mqa_topk").name == "composed"
        assert mqa_core.get_provider("cpu", op="topk_per_row").name == "torch_ref"
        assert mqa_core.fp8_mqa_topk(q, kv, w, ks, ke, 8).shape == (9, 8)
    # A name not installed fails, for every top-k op, saying so.
    monkeypatch.setenv("MQA_PROVIDER", "no_such_provider")
    mqa_core.reload()
    for op in TOPK_OPS:
        with pytest.warns(RuntimeWarning, match="no_such_provider"), \
                pytest.raises(ProviderUnavailableError, match="no_such_provider not installed"):
            mqa_core.get_provider("cpu", op=op)
        mqa_core.reload()


NO_CLAIMS = '''
from mqa_core import ProviderSpec, hookimpl


@hookimpl
def mqa_providers():
    return [ProviderSpec(name="unclaimed", ops={"fp8_mqa_logits", "fp8_paged_mqa_logits", "fp8_mqa_topk",
                                              "fp8_paged_mqa_topk", "topk_per_row"},
                         archs={"cpu"}, dtypes={"float8_e4m3fn"}, priority=500,
                         load="mqa_provider_torch_ref.kernels:KERNELS")]
'''


def test_batch_invariant_setting_rejects_providers_without_the_claim(install_dist: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    install_dist("unclaimed-provider", "1.0", {"unclaimed_provider.py": NO_CLAIMS},
                 entry_points={"mqa_core.providers": {"unclaimed": "unclaimed_provider"}})
    ops = ("fp8_mqa_logits", "fp8_paged_mqa_logits", *TOPK_OPS)
    for op in ops:  # without the setting, its priority wins
        assert mqa_core.explain("cpu", op=op).chosen == "unclaimed", op
    monkeypatch.setenv("MQA_BATCH_INVARIANT", "1")
    mqa_core.reload()
    for op in ops:
        d = mqa_core.explain("cpu", op=op)
        c = d.candidate("unclaimed")
        assert not c.accepted and c.code == "claims", (op, c)
        assert "MQA_BATCH_INVARIANT=1" in c.reason and "claims nothing" in c.reason
        assert d.chosen == ("composed" if op in ("fp8_mqa_topk", "fp8_paged_mqa_topk") else "torch_ref"), (op, d)
        assert d.candidate("torch_ref").claims == ("batch_invariant", "deterministic")
        text = str(d)
        assert "claims" in text and "batch-inv,det" in text, text
    monkeypatch.setenv("MQA_PROVIDER", "unclaimed")
    mqa_core.reload()
    with pytest.raises(ProviderUnavailableError, match=r"\[claims\]|claims nothing"):
        mqa_core.get_provider("cpu", op="fp8_mqa_topk")


# -- result checks name the provider ---------------------------------------------------------------------

BAD_RESULTS = '''
import torch
from mqa_core import ProviderSpec, hookimpl


class Bad:
    def __init__(self, kind):
        self.kind = kind

    def topk_per_row(self, logits, ks, ke, topk, *, positions="relative", return_values=False, workspace_bytes=None):
        m = logits.shape[0]
        idx = torch.zeros(m, topk, dtype=torch.int32)
        if self.kind == "dtype":
            idx = idx.long()
        elif self.kind == "shape":
            idx = idx[:, :-1]
        elif self.kind == "overlap":
            idx = logits.view(torch.int32)[:, :topk]
        elif self.kind == "values":
            return idx, idx.float()[:, :-1]
        elif self.kind == "tuple":
            return idx
        vals = torch.zeros(m, topk)
        return idx, vals


@hookimpl
def mqa_providers():
    return [ProviderSpec(name=f"bad_{k}", ops={"topk_per_row"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                         priority=-50, load=f"bad_results:{k.upper()}")
            for k in ("dtype", "shape", "overlap", "values", "tuple")]


DTYPE, SHAPE, OVERLAP, VALUES, TUPLE = (Bad(k) for k in ("dtype", "shape", "overlap", "values", "tuple"))
'''


@pytest.mark.parametrize("kind,text", [
    ("dtype", "indices must be int32 [5, 4] on cpu; got int64"),
    ("shape", "indices must be int32 [5, 4] on cpu; got int32 [5, 3]"),
    ("overlap", "indices overlaps input logits in memory"),
    ("values", "values must be float32 [5, 4]"),
    ("tuple", "expected a tuple (indices, values or None); got Tensor"),
])
def test_wrong_results_name_the_provider(install_dist: Any, monkeypatch: pytest.MonkeyPatch, kind: str,
                                         text: str) -> None:
    install_dist("bad-results", "2.0", {"bad_results.py": BAD_RESULTS},
                 entry_points={"mqa_core.providers": {"bad": "bad_results"}})
    p = _provider(f"bad_{kind}", "topk_per_row", monkeypatch)
    logits = torch.randn(5, 40)
    ks, ke = torch.zeros(5, dtype=torch.int32), torch.full((5,), 40, dtype=torch.int32)
    with pytest.raises(ProviderResultError) as info:
        p.topk_per_row(logits, ks, ke, 4, return_values=kind == "values")
    msg = str(info.value)
    assert f"provider bad_{kind} (bad-results==2.0) returned a wrong result from topk_per_row" in msg, msg
    assert text in msg, msg
