"""Make every output cell a kernel does not write visible: NaN in all memory its output can occupy.

The ops allocate their own output, so the kit cannot pre-fill it. Two things stand in:

- while the checked call runs, ``torch.empty`` and friends return NaN (integers: their maximum):
  torch's ``fill_uninitialized_memory``, active under deterministic mode (warn-only here, so no op
  is refused); whatever padding or row stride the output has, its whole storage starts as NaN;
- before it, a first call measures the output's real storage (row stride and padding included), and
  a NaN block of exactly that many bytes is freed into the allocator, where a kernel that allocates
  some other way than ``torch.empty`` (its own pool, a raw caching-allocator block) picks it up.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def _deterministic(mode: bool, warn_only: bool) -> None:
    # The public setter also imports torch._inductor's config (2 s, once per process) to set its
    # own flag, which matters only to torch.compile; the switch itself is this one call.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


@contextmanager
def nan_fill() -> Iterator[None]:
    """Inside, new uninitialised tensors are NaN-filled; the caller's deterministic settings return after."""
    import torch.utils.deterministic as det

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = det.fill_uninitialized_memory  # type: ignore[attr-defined]
    try:
        _deterministic(True, warn_only=True)
        det.fill_uninitialized_memory = True  # type: ignore[attr-defined]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warn-only deterministic mode names each op it would refuse
            yield
    finally:
        _deterministic(enabled, warn_only=warn_only)
        det.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def poison_allocator(device: torch.device, *nbytes: int) -> None:
    """Free NaN-filled blocks of these sizes into the allocator, for the next allocations to reuse."""
    blocks = [torch.full((-(-n // 4),), float("nan"), dtype=torch.float32, device=device) for n in nbytes if n > 0]
    del blocks


@dataclass(frozen=True)
class Layout:
    """Where an output lives: its strides, storage offset and the bytes of its storage."""

    stride: tuple[int, ...]
    offset: int
    storage_bytes: int

    @classmethod
    def of(cls, t: torch.Tensor) -> "Layout":
        return cls(tuple(int(s) for s in t.stride()), int(t.storage_offset()), int(t.untyped_storage().nbytes()))

    def __str__(self) -> str:
        return f"strides {self.stride}, offset {self.offset}, storage {self.storage_bytes} bytes"


def poisoned_call(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, Layout | None]:
    """``fn()`` with every byte its output may occupy poisoned first; returns it and the probed layout.

    The probe call's output must be a tensor to be measured; if it is not, the checked call runs
    anyway and the check reports what came back.
    """
    probe = fn()
    layout = Layout.of(probe) if isinstance(probe, torch.Tensor) else None
    del probe
    if layout is not None:
        poison_allocator(device, layout.storage_bytes, layout.storage_bytes)
    with nan_fill():
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, layout
