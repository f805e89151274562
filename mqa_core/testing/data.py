"""Fresh random inputs for the ops (never zeros), their float64 reference, and DeepGEMM's metric."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..reference import fp8_mqa_logits_ref, fp8_paged_mqa_logits_ref, visible_lengths
from ..spec import Problem

#: Window patterns for prefill: what a caller might pass as (ks, ke).
WINDOWS = ("causal", "full", "chunk", "ragged")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's ``1 - 2*sum(x*y)/sum(x*x + y*y)`` over entries where ``y`` is finite; 0 is exact."""
    keep = torch.isfinite(y)
    a, b = x[keep].double(), y[keep].double()
    if not torch.isfinite(a).all():
        return float("inf")
    denom = float((a * a + b * b).sum())
    if denom == 0.0:
        return 0.0 if bool(torch.equal(a, b)) else float("inf")
    return 1.0 - 2.0 * float((a * b).sum()) / denom


@functools.cache
def _fp8_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double().to(device)


def exact(t: torch.Tensor) -> torch.Tensor:
    """float64 copy of ``t`` on its device. The CPU converts every fp8 flavour; elsewhere fp8 goes
    through a 256-entry table (exact, and independent of which conversions a device implements)."""
    if t.device.type != "cpu" and t.element_size() == 1 and t.dtype.is_floating_point:
        return _fp8_table(t.dtype, t.device)[t.view(torch.uint8).int()]
    return t.double()


