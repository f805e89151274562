"""The conformance suite, collected when pytest runs with ``--mqa-provider NAME`` (see ``plugin.py``).

Every case draws fresh random inputs (never zeros; the seed is in every failure message and
``--mqa-seed`` reproduces a run), calls the provider exactly as an engine would get it
(``MQA_PROVIDER=NAME``, then ``get_provider``) with every byte its output can occupy poisoned, and
checks against the float64 oracle of :mod:`mqa_core.reference`: the -inf mask exactly, and every
in-window cell within its own error bound (:mod:`.bound`). Each case runs for every (q, k) dtype
pair the provider declares on the device's arch, or for the one ``--mqa-dtype`` names.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from .. import validate
from ..arch import KNOWN_ARCHS, normalize_arch
from ..errors import ProviderUnavailableError
from ..names import names_provider
from ..provider import Provider, load_object
from ..spec import OPS, Problem, ProviderSpec
from . import large, runner, topk
from . import providers as named
from .bound import Accumulation
from .cases import (
    HEAD_DIMS,
    HEADS,
    PAGED_BLOCK_SIZE,
    PAGED_CASES,
    PROBES,
    WINDOW_KINDS,
    Pair,
    accepts,
    declared_pairs,
    large_sizes,
    main_heads_dims,
    make_windows,
    pair_id,
    sizes_for,
)
from .checks import Case, check_identical
from .data import Inputs, PagedInputs
from .layouts import LAYOUTS, describe, paged_layout
from .plugin import BASE_SEED, DTYPE_PAIR, kit_accumulation, kit_arch, kit_device
from .poison import poisoned_call

PREFILL = "fp8_mqa_logits"
PAGED = "fp8_paged_mqa_logits"
GRID = tuple((h, d) for h in HEADS for d in HEAD_DIMS) + PROBES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    names = list(config.getoption("mqa_provider"))
    if "dtype_pair" in metafunc.fixturenames:
        one = metafunc.definition.name.startswith(("test_topk", "test_claims"))
        params = [(n, p) for n in names for p in _pairs_to_run(config, n, one)]
        metafunc.parametrize("provider_name,dtype_pair", params, ids=[f"{n}-{pair_id(p)}" for n, p in params])
    elif "provider_name" in metafunc.fixturenames:
        metafunc.parametrize("provider_name", names, ids=names)
    if "odd_size" in metafunc.fixturenames:
        odd = sizes_for(kit_device(config)).odd
        metafunc.parametrize("odd_size", odd, ids=[f"M{m}-N{n}" for m, n in odd])


def _pairs_to_run(config: pytest.Config, name: str, one: bool = False) -> list[Pair]:
    """The dtype pairs a case runs for: ``--mqa-dtype``'s, else every pair ``name`` declares; ``one``
    (the top-k and claims cases, whose subject is the selection, not the arithmetic of each pair): only
    the first same-flavour pair it declares."""
    chosen = config.stash.get(DTYPE_PAIR, None)
    if chosen is not None:
        return [chosen]
    try:
        spec = named.spec_named(name)
    except ValueError:  # ambiguous: each case then says so (_spec_or_fail)
        spec = None
    pairs = declared_pairs(spec, kit_arch(config)) if spec is not None else [("float8_e4m3fn", "float8_e4m3fn")]
    if one:
        same = [p for p in pairs if p[0] == p[1]]
        pairs = (same or pairs)[:1]
    return pairs


@dataclass
class Kit:
    """One provider under test on one device with one dtype pair, and the current case's seed."""

    name: str
    spec: ProviderSpec
    device: torch.device
    arch: str
    base_seed: int
    nodeid: str
    #: (op, pair) -> Provider, or [one-line reason, full trace, shown] for a provider that cannot serve.
    providers: dict[tuple[str, Pair], Any]
    pair: Pair
    accumulation: Accumulation

    @property
    def seed(self) -> int:
        """Fresh per run (the base seed is random unless --mqa-seed), distinct per case."""
        return (self.base_seed + zlib.crc32(self.nodeid.encode())) % 2**31

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        return self.draw.dtypes

    @property
    def request_dtype(self) -> Any:
        """What ``get_provider(dtype=...)`` takes: the q dtype, or the (q, k) pair when they differ."""
        return self.pair[0] if self.pair[0] == self.pair[1] else self.pair

    def provider(self, op: str = PREFILL) -> Provider:
        key = (op, self.pair)
        if key not in self.providers:
            try:
                self.providers[key] = named.provider_named(self.name, self.arch, op=op, dtype=self.request_dtype)
            except ProviderUnavailableError as exc:
                self.providers[key] = [self._why_not(op, exc), str(exc), False]
        got = self.providers[key]
        if isinstance(got, list):
            line, trace, shown = got
            got[2] = True  # the whole trace once per run; later cases say it in one line
            pytest.fail(line if shown else f"{line}\n{trace}", pytrace=False)
        return got

    def _why_not(self, op: str, exc: ProviderUnavailableError) -> str:
        decision = getattr(exc, "decision", None)
        row = ""
        try:
            c = decision.candidate(self.name)  # type: ignore[union-attr]
            row = f": [{c.code}] {c.reason}"
        except (AttributeError, KeyError):
            pass
        return (f"provider {self.name} cannot serve {op} ({pair_id(self.pair)}) on {self.device} "
                f"({self.arch}) under MQA_PROVIDER={self.name}{row}")

    def require(self, op: str) -> None:
        if op not in self.spec.ops:
            pytest.skip(f"{self.name} does not declare {op}")

    @property
    def draw(self) -> runner.Draw:
        """This case's inputs and bound, for the case runner."""
        return runner.Draw(self.device, self.pair, self.accumulation, self.seed, self.base_seed)

    def case(self, op: str, what: str, problem: Problem) -> Case:
        return self.draw.case(self.name, op, what, problem)

    def main_problem(self, m: int, n: int) -> Problem:
        self.require(PREFILL)
        hd = main_heads_dims(self.spec, m, n)
        if hd is None:
            pytest.fail(f"provider {self.name}'s shape limits accept no (H, D) in H={HEADS} x D={HEAD_DIMS} "
                        f"at M={m}, N={n}: the kit has nothing it may run", pytrace=False)
        return Problem(m, n, *hd)

    def rejects(self, op: str, problem: Problem) -> bool:
        """True (and the rejection checked) when the spec's shape limits refuse ``problem``."""
        if accepts(self.spec, problem):
            return False
        c = named.explain_with(self.arch, op=op, problem=problem).candidate(self.name)
        assert c.code == "shape", (f"[{self.name}] shape_limits reject {problem}, but selection gives "
                                   f"{'accepted' if c.accepted else f'[{c.code}] {c.reason}'}, not [shape]")
        with pytest.raises(ProviderUnavailableError):
            named.provider_named(self.name, self.arch, op=op, problem=problem)
        return True


