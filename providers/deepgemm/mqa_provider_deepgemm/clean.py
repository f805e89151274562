"""-inf after each row's context in paged logits, written only where it is missing.

DeepGEMM cleans paged logits only for 1-D context lengths (and its newest generation not at all), while
the adapter always passes 2-D lengths. Its kernel leaves row r's cells from ``lens[r]`` on either
unwritten or holding values of other positions, so with ``clean_logits`` they are set to -inf here.

On a GPU a small Triton kernel stores -inf to those cells only, reading nothing but the lengths: the
cost is the out-of-context region, not the logits. Elsewhere (and without Triton) one ``masked_fill_``
does it, a full pass that only the CPU tests take.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

#: Columns one Triton program covers.
BLOCK = 1024


@functools.cache
def _triton_kernel(interpret: bool = False) -> Callable[..., Any] | None:
    """The launcher, built once per mode: ``triton.jit`` picks the interpreter when it decorates."""
    if importlib.util.find_spec("triton") is None:
        return None
    import triton
    import triton.language as tl

    def fill_tail(logits_ptr, lens_ptr, stride_row, width, BLOCK_COLS: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        start = tl.load(lens_ptr + row)
        # A block wholly inside the context stores nothing: its mask is all false.
        keep = (cols >= start) & (cols < width)
        tl.store(logits_ptr + row.to(tl.int64) * stride_row + cols, float("-inf"), mask=keep)

    with triton.knobs.runtime.scope():  # restores the knob (and TRITON_INTERPRET) afterwards
        triton.knobs.runtime.interpret = interpret
        # The width (max_context_len) changes per call: no variants for width % 16 or == 1.
        fill_tail_kernel = triton.jit(fill_tail, do_not_specialize=["width"])

    def launch(logits: torch.Tensor, lens: torch.Tensor) -> None:
        rows, width = logits.shape
        fill_tail_kernel[(rows, triton.cdiv(width, BLOCK))](logits, lens, logits.stride(0), width,
                                                           BLOCK_COLS=BLOCK)

    launch.kernel = fill_tail_kernel  # type: ignore[attr-defined]  # for ahead-of-time compile checks
    return launch


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def fill_tail(logits: torch.Tensor, lens: torch.Tensor) -> None:
    """``logits[r, c] = -inf`` for every ``c >= lens[r]``, in place.

    :param logits: [rows, width] float32, last dim contiguous (any row stride).
    :param lens: [rows] int32, contiguous, on the same device; values in [0, width].
    """
    rows, width = logits.shape
    if rows == 0 or width == 0:
        return
    interpret = _interpreting()
    launch = _triton_kernel(interpret) if logits.is_cuda or interpret else None
    if launch is not None:
        launch(logits, lens)
        return
    cols = torch.arange(width, device=logits.device)
    logits.masked_fill_(cols[None, :] >= lens[:, None], float("-inf"))