def windows(kind: str, m: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(ks, ke) int32 [M] for a window pattern; ``ragged`` has empty rows, ks < 0 and ke > N."""
    rows = torch.arange(m)
    if kind == "causal":  # the last M of N tokens, each seeing its prefix
        ks, ke = torch.zeros(m), rows + (n - m) + 1
    elif kind == "full":
        ks, ke = torch.zeros(m), torch.full((m,), n)
    elif kind == "chunk":  # a later prefill chunk: keys from 0, offset by half of N
        ks, ke = torch.zeros(m), torch.clamp(rows + n // 2 + 1, max=n)
    elif kind == "ragged":
        ks = torch.randint(-8, max(n, 1), (m,), generator=g)
        ke = ks + torch.randint(-4, max(n // 2, 2) + 12, (m,), generator=g)
        ke[torch.rand(m, generator=g) < 0.15] = -3  # empty rows
    else:
        raise ValueError(f"window kind must be one of {WINDOWS}; got {kind!r}")
    return ks.to(torch.int32), ke.to(torch.int32)


def _generator(seed: int | None) -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()) if seed is None else seed)


def _fp8(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, positive: bool = False) -> torch.Tensor:
    # Normal values, a few beyond 1, none exactly zero in practice; fnuz saturates at 240, fn at 448.
    x = torch.randn(shape, generator=g) * 1.5
    return (x.abs() + 0.05 if positive else x).to(dtype)


def _weights(m: int, h: int, g: torch.Generator, positive: bool) -> torch.Tensor:
    w = torch.randn(m, h, generator=g) * (h ** -0.5)
    return w.abs() + 0.01 if positive else w


@dataclass(frozen=True)
class Inputs:
    """One prefill call's arguments, on one device."""

    q: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    weights: torch.Tensor
    ks: torch.Tensor
    ke: torch.Tensor

    def args(self) -> tuple[Any, ...]:
        return (self.q, (self.k, self.k_scale), self.weights, self.ks, self.ke)

    def reference(self) -> torch.Tensor:
        """float64 [M, N] on the CPU, -inf outside each window."""
        cpu = [t.cpu() for t in (self.q, self.k, self.k_scale, self.weights, self.ks, self.ke)]
        return fp8_mqa_logits_ref(*cpu)

    @property
    def valid_pairs(self) -> int:
        n = self.k.shape[0]
        ks, ke = self.ks.long().clamp(0, n), self.ke.long().clamp(0, n)
        return int((ke - ks).clamp(min=0).sum())


def make_inputs(problem: Problem, *, device: Any = "cpu", window: str = "ragged",
                dtype: torch.dtype = torch.float8_e4m3fn, seed: int | None = None,
                k_scale_2d: bool = False, k_dtype: torch.dtype | None = None,
                positive: bool = False) -> Inputs:
    """Random inputs for ``problem``; ``seed=None`` draws a fresh seed (still reproducible per call).

    ``k_dtype`` gives k another fp8 flavour than q (a mixed pair); ``positive`` makes q, k and the
    weights positive, so no sum cancels and every cell's error is measured against its own size.
    """
    g = _generator(seed)
    m, n, h, d = problem.m, problem.n, problem.h, problem.d
    q, k = _fp8((m, h, d), dtype, g, positive), _fp8((n, d), k_dtype or dtype, g, positive)
    k_scale = torch.rand(n, generator=g) * 0.9 + 0.1
    if k_scale_2d:
        k_scale = k_scale[:, None]
    weights = _weights(m, h, g, positive)
    ks, ke = windows(window, m, n, g)
    return Inputs(*(t.to(device) for t in (q, k, k_scale.contiguous(), weights, ks, ke)))


def make_prefill_inputs(m: int, n: int, h: int, d: int = 128, *, window: str = "causal", device: Any = "cpu",
                        dtype: torch.dtype = torch.float8_e4m3fn, seed: int | None = 0) -> Inputs:
    """Random arguments of one prefill call: M query tokens against N keys, H heads of dimension D.

    ``window`` is one of :data:`WINDOWS` (``causal``: the last M of N tokens, each seeing its prefix;
    ``full``; ``chunk``; ``ragged``). ``inputs.args()`` is what the op takes, ``inputs.reference()``
    the float64 oracle's logits.
    """
    return make_inputs(Problem(m, n, h, d), device=device, window=window, dtype=dtype, seed=seed)


@dataclass(frozen=True)
class PagedInputs:
    """One decode call's arguments: q [B, next_n, H, D], the paged cache and its tables.

    The cache holds fp8 bytes of q's flavour (a uint8 tensor carries no flavour of its own).
    """

    q: torch.Tensor
    kv_cache: torch.Tensor
    weights: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_context_len: int

    def args(self) -> tuple[Any, ...]:
        return (self.q, self.kv_cache, self.weights, self.context_lens, self.block_tables,
                self.max_context_len)

    def reference(self) -> torch.Tensor:
        q, cache, w, lens, tables = (t.cpu() for t in (self.q, self.kv_cache, self.weights,
                                                       self.context_lens, self.block_tables))
        return fp8_paged_mqa_logits_ref(q, cache, w, lens, tables, self.max_context_len, fp8_dtype=q.dtype)

    def visible(self) -> torch.Tensor:
        """[B * next_n] int64: how many leading positions each query row sees (before the table's cap)."""
        return visible_lengths(self.context_lens, self.q.shape[1])


def paged_cache(values: torch.Tensor, scales: torch.Tensor, *, pad_bytes: int = 0, device: Any = None
                ) -> torch.Tensor:
    """DeepGEMM's block layout from values [blocks, block_size, D] fp8 and scales [blocks, block_size]
    float32: [blocks, block_size, 1, D + 4] uint8, each block's D-byte keys then its scales.

    ``pad_bytes`` > 0 leaves that many bytes after each block (a strided page pool, stride(0) larger
    than block_size * (D + 4)), filled with 0xFF so a kernel that assumes contiguity reads NaN. The
    pool is built on ``device`` (default: the values' device), so its strides survive.
    """
    blocks, block_size, d = values.shape
    body = torch.cat([values.contiguous().view(torch.uint8).reshape(blocks, -1),
                      scales.contiguous().view(torch.uint8).reshape(blocks, -1)], dim=1)
    width = body.shape[1]
    pool = torch.full((blocks, width + pad_bytes), 0xFF, dtype=torch.uint8, device=device or values.device)
    pool[:, :width] = body.to(pool.device)
    return pool[:, :width].view(blocks, block_size, 1, d + 4)


class PagedCache(NamedTuple):
    """A paged cache and what indexes it: what ``fp8_paged_mqa_logits`` takes after q and weights."""

    kv_cache: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_context_len: int


def pack_paged_cache(keys: Sequence[torch.Tensor], scales: Sequence[torch.Tensor], *, block_size: int = 64,
                     device: Any = None) -> PagedCache:
    """Pack each sequence's keys into DeepGEMM's paged layout (docs/paged-op.md).

    ``keys[b]`` is sequence b's ``[L_b, D]`` fp8 keys, ``scales[b]`` its ``[L_b]`` (or ``[L_b, 1]``)
    float32 scales. Sequence b gets ``ceil(L_b / block_size)`` blocks of its own, in order; a block's
    unused tail is zero. Returns the cache ``[num_blocks, block_size, 1, D + 4]`` uint8, ``context_lens``
    ``[B]`` int32 (``L_b``), ``block_tables`` ``[B, max_blocks]`` int32 (unused entries 0) and
    ``max_context_len`` (the longest ``L_b``), on ``device`` (default: the keys').
    """
    if not keys or len(keys) != len(scales):
        raise ValueError(f"pack_paged_cache: give one scales tensor per keys tensor, at least one; got "
                         f"{len(keys)} keys and {len(scales)} scales")
    d, dtype = keys[0].shape[-1], keys[0].dtype
    for b, (k, sc) in enumerate(zip(keys, scales)):
        if k.dim() != 2 or k.shape[1] != d or k.dtype != dtype or k.element_size() != 1:
            raise ValueError(f"pack_paged_cache: keys[{b}] must be fp8 [L, {d}] like keys[0]; got "
                             f"{str(k.dtype).removeprefix('torch.')} {list(k.shape)}")
        if sc.dtype != torch.float32 or sc.reshape(-1).shape[0] != k.shape[0] or sc.numel() != k.shape[0]:
            raise ValueError(f"pack_paged_cache: scales[{b}] must be float32 [{k.shape[0]}] or [{k.shape[0]}, 1]; "
                             f"got {str(sc.dtype).removeprefix('torch.')} {list(sc.shape)}")
    device = keys[0].device if device is None else device
    lengths = [int(k.shape[0]) for k in keys]
    counts = [-(-n // block_size) for n in lengths]
    blocks = max(1, sum(counts))
    values = torch.zeros(blocks * block_size, d, dtype=torch.uint8)
    flat_scales = torch.zeros(blocks * block_size, dtype=torch.float32)
    tables = torch.zeros(len(keys), max(1, max(counts)), dtype=torch.int32)
    first = 0
    for b, (k, sc, count) in enumerate(zip(keys, scales, counts)):
        start = first * block_size
        values[start:start + k.shape[0]] = k.detach().cpu().view(torch.uint8)
        flat_scales[start:start + k.shape[0]] = sc.detach().cpu().reshape(-1)
        tables[b, :count] = torch.arange(first, first + count, dtype=torch.int32)
        first += count
    cache = paged_cache(values.view(dtype).reshape(blocks, block_size, d),
                        flat_scales.reshape(blocks, block_size), device=device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return PagedCache(cache, lens, tables.to(device), max(lengths))


def make_paged_inputs(batch: int, next_n: int, h: int, d: int, max_context_len: int, *,
                      block_size: int = 64, device: Any = "cpu", seed: int | None = None,
                      dtype: torch.dtype = torch.float8_e4m3fn, lens_2d: bool = False,
                      context_lens: torch.Tensor | None = None, positive: bool = False,
                      pool_pad_bytes: int = 0) -> PagedInputs:
    """A shuffled paged cache holding random keys; context lengths random in [next_n, max_context_len].

    ``lens_2d`` gives the same lengths as [B, next_n] (row j of sequence b sees lens[b]-next_n+j+1);
    ``context_lens`` ([B] or [B, next_n] int) replaces the random lengths, e.g. arbitrary 2-D ones.
    """
    g = _generator(seed)
    max_blocks = -(-max_context_len // block_size)
    num_blocks = batch * max_blocks + 3
    values = _fp8((num_blocks, block_size, d), dtype, g, positive)
    scales = torch.rand(num_blocks, block_size, generator=g) * 0.9 + 0.1
    cache = paged_cache(values, scales, pad_bytes=pool_pad_bytes, device=device)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, max_blocks)
    lens = torch.randint(next_n, max_context_len + 1, (batch,), generator=g)
    if lens_2d:
        lens = lens[:, None] - next_n + torch.arange(1, next_n + 1)[None, :]
    if context_lens is not None:
        lens = context_lens
    q = _fp8((batch, next_n, h, d), dtype, g, positive)
    weights = _weights(batch * next_n, h, g, positive)
    return PagedInputs(q.to(device), cache, weights.to(device),
                       lens.to(torch.int32).to(device), tables.to(torch.int32).to(device), max_context_len)