def _spec_or_fail(provider_name: str) -> ProviderSpec:
    try:
        spec = named.spec_named(provider_name)
    except ValueError as exc:  # a bare name two distributions claim
        pytest.fail(str(exc), pytrace=False)
    if spec is None:
        from .. import registry

        broken = "".join(f"\n  {b}" for b in registry.state().discovery.broken)
        pytest.fail(f"provider {provider_name!r} is not installed; installed: "
                    f"{', '.join(named.installed_names()) or 'none'}{broken}", pytrace=False)
    return spec


@pytest.fixture(scope="session")
def provider_cache() -> dict[str, dict[tuple[str, Pair], Any]]:
    """Per provider, what :meth:`Kit.provider` found: one selection per (op, pair) and session."""
    return {}


@pytest.fixture
def provider_spec(provider_name: str) -> ProviderSpec:
    return _spec_or_fail(provider_name)


@pytest.fixture
def kit(provider_name: str, dtype_pair: Pair, provider_cache: dict[str, dict[tuple[str, Pair], Any]],
        request: pytest.FixtureRequest) -> Kit:
    spec = _spec_or_fail(provider_name)
    config = request.config
    arch = kit_arch(config)
    declared = declared_pairs(spec, arch)
    if dtype_pair not in declared:
        pytest.skip(f"{provider_name} does not declare q {dtype_pair[0]} with k {dtype_pair[1]} on {arch} "
                    f"(declares {', '.join(pair_id(p) for p in declared)})")
    return Kit(provider_name, spec, kit_device(config), arch, config.stash[BASE_SEED], request.node.nodeid,
               provider_cache.setdefault(provider_name, {}), dtype_pair, kit_accumulation(config))


# -- helpers: the suite's selection and skips around the case runner (runner.py) --------------------

def run_prefill(kit: Kit, problem: Problem, *, window: str = "ragged", clean: bool = True,
                k_scale_2d: bool = False, positive: bool = False, layout: str | None = None,
                what: str = "", logits_dtype: torch.dtype = torch.float32) -> tuple[Inputs, torch.Tensor, Case]:
    """One poisoned call on fresh inputs, checked against the oracle; returns what a case reuses."""
    kit.require(PREFILL)
    return runner.run_prefill(kit.provider(PREFILL), kit.draw, problem, window=window, clean=clean,
                              k_scale_2d=k_scale_2d, positive=positive, layout=layout, what=what,
                              logits_dtype=logits_dtype)


