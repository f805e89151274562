"""Fresh random inputs for the ops (never zeros), their float64 reference, and DeepGEMM's metric."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..reference import fp8_mqa_logits_ref, fp8_paged_mqa_logits_ref
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


def _fp8(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    # Normal values, a few beyond 1, none exactly zero in practice; fnuz saturates at 240, fn at 448.
    return (torch.randn(shape, generator=g) * 1.5).to(dtype)


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
                k_scale_2d: bool = False) -> Inputs:
    """Random inputs for ``problem``; ``seed=None`` draws a fresh seed (still reproducible per call)."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()) if seed is None else seed)
    m, n, h, d = problem.m, problem.n, problem.h, problem.d
    q, k = _fp8((m, h, d), dtype, g), _fp8((n, d), dtype, g)
    k_scale = torch.rand(n, generator=g) * 0.9 + 0.1
    if k_scale_2d:
        k_scale = k_scale[:, None]
    weights = torch.randn(m, h, generator=g) * (h ** -0.5)
    ks, ke = windows(window, m, n, g)
    return Inputs(*(t.to(device) for t in (q, k, k_scale.contiguous(), weights, ks, ke)))


@dataclass(frozen=True)
class PagedInputs:
    """One decode call's arguments: q [B, next_n, H, D], the paged cache and its tables."""

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


def make_paged_inputs(batch: int, next_n: int, h: int, d: int, max_context_len: int, *,
                      block_size: int = 64, device: Any = "cpu", seed: int | None = None,
                      dtype: torch.dtype = torch.float8_e4m3fn, lens_2d: bool = False) -> PagedInputs:
    """A shuffled paged cache holding random keys; context lengths random in [next_n, max_context_len]."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()) if seed is None else seed)
    max_blocks = -(-max_context_len // block_size)
    num_blocks = batch * max_blocks + 3
    values = _fp8((num_blocks, block_size, d), dtype, g).view(torch.uint8)
    scales = (torch.rand(num_blocks, block_size, generator=g) * 0.9 + 0.1).view(torch.uint8)
    cache = torch.cat([values.reshape(num_blocks, -1), scales.reshape(num_blocks, -1)], dim=1)
    cache = cache.reshape(num_blocks, block_size, 1, d + 4)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, max_blocks)
    lens = torch.randint(next_n, max_context_len + 1, (batch,), generator=g)
    if lens_2d:
        lens = lens[:, None] - next_n + torch.arange(1, next_n + 1)[None, :]
    q = _fp8((batch, next_n, h, d), dtype, g)
    weights = torch.randn(batch * next_n, h, generator=g) * (h ** -0.5)
    return PagedInputs(q.to(device), cache.to(device), weights.to(device),
                       lens.to(torch.int32).to(device), tables.to(torch.int32).to(device), max_context_len)
