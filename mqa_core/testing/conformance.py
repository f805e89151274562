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
from ..spec import Problem, ProviderSpec
from . import large, runner
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
        params = [(n, p) for n in names for p in _pairs_to_run(config, n)]
        metafunc.parametrize("provider_name,dtype_pair", params, ids=[f"{n}-{pair_id(p)}" for n, p in params])
    elif "provider_name" in metafunc.fixturenames:
        metafunc.parametrize("provider_name", names, ids=names)
    if "odd_size" in metafunc.fixturenames:
        odd = sizes_for(kit_device(config)).odd
        metafunc.parametrize("odd_size", odd, ids=[f"M{m}-N{n}" for m, n in odd])


def _pairs_to_run(config: pytest.Config, name: str) -> list[Pair]:
    chosen = config.stash.get(DTYPE_PAIR, None)
    if chosen is not None:
        return [chosen]
    try:
        spec = named.spec_named(name)
    except ValueError:  # ambiguous: each case then says so (_spec_or_fail)
        spec = None
    return declared_pairs(spec, kit_arch(config)) if spec is not None else [("float8_e4m3fn", "float8_e4m3fn")]


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
    op = PREFILL if PREFILL in provider_spec.ops else PAGED
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
