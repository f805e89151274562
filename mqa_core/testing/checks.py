"""The kit's assertions: each failure names the case and says by how much the output misses.

pytest rewrites this module's asserts (``pytest.register_assert_rewrite`` in the plugin), so a failure
shows both the sentence below and the compared values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..spec import Problem
from .data import calc_diff

#: DeepGEMM's bar: calc_diff against a float64 oracle over in-window cells.
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

    def __str__(self) -> str:
        return (f"[{self.provider}] {self.op} {self.what} {self.problem} seed={self.seed} "
                f"(reproduce with --mqa-seed {self.base_seed})")


def poison(device: torch.device, *numels: int) -> None:
    """Leave NaN-filled float32 blocks of these sizes in the allocator's free memory.

    The ops allocate their own output, so "poisoning the output" means this: on CUDA the caching
    allocator hands a freed block of the right size to the next allocation, so cells a kernel never
    writes read back as NaN. On the CPU reuse is up to the C allocator (large blocks come back as
    fresh zero pages), so there an unwritten cell shows as 0 instead, which the checks catch too.
    """
    blocks = [torch.full((n,), float("nan"), dtype=torch.float32, device=device) for n in numels if n > 0]
    del blocks


#: Row paddings providers use for their output (the contract lets the row stride exceed N).
ROW_PADDINGS = (1, 16, 128, 256)


def poisoned_call(fn: Callable[[], torch.Tensor], device: torch.device, rows: int, cols: int
                  ) -> torch.Tensor:
    """``fn()`` right after poisoning blocks the size of a [rows, cols] output, exact and row-padded."""
    sizes = dict.fromkeys(rows * (-(-cols // pad) * pad) for pad in ROW_PADDINGS)
    poison(device, *sizes)
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def _at(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def _window_text(windows: tuple[torch.Tensor, torch.Tensor] | None, row: int) -> str:
    if windows is None:
        return ""
    ks, ke = windows
    return f"; row {row} sees keys [{int(ks[row])}, {int(ke[row])})"


def check_logits(out: Any, ref: torch.Tensor, case: Case, *, clean: bool,
                 windows: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
    """Assert the contract on one output against a float64 reference (-inf outside windows).

    In-window cells must be finite and within :data:`TOLERANCE` by calc_diff; with ``clean`` every
    out-of-window cell must be -inf (so the -inf masks are identical); without it they are not read.
    Returns the calc_diff.
    """
    assert isinstance(out, torch.Tensor), f"{case}: returned {type(out).__name__}, not a torch.Tensor"
    assert out.dtype == torch.float32, f"{case}: logits must be float32, got {out.dtype}"
    assert tuple(out.shape) == tuple(ref.shape), \
        f"{case}: logits must have shape {list(ref.shape)}, got {list(out.shape)}"
    assert out.shape[-1] <= 1 or out.stride(-1) == 1, \
        f"{case}: the last dim of logits must be contiguous, got strides {out.stride()}"
    wins = None if windows is None else (windows[0].cpu(), windows[1].cpu())
    got = out.detach().to("cpu", torch.float64)
    want = ref.detach().to("cpu", torch.float64)
    inside = torch.isfinite(want)
    n_in = int(inside.sum())

    bad = inside & ~torch.isfinite(got)
    if bad.any():
        m, n = _at(bad)
        raise AssertionError(
            f"{case}: {int(bad.sum())} of {n_in} in-window cells are not finite (-inf mask or NaN/inf "
            f"values differ); first at ({m}, {n}): got {float(got[m, n])}, want {float(want[m, n]):.6g}"
            f"{_window_text(wins, m)}")
    if clean:
        stray = ~inside & (got != float("-inf"))
        if stray.any():
            m, n = _at(stray)
            nan = int((stray & torch.isnan(got)).sum())
            raise AssertionError(
                f"{case}: {int(stray.sum())} of {int((~inside).sum())} out-of-window cells are not -inf "
                f"({nan} NaN: never written) with clean_logits=True, so the -inf mask differs; first "
                f"at ({m}, {n}): got {float(got[m, n]):.6g}{_window_text(wins, m)}")
    if n_in == 0:
        return 0.0
    diff = calc_diff(got, want)
    if not diff < TOLERANCE:
        err = (got - want).abs().where(inside, torch.zeros_like(got))
        m, n = _at(err == err.max())
        raise AssertionError(
            f"{case}: calc_diff {diff:.3e} >= {TOLERANCE:.0e} over {n_in} in-window cells; largest "
            f"error {float(err[m, n]):.4g} at ({m}, {n}): got {float(got[m, n]):.6g}, "
            f"want {float(want[m, n]):.6g}")
    return diff


def check_identical(first: torch.Tensor, second: torch.Tensor, case: Case) -> None:
    """Two calls on the same inputs must give bit-identical logits (no races, no stale reads)."""
    a, b = first.detach().cpu(), second.detach().cpu()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if not bool(same.all()):
        m, n = _at(~same)
        raise AssertionError(
            f"{case}: two identical calls differ in {int((~same).sum())} of {same.numel()} cells; "
            f"first at ({m}, {n}): {float(a[m, n])!r} then {float(b[m, n])!r}")
