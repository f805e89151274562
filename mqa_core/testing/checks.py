"""The kit's assertions: each failure names the case, the worst cell, what came, what was expected
and the bound it broke.

pytest rewrites this module's asserts (``pytest.register_assert_rewrite`` in the plugin), so a failure
shows both the sentence below and the compared values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..spec import Problem
from .bound import Accumulation
from .poison import Layout

#: DeepGEMM's bar (calc_diff < 1e-3 over in-window cells): what ``mqa bench`` still reports; the
#: kit itself checks every cell against :mod:`.bound`, which is far tighter.
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Case:
    """What a failure message must name: provider, op, case, sizes and how to reproduce it."""

    provider: str
    op: str
    what: str
    problem: Problem
    seed: int
    base_seed: int
    #: What reproduces the case, when not the kit's ``--mqa-seed BASE_SEED`` (``mqa tune``'s subset).
    reproduce: str | None = None

    def __str__(self) -> str:
        return (f"[{self.provider}] {self.op} {self.what} {self.problem} seed={self.seed} "
                f"(reproduce with {self.reproduce or f'--mqa-seed {self.base_seed}'})")


@dataclass(frozen=True)
class Windows:
    """Each row's visible keys [lo, hi) after clamping to [0, N]; an empty row has lo >= hi."""

    lo: torch.Tensor
    hi: torch.Tensor

    @classmethod
    def prefill(cls, ks: torch.Tensor, ke: torch.Tensor, n: int) -> "Windows":
        return cls(ks.long().cpu().clamp(0, n), ke.long().cpu().clamp(0, n))

    @classmethod
    def prefix(cls, visible: torch.Tensor, n: int) -> "Windows":
        """Rows that see positions [0, visible[row]) (the paged op)."""
        hi = visible.long().cpu().clamp(0, n)
        return cls(torch.zeros_like(hi), hi)

    def inside(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        lo, hi = self.lo.to(rows.device)[rows], self.hi.to(rows.device)[rows]
        return (cols >= lo) & (cols < hi)

    def mask(self, r0: int, r1: int, n: int, device: Any) -> torch.Tensor:
        """[r1 - r0, N] bool: in-window cells of rows r0..r1."""
        cols = torch.arange(n, device=device)[None, :]
        return (cols >= self.lo[r0:r1, None].to(device)) & (cols < self.hi[r0:r1, None].to(device))

    def where(self, m: int, n: int) -> str:
        """Where cell (m, n) sits relative to row m's window, for messages."""
        lo, hi = int(self.lo[m]), int(self.hi[m])
        span = f"row {m} sees keys [{lo}, {hi})" if lo < hi else f"row {m} sees no key"
        place = {lo: "the window's first key", hi - 1: "the window's last key", hi: "one past the window",
                 lo - 1: "one before the window"}.get(n, "") if lo < hi else ""
        return f"{place}; {span}" if place else span


#: Unit roundoff of each logits dtype the ops produce: the final rounding a cell's bound includes.
ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8}


