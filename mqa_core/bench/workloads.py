"""Benchmark workloads as setup / run / verify triples, and the presets that list them.

Inputs are generated on the device itself (a 16k-token prefill's q is half a GiB of float32 before
the fp8 cast; building it on the host and copying would dominate the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..provider import Provider
from ..reference import fp8_mqa_logits_ref
from ..spec import Problem
from ..testing.data import Inputs, PagedInputs, windows

PREFILL = "fp8_mqa_logits"
PAGED = "fp8_paged_mqa_logits"
PAGED_BLOCK_SIZE = 64
#: Above this many [M, H, N] score cells the float64 oracle is too slow and big; torch_ref verifies.
ORACLE_CELLS = 2**25


@dataclass(frozen=True)
class Workload:
    """One shape of one op: how to build its inputs, call a provider, and count its work."""

    op: str
    problem: Problem
    kind: str  # prefill: causal | suffix | chunk | full; decode: decode
    clean: bool = True
    batch: int = 0
    next_n: int = 0

    @property
    def name(self) -> str:
        p = self.problem
        if self.op == PAGED:
            return f"decode B={self.batch} next_n={self.next_n} ctx={p.n} H={p.h} D={p.d}"
        return f"{self.kind} M={p.m} N={p.n} H={p.h} D={p.d}"

    @property
    def label(self) -> str:
        """Short, multi-line: a plot's x tick."""
        p = self.problem
        if self.op == PAGED:
            return f"B{self.batch} n{self.next_n}\nctx {_k(p.n)}\nH{p.h}"
        return f"{self.kind}\n{_k(p.m)}x{_k(p.n)}\nH{p.h} D{p.d}"

    # -- setup ---------------------------------------------------------------------------------
    def setup(self, device: torch.device, seed: int) -> Any:
        g = torch.Generator(device=device).manual_seed(seed)
        if self.op == PAGED:
            return _paged_inputs(self, device, g)
        p = self.problem
        kind = "causal" if self.kind in ("suffix", "chunk") else self.kind
        ks, ke = windows(kind, p.m, p.n, torch.Generator().manual_seed(seed))
        return Inputs(_fp8((p.m, p.h, p.d), g, device), _fp8((p.n, p.d), g, device),
                      torch.rand(p.n, generator=g, device=device) * 0.9 + 0.1,
                      torch.randn(p.m, p.h, generator=g, device=device) * p.h ** -0.5,
                      ks.to(device), ke.to(device))

    def input_bytes(self) -> int:
        p = self.problem
        if self.op == PAGED:
            blocks = self.batch * -(-p.n // PAGED_BLOCK_SIZE)
            return p.m * p.h * (p.d + 4) + blocks * PAGED_BLOCK_SIZE * (p.d + 4)
        return p.m * p.h * (p.d + 4) + p.n * (p.d + 4) + 8 * p.m

    # -- run -----------------------------------------------------------------------------------
    def run(self, provider: Provider, x: Any) -> torch.Tensor:
        if self.op == PAGED:
            return provider.fp8_paged_mqa_logits(*x.args(), clean_logits=self.clean)
        return provider.fp8_mqa_logits(*x.args(), clean_logits=self.clean)

    # -- verify --------------------------------------------------------------------------------
    def oracle_fits(self) -> bool:
        p = self.problem
        return p.m * p.h * p.n <= ORACLE_CELLS

    def float64_reference(self, x: Any) -> torch.Tensor:
        if self.op == PAGED:
            return x.reference().to(x.q.device)
        dev = x.q.device
        return fp8_mqa_logits_ref(x.q.cpu().double().to(dev), x.k.cpu().double().to(dev), x.k_scale,
                                  x.weights, x.ks, x.ke)

    def valid_pairs(self, x: Any) -> int:
        if self.op == PAGED:
            from ..reference import visible_lengths

            return int(visible_lengths(x.context_lens, self.next_n).clamp(0, x.max_context_len).sum())
        return x.valid_pairs

    def flops(self, x: Any) -> float:
        """DeepGEMM's count: 2 * H * D per (query, key) pair inside a window."""
        return 2.0 * self.problem.h * self.problem.d * self.valid_pairs(x)


def _k(v: int) -> str:
    return f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v)


