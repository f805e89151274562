"""The conformance suite, collected when pytest runs with ``--mqa-provider NAME`` (see ``plugin.py``).

Every case draws fresh random inputs (never zeros; the seed is in every failure message and
``--mqa-seed`` reproduces a run), calls the provider exactly as an engine would get it
(``MQA_PROVIDER=NAME``, then ``get_provider``), right after poisoning the allocator with NaN, and
compares with the float64 oracle of :mod:`mqa_core.reference`: calc_diff < 1e-3 in-window, no NaN
or inf in-window, and with ``clean_logits`` every other cell -inf.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from ..arch import ANY_ARCH, KNOWN_ARCHS
from ..errors import ProviderUnavailableError
from ..provider import Provider, load_object
from ..reference import fp8_mqa_logits_ref
from ..spec import Problem, ProviderSpec
from . import providers as named
from .cases import (
    HEAD_DIMS,
    HEADS,
    PAGED_BLOCK_SIZE,
    PAGED_CASES,
    PROBES,
    WINDOW_KINDS,
    accepts,
    main_heads_dims,
    make_windows,
    short_context_lens,
    sizes_for,
)
from .checks import Case, check_identical, check_logits, poisoned_call
from .data import Inputs, make_inputs, make_paged_inputs
from .plugin import BASE_SEED, kit_arch, kit_device

PREFILL = "fp8_mqa_logits"
PAGED = "fp8_paged_mqa_logits"
GRID = tuple((h, d) for h in HEADS for d in HEAD_DIMS) + PROBES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = list(metafunc.config.getoption("mqa_provider"))
    if "dtype_name" in metafunc.fixturenames:
        pairs = [(n, dt) for n in names for dt in _declared_dtypes(n)]
        metafunc.parametrize("provider_name,dtype_name", pairs, ids=[f"{n}-{dt}" for n, dt in pairs])
    elif "provider_name" in metafunc.fixturenames:
        metafunc.parametrize("provider_name", names, ids=names)
    if "odd_size" in metafunc.fixturenames:
        odd = sizes_for(kit_device(metafunc.config)).odd
        metafunc.parametrize("odd_size", odd, ids=[f"M{m}-N{n}" for m, n in odd])


def _declared_dtypes(name: str) -> list[str]:
    spec = named.spec_named(name)
    return sorted(spec.dtypes) if spec is not None else ["float8_e4m3fn"]


@dataclass
class Kit:
    """One provider under test on one device, and the current case's seed."""

    name: str
    spec: ProviderSpec
    device: torch.device
    arch: str
    base_seed: int
    nodeid: str
    #: (provider, op, dtype) -> Provider, or the message every case of it fails with; one per session.
    providers: dict[tuple[str, str, str], Any]
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        self.dtype = "float8_e4m3fn" if "float8_e4m3fn" in self.spec.dtypes else sorted(self.spec.dtypes)[0]

    @property
    def seed(self) -> int:
        """Fresh per run (the base seed is random unless --mqa-seed), distinct per case."""
        return (self.base_seed + zlib.crc32(self.nodeid.encode())) % 2**31

    def provider(self, op: str = PREFILL, dtype: str | None = None) -> Provider:
        key = (self.name, op, dtype or self.dtype)
        if key not in self.providers:
            try:
                self.providers[key] = named.provider_named(self.name, self.arch, op=op, dtype=key[2])
            except ProviderUnavailableError as exc:
                self.providers[key] = (f"provider {self.name} cannot serve {op} ({key[2]}) on "
                                       f"{self.device} ({self.arch}) under MQA_PROVIDER={self.name}:\n{exc}")
        got = self.providers[key]
        if isinstance(got, str):
            pytest.fail(got, pytrace=False)
        return got

    def require(self, op: str) -> None:
        if op not in self.spec.ops:
            pytest.skip(f"{self.name} does not declare {op}")

    def case(self, op: str, what: str, problem: Problem) -> Case:
        return Case(self.name, op, what, problem, self.seed, self.base_seed)

    def main_problem(self, m: int, n: int) -> Problem:
        self.require(PREFILL)
        hd = main_heads_dims(self.spec, m, n)
        if hd is None:
            pytest.fail(f"provider {self.name}'s shape limits accept no (H, D) in H={HEADS} x D={HEAD_DIMS} "
                        f"at M={m}, N={n}: the kit has nothing it may run", pytrace=False)
        return Problem(m, n, *hd)


@pytest.fixture(scope="session")
def provider_cache() -> dict[tuple[str, str, str], Any]:
    return {}