def check_output(out: Any, shape: tuple[int, int], case: Case, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The returned object is logits of ``dtype`` (float32 unless the call asked for bf16) of the
    right shape with a contiguous last dim."""
    assert isinstance(out, torch.Tensor), f"{case}: returned {type(out).__name__}, not a torch.Tensor"
    assert type(out) is torch.Tensor, \
        f"{case}: returned {type(out).__module__}.{type(out).__qualname__}, a subclass: logits must be " \
        "exactly torch.Tensor"
    name = str(dtype).removeprefix("torch.")
    assert out.dtype == dtype, f"{case}: logits must be {name}, got {out.dtype}"
    assert tuple(out.shape) == tuple(shape), f"{case}: logits must have shape {list(shape)}, got {list(out.shape)}"
    assert out.shape[-1] <= 1 or out.stride(-1) == 1, \
        f"{case}: the last dim of logits must be contiguous, got strides {out.stride()}"
    return out


def _layout_text(layout: Layout | None) -> str:
    return f"; output {layout}" if layout is not None else ""


def _first(mask: torch.Tensor) -> tuple[int, int]:
    m, n = mask.nonzero()[0].tolist()
    return int(m), int(n)


def check_values(got: torch.Tensor, want: torch.Tensor, t: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                 case: Case, accumulation: Accumulation, wins: Windows, layout: Layout | None = None,
                 rounding: float = 0.0) -> float:
    """In-window cells (rows[i], cols[i]): finite, and within the bound of :mod:`.bound` of the exact
    value. ``got``, ``want`` and ``t`` (the magnitudes) are 1-D over those cells. ``rounding``: the
    unit roundoff ``u`` of a final rounding of each logit (bf16 logits: 2**-8), which adds
    ``u * (|exact| + bound)`` to each cell's bound. Returns the largest error as a fraction of its bound."""
    factor = accumulation.factor(case.problem.h, case.problem.d)
    got, want = got.double(), want.double()
    if got.numel() == 0:
        return 0.0
    bad = ~torch.isfinite(got)
    if bad.any():
        i = int(bad.nonzero()[0])
        m, n = int(rows[i]), int(cols[i])
        raise AssertionError(
            f"{case}: {int(bad.sum())} of {got.numel()} in-window cells checked are not finite; first at "
            f"({m}, {n}), {wins.where(m, n)}: got {float(got[i])}, expected {float(want[i]):.9g}"
            f"{_layout_text(layout)}")
    bound = factor * t
    if rounding:
        bound = bound + rounding * (want.abs() + bound)
    err = (got - want).abs()
    ratio = err / bound.clamp_min(torch.finfo(torch.float64).tiny)
    worst = int(ratio.argmax())
    over = int((err > bound).sum())
    if over:
        m, n = int(rows[worst]), int(cols[worst])
        raise AssertionError(
            f"{case}: {over} of {got.numel()} in-window cells exceed the error bound; worst at ({m}, {n}), "
            f"{wins.where(m, n)}: got {float(got[worst]):.9g}, expected {float(want[worst]):.9g}, "
            f"|error| {float(err[worst]):.3g} = {float(ratio[worst]):.3g}x the bound {float(bound[worst]):.3g} "
            f"(bound = {accumulation.text(case.problem.h, case.problem.d)}"
            + (f", plus {rounding:.3g} * (|exact| + that) for the logits' rounding" if rounding else "")
            + f", T = {float(t[worst]):.4g})"
            f"{_layout_text(layout)}")
    return float(ratio.max())


def check_mask(got: torch.Tensor, wins: Windows, case: Case, *, clean: bool, layout: Layout | None = None,
               rows_per_chunk: int = 4096) -> None:
    """Every in-window cell finite; with ``clean`` every other cell exactly -inf (identical -inf masks).

    Done on the output's device in row chunks, so a 2**31-cell output needs no host copy.
    """
    m_total, n = got.shape
    for r0 in range(0, m_total, rows_per_chunk):
        r1 = min(m_total, r0 + rows_per_chunk)
        chunk = got[r0:r1]
        inside = wins.mask(r0, r1, n, chunk.device)
        bad = inside & ~torch.isfinite(chunk)
        if bad.any():
            m, c = _first(bad)
            raise AssertionError(
                f"{case}: {int(bad.sum())} in-window cells of rows {r0}..{r1 - 1} are not finite (-inf mask or "
                f"NaN/inf values differ); first at ({r0 + m}, {c}), {wins.where(r0 + m, c)}: got "
                f"{float(chunk[m, c])}{_layout_text(layout)}")
        if clean:
            stray = ~inside & (chunk != float("-inf"))
            if stray.any():
                m, c = _first(stray)
                nan = int((stray & torch.isnan(chunk)).sum())
                raise AssertionError(
                    f"{case}: {int(stray.sum())} out-of-window cells of rows {r0}..{r1 - 1} are not -inf "
                    f"({nan} NaN: never written) with clean_logits=True, so the -inf mask differs; first at "
                    f"({r0 + m}, {c}), {wins.where(r0 + m, c)}: got {float(chunk[m, c]):.6g}"
                    f"{_layout_text(layout)}")


def check_logits(out: Any, want: torch.Tensor, t: torch.Tensor, case: Case, *, clean: bool,
                 accumulation: Accumulation, wins: Windows, layout: Layout | None = None,
                 dtype: torch.dtype = torch.float32) -> float:
    """The whole contract on one output, against the float64 ``want`` (-inf outside the windows) and
    the magnitudes ``t`` (:func:`.bound.magnitudes`): shape and dtype (``dtype``: the logits dtype
    asked for), the -inf mask (exact in every dtype), and every in-window cell within its own bound
    (with the dtype's final rounding). Returns the largest error as a fraction of its bound."""
    out = check_output(out, (want.shape[0], want.shape[1]), case, dtype)
    check_mask(out, wins, case, clean=clean, layout=layout)
    inside = wins.mask(0, want.shape[0], want.shape[1], want.device)
    rows, cols = inside.nonzero(as_tuple=True)
    got = out.to(want.device)[rows, cols]
    return check_values(got, want[rows, cols], t[rows, cols], rows, cols, case, accumulation, wins, layout,
                        ROUNDING[dtype])


def check_identical(first: torch.Tensor, second: torch.Tensor, case: Case) -> None:
    """Two calls on the same inputs must give bit-identical logits (no races, no stale reads)."""
    a, b = first.detach().cpu(), second.detach().cpu()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if not bool(same.all()):
        m, n = _first(~same)
        raise AssertionError(
            f"{case}: two identical calls differ in {int((~same).sum())} of {same.numel()} cells; "
            f"first at ({m}, {n}): {float(a[m, n])!r} then {float(b[m, n])!r}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of ``t``'s storage (padding and what other views see included), as uint8."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class Untouched:
    """Copies of every byte of a call's input storages, taken before the call; :meth:`check` after it
    says which input the provider wrote (the ops mutate nothing, not even to restore it later)."""

    def __init__(self, named: dict[str, torch.Tensor]) -> None:
        self.saved = [(name, t, _bytes(t).clone()) for name, t in named.items()]

    def check(self, case: Case) -> None:
        for name, t, before in self.saved:
            now = _bytes(t)
            if now.shape != before.shape or not torch.equal(now, before):
                if now.shape != before.shape:
                    detail = f"its storage was resized from {before.numel()} to {now.numel()} bytes"
                else:
                    changed = (now != before).nonzero().reshape(-1)
                    detail = (f"{changed.numel()} of {now.numel()} bytes of its storage differ, first at byte "
                              f"{int(changed[0])}")
                raise AssertionError(f"{case}: the provider wrote its input {name} ({detail}): the ops "
                                     "mutate nothing; a kernel must leave every input as it found it")


def check_fresh(first: torch.Tensor, kept: torch.Tensor, second: Any, case: Case) -> None:
    """A result stays the caller's: after a second call with other inputs, the first result still holds
    what it held (``kept``, its copy) and the second lives in memory of its own."""
    from ..result import overlap

    if isinstance(second, torch.Tensor) and overlap(second, (first,)) is not None:
        raise AssertionError(f"{case}: the second call's result lies in the first call's memory (at "
                             f"{second.data_ptr():#x}, the first at {first.data_ptr():#x}): the provider hands "
                             "back a buffer it writes again (copy a static CUDA-graph output before returning it)")
    if not torch.equal(first.view(torch.int32).cpu(), kept.view(torch.int32).cpu()):  # bitwise: NaN too
        raise AssertionError(f"{case}: a second call with other inputs changed the first call's result: the "
                             "provider writes a buffer it already handed back (copy a static CUDA-graph output "
                             "before returning it)")
