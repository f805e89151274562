"""The kit's case runner: fresh inputs, one call with the output poisoned, the whole contract checked
against the float64 oracle.

This is the one piece of code that checks a provider on a case: the conformance suite's cases go
through it (after selecting the provider an engine would get, see ``conformance.py``), and so does
``mqa tune``'s kit subset. It needs no pytest (``mqa tune`` runs without it); a failure is an
``AssertionError`` whose message names the case, the worst cell and the bound it broke.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..provider import Provider
from ..reference import fp8_mqa_logits_ref
from ..spec import DTYPES, LOGITS_OPS, Problem
from .bound import Accumulation, default_accumulation, magnitudes
from .cases import PAGED_BLOCK_SIZE, Pair, arbitrary_lens, make_windows, pair_id, short_context_lens
from .checks import Case, Untouched, Windows, check_fresh, check_logits, check_mask, check_output, check_values
from .data import Inputs, PagedInputs, exact, make_inputs, make_paged_inputs
from .large import Sampled, exact_at, paged_keys_at
from .layouts import prefill_layout
from .poison import Layout, poisoned_call

PREFILL, PAGED = LOGITS_OPS
SAME_FLAVOUR: Pair = ("float8_e4m3fn", "float8_e4m3fn")


@dataclass(frozen=True)
class Draw:
    """How a case's inputs are drawn and judged: the device, the (q, k) dtype pair, the error model
    of the per-cell bound, the case's seed and the run's base seed (which reproduces it)."""

    device: torch.device
    pair: Pair
    accumulation: Accumulation
    seed: int
    base_seed: int
    #: How a failure says to reproduce it (default: the kit's ``--mqa-seed BASE_SEED``).
    reproduce: str | None = None

    def __post_init__(self) -> None:
        if len(self.pair) != 2 or any(d not in DTYPES for d in self.pair):
            raise ValueError(f"Draw.pair must be (q, k) dtype names from {', '.join(DTYPES)}; got {self.pair!r}")

    @classmethod
    def on(cls, device: torch.device, seed: int, *, base_seed: int | None = None, pair: Pair = SAME_FLAVOUR,
           reproduce: str | None = None) -> Draw:
        """A draw with the device's default error model; the base seed defaults to ``seed``."""
        return cls(device, pair, default_accumulation(device), seed, seed if base_seed is None else base_seed,
                   reproduce)

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        return getattr(torch, self.pair[0]), getattr(torch, self.pair[1])

    def case(self, provider: str, op: str, what: str, problem: Problem) -> Case:
        return Case(provider, op, f"{what} dtype={pair_id(self.pair)}", problem, self.seed, self.base_seed,
                    self.reproduce)


# -- the oracle ------------------------------------------------------------------------------------

def expected(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact logits with -inf outside the windows, magnitudes T), float64 on the inputs' device."""
    q, k = exact(x.q), exact(x.k)
    return fp8_mqa_logits_ref(q, k, x.k_scale, x.weights, x.ks, x.ke), magnitudes(x.q, x.k, x.k_scale, x.weights)


def expected_paged(x: PagedInputs) -> tuple[torch.Tensor, torch.Tensor, Windows]:
    """(exact logits, magnitudes T, windows) for a paged call, float64 on the inputs' device."""
    b, next_n, h, d = x.q.shape
    want = x.reference().to(x.q.device)
    bs = x.kv_cache.shape[1]
    covered = min(x.max_context_len, x.block_tables.shape[1] * bs)
    wins = Windows.prefix(x.visible().clamp(max=covered), x.max_context_len)
    t = torch.zeros(b * next_n, x.max_context_len, dtype=torch.float64, device=x.q.device)
    pos = torch.arange(covered, device=x.q.device)
    for bi in range(b):
        rows = torch.full_like(pos, bi * next_n)
        keys, scales = paged_keys_at(x, rows, pos)
        rows_b = slice(bi * next_n, (bi + 1) * next_n)
        t[rows_b, :covered] = magnitudes(x.q[bi], keys, scales, x.weights[rows_b])
    return want, t, wins


