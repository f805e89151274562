"""Inputs as engines hand them over: views into larger buffers, other dim orders, storage offsets.

The contract fixes shapes and dtypes, not strides: q may be a slice of a fused projection, k a
column block of a larger cache, weights a transposed [H, M] buffer, k_scale a column of [N, 2],
ks/ke every other entry of an interleaved table. Each helper here copies a tensor's values into
such a view; every byte of the surrounding buffer holds a poison value (NaN for fp8 and floats,
the int32 maximum for integers) so a kernel that ignores a stride reads poison and fails the check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from .data import Inputs, PagedInputs

#: Prefill and decode input layouts the kit checks besides the contiguous one.
LAYOUTS = ("padded", "transposed")

_FP8_NAN = {torch.float8_e4m3fn: 0x7F, torch.float8_e4m3fnuz: 0x80}


def _poison_storage(dtype: torch.dtype, numel: int, device: torch.device) -> torch.Tensor:
    if dtype in _FP8_NAN:
        return torch.full((numel,), _FP8_NAN[dtype], dtype=torch.uint8, device=device)
    if dtype.is_floating_point:
        return torch.full((numel,), float("nan"), dtype=dtype, device=device)
    return torch.full((numel,), torch.iinfo(dtype).max, dtype=dtype, device=device)


def relaid(t: torch.Tensor, order: Sequence[int], pad: Sequence[int] | None = None, offset: int = 0) -> torch.Tensor:
    """A view with ``t``'s values whose dims are stored outermost-first in ``order``, dim i padded by
    ``pad[i]`` elements, ``offset`` elements into a poisoned buffer."""
    if sorted(order) != list(range(t.dim())):
        raise ValueError(f"order {order} is not a permutation of {t.dim()} dims")
    pad = list(pad or [0] * t.dim())
    phys = [t.shape[i] + pad[i] for i in order]
    store = _poison_storage(t.dtype, offset + math.prod(phys), t.device)
    base = store[offset:].view(phys)[tuple(slice(0, t.shape[i]) for i in order)]
    view = base.permute([list(order).index(i) for i in range(t.dim())])
    if t.dtype in _FP8_NAN:
        view.copy_(t.view(torch.uint8))
        return view.view(t.dtype)
    view.copy_(t)
    return view


def strided_1d(t: torch.Tensor, step: int, offset: int) -> torch.Tensor:
    """A 1-D view with ``t``'s values, every ``step``-th element of a poisoned buffer from ``offset``."""
    store = _poison_storage(t.dtype, offset + step * max(t.numel(), 1), t.device)
    view = store[offset::step][: t.numel()]
    view.copy_(t)
    return view


def _row(t: torch.Tensor) -> int:
    """Elements in one outermost row of a contiguous-ordered buffer: an offset that keeps alignment."""
    return math.prod(t.shape[1:]) if t.dim() > 1 else 16


def _vector(t: torch.Tensor, kind: str) -> torch.Tensor:
    """k_scale ([N] or [N, 1]), ks, ke, 1-D context_lens: strided slices of larger buffers."""
    if t.dim() == 2 and t.shape[1] == 1:  # k_scale [N, 1]: a column of an [N, 2] buffer
        return relaid(t, (0, 1), (0, 1), offset=2 if kind == "padded" else 0)
    if t.dim() == 2:  # context_lens [B, next_n]
        return relaid(t, (0, 1) if kind == "padded" else (1, 0), (0, 3) if kind == "padded" else (0, 0), offset=3)
    return strided_1d(t, 2 if kind == "padded" else 3, offset=1 if kind == "padded" else 5)


def prefill_layout(x: Inputs, kind: str) -> Inputs:
    """``padded``: every tensor a slice of a larger buffer at an offset (rows wider than the tensor);
    ``transposed``: q stored heads-first, k dim-first (its last dim not contiguous), weights [H, M]."""
    if kind == "padded":
        q = relaid(x.q, (0, 1, 2), (0, 1, 16), offset=3 * _row(x.q))
        k = relaid(x.k, (0, 1), (0, 16), offset=5 * (x.k.shape[1] + 16))
        w = relaid(x.weights, (0, 1), (0, 4), offset=2 * (x.weights.shape[1] + 4))
    elif kind == "transposed":
        q = relaid(x.q, (1, 0, 2))
        k = relaid(x.k, (1, 0))
        w = relaid(x.weights, (1, 0))
    else:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {kind!r}")
    return replace(x, q=q, k=k, k_scale=_vector(x.k_scale, kind), weights=w,
                   ks=_vector(x.ks, kind), ke=_vector(x.ke, kind))


def paged_layout(x: PagedInputs, kind: str) -> PagedInputs:
    """The decode inputs other than the cache: q, weights, context_lens and block_tables as views
    (``padded``: a wider block table, as engines allocate for the longest sequence; ``transposed``:
    a column-major table and heads-first q)."""
    if kind == "padded":
        q = relaid(x.q, (0, 1, 2, 3), (0, 0, 1, 16), offset=_row(x.q))
        w = relaid(x.weights, (0, 1), (0, 4), offset=x.weights.shape[1] + 4)
        tables = relaid(x.block_tables, (0, 1), (0, 5), offset=7)
    elif kind == "transposed":
        q = relaid(x.q, (2, 0, 1, 3))
        w = relaid(x.weights, (1, 0))
        tables = relaid(x.block_tables, (1, 0))
    else:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {kind!r}")
    return replace(x, q=q, weights=w, context_lens=_vector(x.context_lens, kind), block_tables=tables)


def describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} strides {tuple(t.stride())} offset {t.storage_offset()}"