@pytest.fixture
def kit(provider_name: str, provider_cache: dict[tuple[str, str, str], Any],
        request: pytest.FixtureRequest) -> Kit:
    spec = named.spec_named(provider_name)
    if spec is None:
        from .. import registry

        broken = "".join(f"\n  {b}" for b in registry.state().discovery.broken)
        pytest.fail(f"provider {provider_name!r} is not installed; installed: "
                    f"{', '.join(named.installed_names()) or 'none'}{broken}", pytrace=False)
    config = request.config
    return Kit(provider_name, spec, kit_device(config), kit_arch(config), config.stash[BASE_SEED],
               request.node.nodeid, provider_cache)


# -- helpers -------------------------------------------------------------------------------------

def _reference(x: Inputs) -> torch.Tensor:
    # fp8 -> float64 on the CPU (every fp8 flavour converts there), the product on the device.
    dev = x.q.device
    return fp8_mqa_logits_ref(x.q.cpu().double().to(dev), x.k.cpu().double().to(dev), x.k_scale,
                              x.weights, x.ks, x.ke)


def run_prefill(kit: Kit, problem: Problem, *, window: str = "ragged", clean: bool = True,
                k_scale_2d: bool = False, dtype: str | None = None, what: str = ""
                ) -> tuple[Inputs, torch.Tensor, Case]:
    """One poisoned call on fresh inputs, checked against the oracle; returns what a case reuses."""
    kit.require(PREFILL)
    dtype = dtype or kit.dtype
    seed = kit.seed
    x = make_inputs(problem, device=kit.device, window="full", dtype=getattr(torch, dtype), seed=seed,
                    k_scale_2d=k_scale_2d)
    ks, ke = make_windows(window, problem.m, problem.n, seed)
    x = replace(x, ks=ks.to(kit.device), ke=ke.to(kit.device))
    case = kit.case(PREFILL, what or (f"window={window} clean_logits={clean} "
                                      f"k_scale={'[N, 1]' if k_scale_2d else '[N]'} dtype={dtype}"), problem)
    provider = kit.provider(PREFILL, dtype)
    out = poisoned_call(lambda: provider.fp8_mqa_logits(*x.args(), clean_logits=clean), kit.device,
                        problem.m, problem.n)
    check_logits(out, _reference(x), case, clean=clean, windows=(ks, ke))
    return x, out, case


# -- the provider as declared --------------------------------------------------------------------

def test_spec(kit: Kit) -> None:
    """Spec sanity: known archs, an int priority, a load path that resolves, cheap well-behaved hooks."""
    spec = kit.spec
    unknown = spec.archs - set(KNOWN_ARCHS) - {ANY_ARCH}
    assert not unknown, f"[{kit.name}] declares unknown archs {sorted(unknown)}; known: {KNOWN_ARCHS}"
    assert isinstance(spec.priority, int) and not isinstance(spec.priority, bool), \
        f"[{kit.name}] priority must be an int, got {spec.priority!r}"
    obj = load_object(spec.load)
    missing = [op for op in sorted(spec.ops) if not callable(getattr(obj, op, None))]
    assert not missing, f"[{kit.name}] {spec.load} has no method for declared ops {missing}"
    if spec.check is not None:
        t0 = time.perf_counter()
        for arch in KNOWN_ARCHS:
            reason = spec.check(arch)
            assert reason is None or isinstance(reason, str), \
                f"[{kit.name}] check({arch!r}) must return None or a reason string, got {reason!r}"
        slow = time.perf_counter() - t0
        assert slow < 5.0, f"[{kit.name}] check() took {slow:.1f} s over {len(KNOWN_ARCHS)} archs: cache it"
    if spec.shape_limits is not None:
        for h, d in GRID:
            reason = spec.shape_limits(Problem(64, 256, h, d))
            assert reason is None or isinstance(reason, str), \
                f"[{kit.name}] shape_limits(H={h}, D={d}) must return None or a reason, got {reason!r}"


def test_selection(kit: Kit) -> None:
    """MQA_PROVIDER=NAME selects it on this device; MQA_DISABLE_PROVIDERS=NAME blocks it."""
    op = PREFILL if PREFILL in kit.spec.ops else PAGED
    chosen = named.explain_with(kit.arch, op=op, MQA_PROVIDER=kit.name)
    assert chosen.chosen == kit.name, f"[{kit.name}] is not selectable on {kit.arch}:\n{chosen}"
    blocked = ",".join(filter(None, (os.environ.get("MQA_DISABLE_PROVIDERS", ""), kit.name)))
    d = named.explain_with(kit.arch, op=op, MQA_DISABLE_PROVIDERS=blocked)
    assert d.candidate(kit.name).code == "blocked" and d.chosen != kit.name, \
        f"[{kit.name}] MQA_DISABLE_PROVIDERS={blocked} does not block it:\n{d}"