def _fp8(shape: tuple[int, ...], g: torch.Generator, device: torch.device) -> torch.Tensor:
    return (torch.randn(shape, generator=g, device=device) * 1.5).to(torch.float8_e4m3fn)


def _paged_inputs(w: Workload, device: torch.device, g: torch.Generator) -> PagedInputs:
    b, nn, (h, d), ctx = w.batch, w.next_n, (w.problem.h, w.problem.d), w.problem.n
    per_seq = -(-ctx // PAGED_BLOCK_SIZE)
    blocks = b * per_seq
    values = _fp8((blocks, PAGED_BLOCK_SIZE * d), g, device).view(torch.uint8)
    scales = (torch.rand(blocks, PAGED_BLOCK_SIZE, generator=g, device=device) * 0.9 + 0.1).view(torch.uint8)
    cache = torch.cat([values, scales], dim=1).reshape(blocks, PAGED_BLOCK_SIZE, 1, d + 4)
    tables = torch.randperm(blocks, generator=g, device=device).reshape(b, per_seq).to(torch.int32)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)  # every sequence at full context
    q = _fp8((b, nn, h, d), g, device)
    weights = torch.randn(b * nn, h, generator=g, device=device) * h ** -0.5
    return PagedInputs(q, cache, weights, lens, tables, ctx)


# -- presets -----------------------------------------------------------------------------------

def prefill_preset(clean: bool = True) -> list[Workload]:
    """The indexer's prefill shapes: an 8k prompt, a 4k chunk after 12k, the last 16k chunk of 48k."""
    out = []
    for h in (32, 64):
        out += [Workload(PREFILL, Problem(4096, 16384, h, 128), "suffix", clean),
                Workload(PREFILL, Problem(8192, 8192, h, 128), "causal", clean),
                Workload(PREFILL, Problem(16384, 49152, h, 128), "chunk", clean),
                Workload(PREFILL, Problem(4096, 16384, h, 128), "full", clean)]
    return out


def quick_preset(clean: bool = True) -> list[Workload]:
    """Small enough for a laptop CPU in seconds: one causal and one full window."""
    return [Workload(PREFILL, Problem(256, 1024, 32, 128), "causal", clean),
            Workload(PREFILL, Problem(256, 1024, 32, 128), "full", clean)]


def decode_preset(clean: bool = True) -> list[Workload]:
    """Paged decode: batch 1 / 32 / 128 at 1k / 8k / 32k context, next_n 1 and 2 (MTP), H 32 and 64."""
    return [Workload(PAGED, Problem(b * nn, ctx, h, 128), "decode", clean, batch=b, next_n=nn)
            for h in (32, 64) for b in (1, 32, 128) for ctx in (1024, 8192, 32768) for nn in (1, 2)]


PRESETS = {"quick": quick_preset, "prefill": prefill_preset, "decode": decode_preset}


def shape_workload(problem: Problem, clean: bool = True) -> Workload:
    """``--shape M,N,H,D``: a causal prefill (the last M of N tokens, each seeing its prefix)."""
    return Workload(PREFILL, problem, "causal", clean)


def input_sets(w: Workload, device: torch.device, budget_bytes: int | None = None) -> int:
    """How many input sets to rotate so that caches do not hold one set between calls: enough to
    exceed a budget (512 MiB on a GPU, past any L2 or Infinity Cache; 64 MiB on a CPU), 2 to 8."""
    budget = budget_bytes or (512 if device.type != "cpu" else 64) * 2**20
    return max(2, min(8 if device.type != "cpu" else 4, math.ceil(budget / max(1, w.input_bytes()))))