def check_prefill(out: Any, x: Inputs, case: Case, *, clean: bool, accumulation: Accumulation | None = None,
                  layout: Layout | None = None, dtype: torch.dtype = torch.float32) -> float:
    """The whole contract on one prefill output for inputs ``x`` (see :func:`.checks.check_logits`);
    the bound's error model defaults to the inputs' device's. Returns the worst error / its bound."""
    want, t = expected(x)
    return check_logits(out, want, t, case, clean=clean, accumulation=accumulation or default_accumulation(x.q.device),
                        wins=Windows.prefill(x.ks, x.ke, x.k.shape[0]), layout=layout, dtype=dtype)


def check_paged(out: Any, x: PagedInputs, case: Case, *, clean: bool, accumulation: Accumulation | None = None,
                layout: Layout | None = None, dtype: torch.dtype = torch.float32) -> float:
    """:func:`check_prefill` for the paged op: each row sees its leading positions, capped by its table."""
    want, t, wins = expected_paged(x)
    return check_logits(out, want, t, case, clean=clean, accumulation=accumulation or default_accumulation(x.q.device),
                        wins=wins, layout=layout, dtype=dtype)


def _logits_kw(dtype: torch.dtype) -> dict[str, Any]:
    """The call's keyword for a logits dtype: none for float32 (every provider's call, unchanged)."""
    return {} if dtype == torch.float32 else {"logits_dtype": dtype}


# -- cases -----------------------------------------------------------------------------------------

def prefill_inputs(draw: Draw, problem: Problem, *, window: str = "ragged", k_scale_2d: bool = False,
                   positive: bool = False, layout: str | None = None) -> Inputs:
    """Fresh inputs on the draw's device: one of :data:`.cases.WINDOW_KINDS`, optionally as views."""
    q_dtype, k_dtype = draw.dtypes
    x = make_inputs(problem, device=draw.device, window="full", dtype=q_dtype, k_dtype=k_dtype, seed=draw.seed,
                    k_scale_2d=k_scale_2d, positive=positive)
    ks, ke = make_windows(window, problem.m, problem.n, draw.seed)
    x = replace(x, ks=ks.to(draw.device), ke=ke.to(draw.device))
    return prefill_layout(x, layout) if layout is not None else x


def run_prefill(provider: Provider, draw: Draw, problem: Problem, *, window: str = "ragged", clean: bool = True,
                k_scale_2d: bool = False, positive: bool = False, layout: str | None = None,
                what: str = "", logits_dtype: torch.dtype = torch.float32) -> tuple[Inputs, torch.Tensor, Case]:
    """One poisoned prefill call on fresh inputs, checked against the oracle; returns what a case reuses."""
    x = prefill_inputs(draw, problem, window=window, k_scale_2d=k_scale_2d, positive=positive, layout=layout)
    case = draw.case(provider.name, PREFILL, what or (f"window={window} clean_logits={clean} "
                                                      f"k_scale={'[N, 1]' if k_scale_2d else '[N]'}"
                                                      + (" positive data" if positive else "")
                                                      + (f" layout={layout}" if layout else "")
                                                      + (f" logits_dtype={logits_dtype}"
                                                         if logits_dtype != torch.float32 else "")), problem)
    untouched = Untouched(prefill_named(x))
    kw = _logits_kw(logits_dtype)
    out, out_layout = poisoned_call(lambda: provider.fp8_mqa_logits(*x.args(), clean_logits=clean, **kw), draw.device)
    untouched.check(case)
    check_prefill(out, x, case, clean=clean, accumulation=draw.accumulation, layout=out_layout, dtype=logits_dtype)
    return x, out, case


def prefill_named(x: Inputs) -> dict[str, torch.Tensor]:
    """A prefill call's tensor arguments by name."""
    return {"q": x.q, "k": x.k, "k_scale": x.k_scale, "weights": x.weights, "cu_seqlen_ks": x.ks,
            "cu_seqlen_ke": x.ke}