# -- prefill -------------------------------------------------------------------------------------

@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("window", WINDOW_KINDS)
def test_prefill_window(kit: Kit, window: str, clean: bool) -> None:
    """Causal, full, chunked, ragged, corner-case and all-empty windows, clean_logits on and off."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window=window, clean=clean)


@pytest.mark.parametrize("h,d", GRID, ids=[f"H{h}-D{d}" for h, d in GRID])
def test_prefill_heads_dims(kit: Kit, h: int, d: int) -> None:
    """Every (H, D) the spec accepts is right; every one it rejects is rejected by selection."""
    kit.require(PREFILL)
    m, n = sizes_for(kit.device).grid
    problem = Problem(m, n, h, d)
    if accepts(kit.spec, problem):
        run_prefill(kit, problem, window="ragged", clean=True)
        return
    c = named.explain_with(kit.arch, problem=problem).candidate(kit.name)
    assert c.code == "shape", (f"[{kit.name}] shape_limits reject {problem}, but selection gives "
                               f"{'accepted' if c.accepted else f'[{c.code}] {c.reason}'}, not [shape]")
    with pytest.raises(ProviderUnavailableError):
        named.provider_named(kit.name, kit.arch, problem=problem)


def test_prefill_odd_sizes(kit: Kit, odd_size: tuple[int, int]) -> None:
    """M = 1, N = 1, N < M, exact tiles and one past them."""
    run_prefill(kit, kit.main_problem(*odd_size), window="ragged", clean=True)


def test_prefill_k_scale_2d(kit: Kit) -> None:
    """k_scale may arrive as [N, 1] (vLLM) as well as [N]."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window="causal", clean=True, k_scale_2d=True)


def test_prefill_repeatable(kit: Kit) -> None:
    """Two identical calls give bit-identical logits, each after re-poisoning the allocator."""
    m, n = sizes_for(kit.device).windows
    x, first, case = run_prefill(kit, kit.main_problem(m, n), window="edges", clean=True)
    provider = kit.provider(PREFILL)
    second = poisoned_call(lambda: provider.fp8_mqa_logits(*x.args(), clean_logits=True), kit.device,
                           *first.shape)
    check_identical(first, second, replace(case, what=case.what + " (second call)"))


def test_prefill_dtype(kit: Kit, dtype_name: str) -> None:
    """Each declared fp8 flavour (e4m3fnuz is what gfx942 reads) on a ragged window."""
    m, n = sizes_for(kit.device).windows
    run_prefill(kit, kit.main_problem(m, n), window="ragged", clean=True, dtype=dtype_name)


# -- decode (paged) ------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,next_n,lens_2d,clean", PAGED_CASES,
                         ids=[f"B{b}-next{nn}-lens{'2d' if l2 else '1d'}-{'clean' if c else 'unclean'}"
                              for b, nn, l2, c in PAGED_CASES])
def test_paged(kit: Kit, batch: int, next_n: int, lens_2d: bool, clean: bool) -> None:
    """The decode op over DeepGEMM's paged cache: short contexts, block edges, 1-D and 2-D lens."""
    kit.require(PAGED)
    ctx = sizes_for(kit.device).paged_context
    hd = main_heads_dims(kit.spec, batch * next_n, ctx) or (32, 128)
    seed = kit.seed
    x = make_paged_inputs(batch, next_n, *hd, ctx, block_size=PAGED_BLOCK_SIZE, seed=seed,
                          dtype=getattr(torch, kit.dtype))
    lens = short_context_lens(x.context_lens, next_n, ctx)
    if lens_2d:
        lens = lens[:, None] - next_n + torch.arange(1, next_n + 1, dtype=lens.dtype)[None, :]
    x = replace(x, q=x.q.to(kit.device), kv_cache=x.kv_cache.to(kit.device),
                weights=x.weights.to(kit.device), context_lens=lens.to(kit.device),
                block_tables=x.block_tables.to(kit.device))
    problem = Problem(batch * next_n, ctx, *hd)
    case = kit.case(PAGED, f"batch={batch} next_n={next_n} context_lens={'[B, next_n]' if lens_2d else '[B]'}"
                    f"={lens.tolist()} block_size={PAGED_BLOCK_SIZE} clean_logits={clean}", problem)
    provider = kit.provider(PAGED)
    out = poisoned_call(lambda: provider.fp8_paged_mqa_logits(*x.args(), clean_logits=clean), kit.device,
                        batch * next_n, ctx)
    check_logits(out, x.reference(), case, clean=clean)