def run_paged(kit: Kit, x: PagedInputs, *, clean: bool, what: str,
              schedule: torch.Tensor | None = None, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return runner.run_paged(kit.provider(PAGED), kit.draw, x, clean=clean, what=what, schedule=schedule,
                            logits_dtype=logits_dtype)


def paged_inputs(kit: Kit, batch: int, next_n: int, *, lens_2d: bool, positive: bool = False,
                 pool_pad_bytes: int = 0) -> PagedInputs:
    """Decode inputs for the kit: short and block-edge lengths (1-D), arbitrary per-row ones (2-D)."""
    kit.require(PAGED)
    if kit.pair[0] != kit.pair[1]:
        pytest.skip("the paged cache is uint8 and holds q's fp8 flavour: mixed pairs are a prefill matter")
    ctx = sizes_for(kit.device).paged_context
    h, d = main_heads_dims(kit.spec, batch * next_n, ctx) or (32, 128)
    return runner.paged_inputs(kit.draw, batch, next_n, h, d, ctx, lens_2d=lens_2d, positive=positive,
                               pool_pad_bytes=pool_pad_bytes)


# -- the provider as declared --------------------------------------------------------------------

def test_spec(provider_name: str, provider_spec: ProviderSpec) -> None:
    """Spec sanity: well-formed archs, an int priority, a load path that resolves, cheap well-behaved hooks."""
    spec = provider_spec
    for arch in sorted(spec.archs - {"any"}):
        try:
            normalize_arch(arch)
        except ValueError:
            pytest.fail(f"[{provider_name}] declares arch {arch!r}, not a well-formed arch name", pytrace=False)
    assert isinstance(spec.priority, int) and not isinstance(spec.priority, bool), \
        f"[{provider_name}] priority must be an int, got {spec.priority!r}"
    obj = load_object(spec.load)
    missing = [op for op in sorted(spec.ops) if not callable(getattr(obj, op, None))]
    assert not missing, f"[{provider_name}] {spec.load} has no method for declared ops {missing}"
    archs = sorted(set(KNOWN_ARCHS) | (spec.archs - {"any"}))
    if spec.check is not None:
        t0 = time.perf_counter()
        for arch in archs:
            reason = spec.check(arch)
            assert reason is None or isinstance(reason, str), \
                f"[{provider_name}] check({arch!r}) must return None or a reason string, got {reason!r}"
        slow = time.perf_counter() - t0
        assert slow < 5.0, f"[{provider_name}] check() took {slow:.1f} s over {len(archs)} archs: cache it"
    if spec.shape_limits is not None:
        for h, d in GRID:
            reason = spec.shape_limits(Problem(64, 256, h, d))
            assert reason is None or isinstance(reason, str), \
                f"[{provider_name}] shape_limits(H={h}, D={d}) must return None or a reason, got {reason!r}"


def test_selection(provider_name: str, provider_spec: ProviderSpec, request: pytest.FixtureRequest) -> None:
    """MQA_PROVIDER=NAME selects it on this device; MQA_DISABLE_PROVIDERS=NAME blocks it."""
    arch = kit_arch(request.config)
    op = next(o for o in OPS if o in provider_spec.ops)
    chosen = named.explain_with(arch, op=op, MQA_PROVIDER=provider_name)
    row = chosen.chosen_candidate
    assert row is not None and names_provider(provider_name, row.distribution, row.name), \
        f"[{provider_name}] is not selectable on {arch}:\n{chosen}"
    blocked = ",".join(filter(None, (os.environ.get("MQA_DISABLE_PROVIDERS", ""), provider_name)))
    d = named.explain_with(arch, op=op, MQA_DISABLE_PROVIDERS=blocked)
    row = d.chosen_candidate
    assert d.candidate(provider_name).code == "blocked" and (
        row is None or not names_provider(provider_name, row.distribution, row.name)), \
        f"[{provider_name}] MQA_DISABLE_PROVIDERS={blocked} does not block it:\n{d}"


# -- prefill -------------------------------------------------------------------------------------

@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("window", WINDOW_KINDS)
def test_prefill_window(kit: Kit, window: str, clean: bool) -> None:
    """Causal, full, chunked, ragged, corner-case, short and all-empty windows, clean_logits on and off."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window=window, clean=clean)


@pytest.mark.parametrize("window", ["causal", "ragged"])
def test_prefill_positive(kit: Kit, window: str) -> None:
    """q, k and weights positive: nothing cancels, so every cell's bound is a fixed fraction of the
    logit itself; a kernel off by a constant factor or rounding its output fails here on any device."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window=window, clean=True, positive=True)


@pytest.mark.parametrize("h,d", GRID, ids=[f"H{h}-D{d}" for h, d in GRID])
def test_prefill_heads_dims(kit: Kit, h: int, d: int) -> None:
    """Every (H, D) the spec accepts is right; every one it rejects is rejected by selection."""
    kit.require(PREFILL)
    m, n = sizes_for(kit.device).grid
    problem = Problem(m, n, h, d)
    if not kit.rejects(PREFILL, problem):
        run_prefill(kit, problem, window="ragged", clean=True)


def test_prefill_odd_sizes(kit: Kit, odd_size: tuple[int, int]) -> None:
    """M = 1, N = 1, N < M, exact tiles and one past them."""
    run_prefill(kit, kit.main_problem(*odd_size), window="ragged", clean=True)


def test_prefill_k_scale_2d(kit: Kit) -> None:
    """k_scale may arrive as [N, 1] (vLLM) as well as [N]."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window="causal", clean=True, k_scale_2d=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k_scale_2d", [False, True], ids=["k_scale_1d", "k_scale_2d"])
def test_prefill_layout(kit: Kit, layout: str, k_scale_2d: bool) -> None:
    """Inputs as views: slices of larger buffers at storage offsets, heads-first q, dim-first k (last
    dim not contiguous), transposed weights, strided k_scale/ks/ke; padding holds poison."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window="edges", clean=True, layout=layout, k_scale_2d=k_scale_2d)


def test_prefill_repeatable(kit: Kit) -> None:
    """Two identical calls give bit-identical logits, each with its output poisoned."""
    m, n = sizes_for(kit.device).windows
    x, first, case = run_prefill(kit, kit.main_problem(m, n), window="edges", clean=True)
    provider = kit.provider(PREFILL)
    second, _ = poisoned_call(lambda: provider.fp8_mqa_logits(*x.args(), clean_logits=True), kit.device)
    check_identical(first, second, replace(case, what=case.what + " (second call)"))


def test_prefill_fresh_output(kit: Kit) -> None:
    """Two calls of one signature: the second (other weights) leaves the first's result as it was, in
    memory of its own; a provider that hands back one buffer per shape (a CUDA graph's static output,
    say) fails. Every case also checks that no input changed, padding included."""
    m, n = sizes_for(kit.device).windows
    problem = kit.main_problem(m, n)
    x = runner.prefill_inputs(kit.draw, problem, window="edges")
    runner.run_fresh(kit.provider(PREFILL), kit.draw, x, "two calls, other weights")


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("window,positive", [("causal", False), ("ragged", False), ("edges", True)],
                         ids=["causal", "ragged", "edges-positive"])
def test_prefill_bf16_logits(kit: Kit, window: str, positive: bool, clean: bool) -> None:
    """``logits_dtype=torch.bfloat16``: every in-window cell within its float32 bound plus one final
    rounding to bf16 (u = 2**-8 of the cell), the -inf mask exact. Positive data makes the bound a
    fixed fraction of the logit, so a second rounding or a truncation shows."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window=window, clean=clean, positive=positive,
                logits_dtype=torch.bfloat16)


def _enough_memory(kit: Kit, need: int) -> None:
    if kit.device.type != "cuda":
        return
    torch.cuda.empty_cache()  # what earlier cases left cached counts as free here
    free, _ = torch.cuda.mem_get_info(kit.device)
    if free < need:
        pytest.skip(f"needs about {need / 2**30:.1f} GiB free on {kit.device}; {free / 2**30:.1f} GiB are")


@pytest.mark.mqa_large
@pytest.mark.parametrize("kind", large.KINDS)
def test_prefill_large_index(kit: Kit, kind: str) -> None:
    """Offsets past 2**31 (GPU; 2**18 on the CPU): N*D keys, M*N logits; windows at the crossing."""
    kit.require(PREFILL)
    sizes = large_sizes(kit.device)
    h, d = main_heads_dims(kit.spec, 8, sizes.keys_past(128)) or (32, 128)
    m, n = (8, sizes.keys_past(d)) if kind == "keys" else sizes.rows_cols_past()
    problem = Problem(m, n, h, d)
    if kit.rejects(PREFILL, problem):
        return
    _enough_memory(kit, n * d + m * h * d + 3 * m * n * 4 + (2 << 30))
    sampled = large.prefill_case(kind, sizes, h, d, kit.dtypes, kit.device, kit.seed)
    runner.run_sampled(kit.provider(PREFILL), kit.draw, problem, sampled)


# -- decode (paged) ------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,next_n,lens_2d,clean", PAGED_CASES,
                         ids=[f"B{b}-next{nn}-lens{'2d' if l2 else '1d'}-{'clean' if c else 'unclean'}"
                              for b, nn, l2, c in PAGED_CASES])
def test_paged(kit: Kit, batch: int, next_n: int, lens_2d: bool, clean: bool) -> None:
    """The decode op over DeepGEMM's paged cache: short contexts and block edges (1-D lengths), and
    arbitrary per-row lengths (2-D: zero, the whole context, decreasing within a sequence)."""
    x = paged_inputs(kit, batch, next_n, lens_2d=lens_2d)
    run_paged(kit, x, clean=clean, what=f"batch={batch} next_n={next_n}")


@pytest.mark.parametrize("batch,next_n,lens_2d,positive", [(4, 1, False, False), (3, 2, True, False),
                                                          (3, 2, True, True), (2, 4, False, False)],
                         ids=["B4-next1-lens1d", "B3-next2-lens2d", "B3-next2-positive", "B2-next4-lens1d"])
def test_paged_bf16_logits(kit: Kit, batch: int, next_n: int, lens_2d: bool, positive: bool) -> None:
    """The decode op with ``logits_dtype=torch.bfloat16``: bound plus one rounding, -inf exact."""
    x = paged_inputs(kit, batch, next_n, lens_2d=lens_2d, positive=positive)
    run_paged(kit, x, clean=True, what=f"batch={batch} next_n={next_n}" + (" positive data" if positive else ""),
              logits_dtype=torch.bfloat16)


@pytest.mark.parametrize("which", ["this step's", "another step's", "any table"])
def test_paged_schedule_is_a_hint(kit: Kit, which: str) -> None:
    """A decode step's schedule (mqa_core.paged_schedule) changes nothing in the logits: the step's
    own, one from other lengths and an arbitrary int32 table of another program count all give the
    oracle's values (a provider that does not name ``schedule`` never sees it)."""
    from mqa_core import paged_schedule

    x = paged_inputs(kit, 5, 2, lens_2d=True)
    lens = x.context_lens.to(kit.device)
    g = torch.Generator().manual_seed(kit.seed)
    schedule = {"this step's": lambda: paged_schedule(lens, 7),
                "another step's": lambda: paged_schedule(lens.flip(0) // 2 + 64, 7),
                "any table": lambda: torch.randint(-3, 9, (12, 2), generator=g, dtype=torch.int32)}[which]()
    run_paged(kit, x, clean=True, what=f"batch=5 next_n=2 schedule ({which}) {schedule.tolist()}",
              schedule=schedule.to(kit.device))


def test_paged_positive(kit: Kit) -> None:
    """Positive data, so every cell's bound is a fixed fraction of the logit (see test_prefill_positive)."""
    x = paged_inputs(kit, 3, 2, lens_2d=True, positive=True)
    run_paged(kit, x, clean=True, what="batch=3 next_n=2 positive data")


def test_paged_fresh_output(kit: Kit) -> None:
    """As test_prefill_fresh_output, for the decode op."""
    x = paged_inputs(kit, 3, 2, lens_2d=True)
    runner.run_fresh(kit.provider(PAGED), kit.draw, x, "batch=3 next_n=2, two calls, other weights")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_paged_layout(kit: Kit, layout: str) -> None:
    """q, weights, context_lens and block_tables as views (a wider block table, a column-major one)."""
    x = paged_layout(paged_inputs(kit, 3, 2, lens_2d=True), layout)
    run_paged(kit, x, clean=True, what=f"batch=3 next_n=2 layout={layout} (q {describe(x.q)}, "
                                       f"block_tables {describe(x.block_tables)})")


def test_paged_strided_pool(kit: Kit) -> None:
    """A page pool whose blocks are further apart than block_size * (D + 4) bytes (the gap is NaN)."""
    x = paged_inputs(kit, 3, 2, lens_2d=True, pool_pad_bytes=256)
    try:
        validate.paged_mqa_logits_args(x.q, x.kv_cache, x.weights, x.context_lens, x.block_tables,
                                       x.max_context_len, True)
    except ValueError as exc:
        pytest.skip(f"this mqa-core does not accept strided page pools yet: {exc}")
    run_paged(kit, x, clean=True, what=f"batch=3 next_n=2 kv_cache strides {tuple(x.kv_cache.stride())}")


@pytest.mark.mqa_large
def test_paged_large_index(kit: Kit) -> None:
    """Offsets past 2**31 (GPU; 2**18 on the CPU): output rows and the page pool's block offsets."""
    kit.require(PAGED)
    if kit.pair[0] != kit.pair[1]:
        pytest.skip("the paged cache is uint8 and holds q's fp8 flavour: mixed pairs are a prefill matter")
    sizes = large_sizes(kit.device)
    batch, next_n, ctx = sizes.paged()
    h, d = main_heads_dims(kit.spec, batch * next_n, ctx) or (32, 128)
    problem = Problem(batch * next_n, ctx, h, d)
    if kit.rejects(PAGED, problem):
        return
    _enough_memory(kit, 3 * batch * next_n * ctx * 4 + (2 ** sizes.bits) + (4 << 30))
    sampled = large.paged_case(sizes, h, d, kit.dtypes[0], kit.device, kit.seed, PAGED_BLOCK_SIZE)
    runner.run_sampled(kit.provider(PAGED), kit.draw, problem, sampled)


# -- the indexer step: top-k (kit v3, see topk.py) -----------------------------------------------------
# These run for one dtype pair per provider (the selection is their subject; the logits cases above
# cover every pair's arithmetic). topk_per_row is judged exactly (its logits are given); the fused ops
# by accepted selection on random inputs and exactly on exact inputs.

TOPK_MODES = [("relative", False), ("absolute", True)]
TOPK_MODE_IDS = ["relative", "absolute-values"]


def _topk_hd(kit: Kit, op: str, m: int, n: int) -> tuple[int, int]:
    kit.require(op)
    hd = topk.topk_heads_dims(kit.spec, m, n)
    if hd is None:
        pytest.fail(f"provider {kit.name}'s shape limits accept no (H, D) at M={m}, N={n}", pytrace=False)
    return hd


@pytest.mark.parametrize("positions,return_values", TOPK_MODES, ids=TOPK_MODE_IDS)
@pytest.mark.parametrize("kind", topk.LOGITS_KINDS)
def test_topk_per_row(kit: Kit, kind: str, positions: str, return_values: bool) -> None:
    """The selection over given logits equals the oracle's: random float32, small integers (ties
    everywhere), -inf rows, NaN rows and cells, -0.0 beside 0.0, bf16 logits, rows wider than N; every
    window corner (empty, ks < 0, ke > N, one key, shorter than topk)."""
    kit.require(topk.PER_ROW)
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.windows
    logits = topk.given_logits(kind, m, n, kit.seed, kit.device)
    ks, ke = make_windows("edges", m, n, kit.seed)
    topk.run_topk_per_row(kit.provider(topk.PER_ROW), kit.draw, logits, ks.to(kit.device), ke.to(kit.device),
                          sizes.topk, positions=positions, return_values=return_values, what=f"logits={kind}")


@pytest.mark.parametrize("k", topk.TOPK_SIZES["cpu"].topks)
def test_topk_per_row_sizes(kit: Kit, k: int) -> None:
    """topk 1, 512, 2048, 4096 over N = topk + a margin: a full window, windows shorter than topk, an
    empty one; small-integer logits, so ties straddle every 64/128/2048 border."""
    kit.require(topk.PER_ROW)
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.rows, k + sizes.past
    logits = topk.given_logits("ties", m, n, kit.seed, kit.device)
    ks, ke = make_windows("edges", m, n, kit.seed)
    topk.run_topk_per_row(kit.provider(topk.PER_ROW), kit.draw, logits, ks.to(kit.device), ke.to(kit.device), k,
                          positions="relative", return_values=True, what="logits=ties")


@pytest.mark.parametrize("positions,return_values", TOPK_MODES, ids=TOPK_MODE_IDS)
@pytest.mark.parametrize("window", ["causal", "ragged", "edges", "short", "empty"])
def test_topk_prefill(kit: Kit, window: str, positions: str, return_values: bool) -> None:
    """Random fp8 inputs: the selection is accepted within the cells' error bounds, positions ascend
    inside the window, -1 fills exactly the slots a short window leaves, values within their bounds."""
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.windows
    h, d = _topk_hd(kit, topk.TOPK, m, n)
    x = topk.random_prefill(kit.draw, Problem(m, n, h, d), window=window)
    topk.run_prefill_topk(kit.provider(topk.TOPK), kit.draw, x, sizes.topk, positions=positions,
                          return_values=return_values, exact=False, what=f"random inputs window={window}")


@pytest.mark.parametrize("positions,return_values", TOPK_MODES, ids=TOPK_MODE_IDS)
@pytest.mark.parametrize("ties", [True, False], ids=["ties", "distinct"])
@pytest.mark.parametrize("window", ["causal", "edges"])
def test_topk_prefill_exact(kit: Kit, window: str, ties: bool, positions: str, return_values: bool) -> None:
    """Exact inputs (integer fp8, power-of-two scales and weights): the selection equals the oracle's,
    tie rule included. ``ties``: keys repeat every 40 positions, so equal logits straddle every tile
    border; ``distinct``: large, close logits, so a selection on rounded logits shows."""
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.windows
    h, d = _topk_hd(kit, topk.TOPK, m, n)
    x = topk.exact_prefill(kit.draw, Problem(m, n, h, d), window=window, ties=ties)
    topk.run_prefill_topk(kit.provider(topk.TOPK), kit.draw, x, sizes.topk, positions=positions,
                          return_values=return_values, exact=True,
                          what=f"exact inputs ({'repeated keys' if ties else 'distinct keys'}) window={window}")


@pytest.mark.parametrize("k", topk.TOPK_SIZES["cpu"].topks)
def test_topk_prefill_sizes(kit: Kit, k: int) -> None:
    """topk 1, 512, 2048, 4096 over N = topk + a margin on exact inputs with repeated keys (ties across
    the 2048 border too): a full window, short ones, one at the end, an empty one."""
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.rows, k + sizes.past
    h, d = _topk_hd(kit, topk.TOPK, m, n)
    x = topk.exact_prefill(kit.draw, Problem(m, n, h, d), window="edges")
    topk.run_prefill_topk(kit.provider(topk.TOPK), kit.draw, x, k, positions="absolute", return_values=True,
                          exact=True, what="exact inputs (repeated keys) window=edges")


@pytest.mark.parametrize("window", ["causal", "ragged"])
def test_topk_prefill_chunked(kit: Kit, window: str) -> None:
    """A workspace of a few rows' logits (as a small MQA_WORKSPACE_MB gives): rows go in chunks, each
    scoring only the keys its windows cover; the selection on exact inputs still equals the oracle's
    (ties across chunk borders included)."""
    sizes = topk.topk_sizes(kit.device)
    m, n = sizes.windows
    h, d = _topk_hd(kit, topk.TOPK, m, n)
    x = topk.exact_prefill(kit.draw, Problem(m, n, h, d), window=window)
    workspace = 2 * 4 * 4 * (n + 2 * sizes.topk)  # about four rows per chunk
    topk.run_prefill_topk(kit.provider(topk.TOPK), kit.draw, x, sizes.topk, positions="relative",
                          return_values=True, exact=True, what=f"exact inputs (repeated keys) window={window}",
                          workspace_bytes=workspace)


TOPK_PAGED_CASES = ((1, 1, False), (4, 1, False), (3, 2, True), (2, 3, False), (2, 4, True))


def _paged_topk_inputs(kit: Kit, batch: int, next_n: int, lens_2d: bool, exact: bool,
                       context: int | None = None) -> PagedInputs:
    kit.require(topk.PAGED_TOPK)
    if kit.pair[0] != kit.pair[1]:
        pytest.skip("the paged cache is uint8 and holds q's fp8 flavour: mixed pairs are a prefill matter")
    ctx = context or topk.topk_sizes(kit.device).paged_context
    h, d = _topk_hd(kit, topk.PAGED_TOPK, batch * next_n, ctx)
    return topk.decode_inputs(kit.draw, batch, next_n, h, d, ctx, lens_2d=lens_2d, exact=exact)


@pytest.mark.parametrize("exact", [False, True], ids=["random", "exact"])
@pytest.mark.parametrize("batch,next_n,lens_2d", TOPK_PAGED_CASES,
                         ids=[f"B{b}-next{nn}-lens{'2d' if l2 else '1d'}" for b, nn, l2 in TOPK_PAGED_CASES])
def test_topk_paged(kit: Kit, batch: int, next_n: int, lens_2d: bool, exact: bool) -> None:
    """The decode op: 1-D lengths (1, a block, a block plus one) and arbitrary 2-D ones (0 to the whole
    context), next_n 1 to 4; random inputs accepted within the bounds, exact inputs (keys repeating
    across every block border) equal to the oracle's selection."""
    x = _paged_topk_inputs(kit, batch, next_n, lens_2d, exact)
    topk.run_paged_topk(kit.provider(topk.PAGED_TOPK), kit.draw, x, topk.topk_sizes(kit.device).paged_topk,
                        return_values=True, exact=exact, what=f"{'exact' if exact else 'random'} inputs "
                                                               f"batch={batch} next_n={next_n}")


def test_topk_paged_long(kit: Kit) -> None:
    """topk 2048 over contexts up to 2048 + a margin, exact inputs: ties across the 2048 border."""
    x = _paged_topk_inputs(kit, 2, 2, True, True, context=2048 + topk.topk_sizes(kit.device).past)
    topk.run_paged_topk(kit.provider(topk.PAGED_TOPK), kit.draw, x, 2048, return_values=True, exact=True,
                        what="exact inputs batch=2 next_n=2")


@pytest.mark.mqa_large
def test_topk_long(kit: Kit) -> None:
    """topk 2048 over the engines' long rows (GPU: 64 x 64k and 8 x 1M keys; the CPU: 3 x 8k), causal
    windows, random inputs accepted within the bounds."""
    sizes = topk.topk_sizes(kit.device)
    for m, n in sizes.long:
        h, d = _topk_hd(kit, topk.TOPK, m, n)
        _enough_memory(kit, 3 * m * h * n * 8 + (2 << 30))
        x = topk.random_prefill(kit.draw, Problem(m, n, h, d), window="causal")
        topk.run_prefill_topk(kit.provider(topk.TOPK), kit.draw, x, 2048, positions="relative", return_values=True,
                              exact=False, what="random inputs window=causal")


# -- claims --------------------------------------------------------------------------------------------

def _claims(kit: Kit, claim: str, op: str) -> None:
    kit.require(op)
    if claim not in kit.spec.claims:
        pytest.skip(f"{kit.name} does not claim {claim} (claims {', '.join(sorted(kit.spec.claims)) or 'nothing'}): "
                    "the kit holds a provider only to what it claims")


def _claims_case(kit: Kit, op: str, what: str, problem: Problem) -> Any:
    return kit.draw.case(kit.name, op, what, problem)


def _claim_inputs(kit: Kit, op: str) -> tuple[Any, Problem]:
    """(the inputs of the claims' calls of ``op``, their problem)."""
    m, n = topk.topk_sizes(kit.device).claims
    if op in (topk.TOPK, PREFILL):
        h, d = _topk_hd(kit, op, m, n)
        x = topk.inside_windows(topk.random_prefill(kit.draw, Problem(m, n, h, d), window="ragged"))
        return x, Problem(m, n, h, d)
    if op == topk.PER_ROW:
        logits = topk.given_logits("ties", m, n, kit.seed, kit.device)
        ks, ke = make_windows("ragged", m, n, kit.seed)
        return (logits, ks.clamp(max=n).to(kit.device), ke.clamp(max=n).to(kit.device)), Problem(m, n, 1, 1)
    if kit.pair[0] != kit.pair[1]:
        pytest.skip("the paged cache is uint8 and holds q's fp8 flavour: mixed pairs are a prefill matter")
    ctx = topk.topk_sizes(kit.device).paged_context
    h, d = _topk_hd(kit, op, 12, ctx)
    return topk.decode_inputs(kit.draw, 6, 2, h, d, ctx, lens_2d=True, exact=False), Problem(12, ctx, h, d)


def _run_claim_call(kit: Kit, op: str, x: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of ``op`` on ``x``: (indices, values) for the top-k ops, (logits, None) for the logits ops."""
    provider = kit.provider(op)
    if op == PREFILL:
        return provider.fp8_mqa_logits(*x.args(), clean_logits=True), None
    if op == PAGED:
        return provider.fp8_paged_mqa_logits(*x.args(), clean_logits=True), None
    args = x if op == topk.PER_ROW else x.args()
    k = topk.topk_sizes(kit.device).paged_topk if op == topk.PAGED_TOPK else topk.topk_sizes(kit.device).topk
    return topk.call_topk(provider, op, args, k, return_values=True)


def _same_logits(first: tuple[torch.Tensor, Any], second: tuple[torch.Tensor, Any], case: Any, what: str,
                 rows: Any = slice(None), cols: int | None = None) -> None:
    a = first[0].cpu()[rows]
    b = second[0].cpu()
    if cols is not None:
        a, b = a[:, :cols], b[:, :cols]
    ab, bb = a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    if not torch.equal(ab, bb):
        r, c = (ab != bb).nonzero()[0].tolist()
        raise AssertionError(f"{case}: {what}: logits differ in their bits; first at ({r}, {c}): "
                             f"{float(a[r, c])!r} vs {float(b[r, c])!r}")


CLAIM_OPS = (topk.TOPK, topk.PAGED_TOPK, topk.PER_ROW)


@pytest.mark.parametrize("op", CLAIM_OPS)
def test_topk_claims_deterministic(kit: Kit, op: str) -> None:
    """A provider claiming ``deterministic``: three calls on the same inputs give bitwise-equal indices
    and values (the logits ops' repeatability is every provider's duty: test_prefill_repeatable)."""
    _claims(kit, "deterministic", op)
    x, problem = _claim_inputs(kit, op)
    case = _claims_case(kit, op, "claim deterministic: repeated calls", problem)
    first = _run_claim_call(kit, op, x)
    for i in (2, 3):
        topk.check_same(first, _run_claim_call(kit, op, x), case, f"call {i} against call 1")


@pytest.mark.parametrize("op", CLAIM_OPS + (PREFILL, PAGED))
def test_topk_claims_batch_invariant(kit: Kit, op: str) -> None:
    """A provider claiming ``batch_invariant``: a row computed alone, inside the batch, and with keys
    appended past its window gives the same indices and value bits (the logits ops: the same logits
    bits in its window)."""
    _claims(kit, "batch_invariant", op)
    x, problem = _claim_inputs(kit, op)
    case = _claims_case(kit, op, "claim batch_invariant", problem)
    check = _same_logits if op in (PREFILL, PAGED) else topk.check_same
    full = _run_claim_call(kit, op, x)
    if op == topk.PER_ROW:
        logits, ks, ke = x
        for r in topk.sample_rows(logits.shape[0]):
            alone = _run_claim_call(kit, op, (logits[r:r + 1], ks[r:r + 1], ke[r:r + 1]))
            check(full, alone, case, f"row {r} alone against row {r} of the batch", slice(r, r + 1))
        m, n = logits.shape
        wide = torch.cat([logits, torch.full((m, 300), 1e30, dtype=logits.dtype, device=logits.device)], dim=1)
        check(full, _run_claim_call(kit, op, (wide, ks, ke)), case, "300 larger keys appended past every window")
        return
    if op in (topk.TOPK, PREFILL):
        for r in topk.sample_rows(x.q.shape[0]):
            rows = slice(r, r + 1)
            alone = replace(x, q=x.q[rows], weights=x.weights[rows], ks=x.ks[rows], ke=x.ke[rows])
            check(full, _run_claim_call(kit, op, alone), case, f"row {r} alone against row {r} of the batch", rows)
        half = slice(1, x.q.shape[0])
        part = replace(x, q=x.q[half], weights=x.weights[half], ks=x.ks[half], ke=x.ke[half])
        check(full, _run_claim_call(kit, op, part), case, "rows 1.. as a batch of their own", half)
        more = topk.appended_keys(x, 300, kit.seed)
        extra: dict[str, Any] = {"cols": x.k.shape[0]} if op == PREFILL else {}
        check(full, _run_claim_call(kit, op, more), case, "300 keys appended past every window", **extra)
        return
    b, next_n = x.q.shape[:2]
    for s in topk.sample_rows(b):
        seq, rows = slice(s, s + 1), slice(s * next_n, (s + 1) * next_n)
        alone = replace(x, q=x.q[seq], weights=x.weights[rows], context_lens=x.context_lens[seq],
                        block_tables=x.block_tables[seq])
        check(full, _run_claim_call(kit, op, alone), case, f"sequence {s} alone against the batch", rows)
    longer = topk.appended_blocks(x, 2)
    extra = {"cols": x.max_context_len} if op == PAGED else {}
    check(full, _run_claim_call(kit, op, longer), case, "a longer max_context_len and block table (2 blocks past "
                                                      "every row's length)", **extra)


# -- memory (CUDA) ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", CLAIM_OPS)
def test_topk_memory(kit: Kit, op: str) -> None:
    """Peak extra device memory (``torch.cuda.max_memory_allocated`` after a reset, less the inputs and
    outputs) stays within the workspace bound, at a shape whose full logits are 16x that bound."""
    kit.require(op)
    if kit.device.type != "cuda":
        pytest.skip(f"peak memory is measured with torch.cuda.max_memory_allocated; {kit.device} has no such "
                    "counter (run the kit with --mqa-device cuda)")
    workspace = 16 << 20
    provider = kit.provider(op)
    if op == topk.PER_ROW:
        m, n = 512, 131072
        logits = torch.randn(m, n, device=kit.device)
        ks = torch.zeros(m, dtype=torch.int32, device=kit.device)
        ke = torch.full((m,), n, dtype=torch.int32, device=kit.device)
        args: tuple[Any, ...] = (logits, ks, ke)
        problem = Problem(m, n, 1, 1)
    elif op == topk.TOPK:
        m, n = 512, 131072
        h, d = _topk_hd(kit, op, m, n)
        problem = Problem(m, n, h, d)
        args = topk.random_prefill(kit.draw, problem, window="causal").args()
    else:
        if kit.pair[0] != kit.pair[1]:
            pytest.skip("the paged cache holds q's fp8 flavour: mixed pairs are a prefill matter")
        batch, next_n, ctx = 64, 2, 32768
        h, d = _topk_hd(kit, op, batch * next_n, ctx)
        problem = Problem(batch * next_n, ctx, h, d)
        from .data import make_paged_inputs

        args = make_paged_inputs(batch, next_n, h, d, ctx, seed=kit.seed, dtype=kit.dtypes[0],
                                 device=kit.device).args()
    case = _claims_case(kit, op, f"peak extra memory within workspace_bytes={workspace}", problem)
    k = 2048
    topk.call_topk(provider, op, args, k, return_values=True, workspace_bytes=workspace)  # compile, caches
    torch.cuda.synchronize(kit.device)
    torch.cuda.reset_peak_memory_stats(kit.device)
    base = torch.cuda.memory_allocated(kit.device)
    idx, vals = topk.call_topk(provider, op, args, k, return_values=True, workspace_bytes=workspace)
    torch.cuda.synchronize(kit.device)
    peak = torch.cuda.max_memory_allocated(kit.device) - base - idx.untyped_storage().nbytes() \
        - vals.untyped_storage().nbytes()
    full = problem.m * problem.n * 4
    assert peak <= workspace, (f"{case}: peak extra memory {peak / 2**20:.1f} MiB exceeds the workspace bound "
                               f"{workspace / 2**20:.0f} MiB (the full logits would be {full / 2**20:.0f} MiB)")