def paged_named(x: PagedInputs, schedule: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A paged call's tensor arguments by name (the schedule where there is one)."""
    named = {"q": x.q, "kv_cache": x.kv_cache, "weights": x.weights, "context_lens": x.context_lens,
             "block_tables": x.block_tables}
    return named if schedule is None else {**named, "schedule": schedule}


def run_fresh(provider: Provider, draw: Draw, x: Inputs | PagedInputs, what: str) -> None:
    """Two calls of one signature, the second with other weights (so other logits): the first result
    must still hold what it held, in memory of its own (a provider that reuses its output buffer, as
    a CUDA graph's static output would, fails)."""
    paged = isinstance(x, PagedInputs)
    op = PAGED if paged else PREFILL
    call = getattr(provider, op)
    cols = x.max_context_len if isinstance(x, PagedInputs) else x.k.shape[0]
    problem = Problem(x.weights.shape[0], cols, x.q.shape[-2], x.q.shape[-1])
    case = draw.case(provider.name, op, what, problem)
    first = check_output(call(*x.args(), clean_logits=True), (problem.m, problem.n), case)
    kept = first.clone()
    other = replace(x, weights=x.weights * 0.5)  # exact: every finite, nonzero logit halves
    second = call(*other.args(), clean_logits=True)
    if draw.device.type == "cuda":
        torch.cuda.synchronize(draw.device)
    check_fresh(first, kept, second, case)


def paged_inputs(draw: Draw, batch: int, next_n: int, h: int, d: int, context: int, *, lens_2d: bool,
                 positive: bool = False, pool_pad_bytes: int = 0) -> PagedInputs:
    """Decode inputs holding q's fp8 flavour: short and block-edge lengths (1-D), or arbitrary per-row
    ones (2-D: zero, the whole context, decreasing within a sequence)."""
    if draw.pair[0] != draw.pair[1]:
        raise ValueError(f"the paged cache is uint8 and holds q's fp8 flavour: no mixed pair, got {draw.pair}")
    lens = (arbitrary_lens(batch, next_n, context, draw.seed) if lens_2d
            else short_context_lens(torch.randint(next_n, context + 1, (batch,),
                                                  generator=torch.Generator().manual_seed(draw.seed)),
                                    next_n, context))
    return make_paged_inputs(batch, next_n, h, d, context, block_size=PAGED_BLOCK_SIZE, seed=draw.seed,
                             dtype=draw.dtypes[0], context_lens=lens, positive=positive,
                             pool_pad_bytes=pool_pad_bytes, device=draw.device)


def run_paged(provider: Provider, draw: Draw, x: PagedInputs, *, clean: bool, what: str,
              schedule: torch.Tensor | None = None, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One poisoned decode call on ``x`` (with the call hint ``schedule``), checked against the oracle."""
    b, next_n, h, d = x.q.shape
    problem = Problem(b * next_n, x.max_context_len, h, d)
    lens = x.context_lens.tolist()
    case = draw.case(provider.name, PAGED,
                     f"{what} context_lens={'[B, next_n]' if x.context_lens.dim() == 2 else '[B]'}="
                     f"{lens} block_size={x.kv_cache.shape[1]} clean_logits={clean}"
                     + (f" logits_dtype={logits_dtype}" if logits_dtype != torch.float32 else ""), problem)
    untouched = Untouched(paged_named(x, schedule))
    kw = _logits_kw(logits_dtype)
    out, out_layout = poisoned_call(lambda: provider.fp8_paged_mqa_logits(*x.args(), clean_logits=clean,
                                                                          schedule=schedule, **kw), draw.device)
    untouched.check(case)
    check_paged(out, x, case, clean=clean, accumulation=draw.accumulation, layout=out_layout, dtype=logits_dtype)
    return out


def run_sampled(provider: Provider, draw: Draw, problem: Problem, sampled: Sampled) -> torch.Tensor:
    """One poisoned call (clean_logits) on a large-index case: the output's shape and its whole -inf
    mask on the device, and the values at the case's sampled cells within their bounds."""
    x = sampled.inputs
    op, cols = (PAGED, x.max_context_len) if isinstance(x, PagedInputs) else (PREFILL, x.k.shape[0])
    case = draw.case(provider.name, op, f"large index: {sampled.what}", problem)
    call = getattr(provider, op)
    out, layout = poisoned_call(lambda: call(*x.args(), clean_logits=True), draw.device)
    out = check_output(out, (sampled.windows.lo.numel(), cols), case)
    check_mask(out, sampled.windows, case, clean=True, layout=layout)
    want, t = exact_at(sampled)
    check_values(out[sampled.rows, sampled.cols], want, t, sampled.rows.cpu(), sampled.cols.cpu(), case,
                 draw.accumulation, sampled.windows, layout)
    return out
