"""Benchmark workloads as setup / run / verify triples, and the presets that list them.

Inputs are generated on the device itself (a 16k-token prefill's q is half a GiB of float32 before
the fp8 cast; building it on the host and copying would dominate the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..provider import Provider
from ..reference import fp8_mqa_logits_ref
from ..spec import Problem
from ..testing.data import Inputs, PagedInputs

PREFILL = "fp8_mqa_logits"
PAGED = "fp8_paged_mqa_logits"
#: The indexer step of each: the same inputs, then the ``topk`` best keys per row (``mqa bench --topk``).
PREFILL_TOPK = "fp8_mqa_topk"
PAGED_TOPK = "fp8_paged_mqa_topk"
TOPK_OF = {PREFILL: PREFILL_TOPK, PAGED: PAGED_TOPK}
PAGED_BLOCK_SIZE = 64
#: Above this many [M, H, N] score cells the float64 oracle is too slow and big; torch_ref verifies.
ORACLE_CELLS = 2**25


#: Window kinds of the prefill op. causal/suffix/chunk: the last M of N tokens, each seeing its
#: prefix (ke = N - M + m + 1, ks = 0); full: every key; sliding: the same ends, ke - ks = window;
#: packed: several requests in one call, each row seeing only its own request's keys.
PREFILL_KINDS = ("causal", "suffix", "chunk", "full", "sliding", "packed")


@dataclass(frozen=True)
class Workload:
    """One shape of one op: how to build its inputs, call a provider, and count its work.

    ``requests`` (packed only): ``(queries, keys)`` per request, packed in order along M and N as an
    engine flattens a batch: request r's keys are ``k[start_r : start_r + keys_r]`` and its queries are
    the last ``queries_r`` of those positions, so row p of it has ``ks = start_r`` and
    ``ke = start_r + keys_r - queries_r + p + 1`` (vLLM's ``kv_spans_from_batches``).
    """

    op: str
    problem: Problem
    kind: str  # prefill: one of PREFILL_KINDS; decode: decode
    clean: bool = True
    batch: int = 0
    next_n: int = 0
    requests: tuple[tuple[int, int], ...] = ()
    window: int = 0
    topk: int = 0  # >= 1 exactly for the top-k ops

    def __post_init__(self) -> None:
        p, errors = self.problem, []
        ops = (*TOPK_OF, *TOPK_OF.values())
        if self.op not in ops:
            errors.append(f"op must be one of {', '.join(ops)}, got {self.op!r}")
        elif (self.op in TOPK_OF) != (self.topk == 0) or self.topk < 0:
            errors.append(f"topk must be >= 1 for {self.op} and only there, got {self.topk}")
        if not self.paged and self.kind not in PREFILL_KINDS:
            errors.append(f"kind must be one of {PREFILL_KINDS} for {self.op}, got {self.kind!r}")
        if self.paged and self.kind != "decode":
            errors.append(f"kind must be 'decode' for {self.op}, got {self.kind!r}")
        if self.kind == "packed":
            if not self.requests or any(not 1 <= q <= k for q, k in self.requests):
                errors.append(f"packed requests must be (queries, keys) with 1 <= queries <= keys, "
                              f"got {self.requests!r}")
            elif (sum(q for q, _ in self.requests), sum(k for _, k in self.requests)) != (p.m, p.n):
                errors.append(f"packed requests hold {sum(q for q, _ in self.requests)} queries and "
                              f"{sum(k for _, k in self.requests)} keys; the problem says M={p.m} N={p.n}")
        elif self.requests:
            errors.append(f"requests are for kind 'packed', not {self.kind!r}")
        if self.kind == "sliding" and self.window < 1:
            errors.append(f"a sliding workload needs window >= 1, got {self.window}")
        elif self.kind != "sliding" and self.window:
            errors.append(f"window is for kind 'sliding', not {self.kind!r}")
        if errors:
            raise ValueError("invalid Workload: " + "; ".join(errors))

    @property
    def paged(self) -> bool:
        return self.op in (PAGED, PAGED_TOPK)

    @property
    def logits_op(self) -> str:
        """The logits op whose inputs (and whose scores, for a top-k op) this workload has."""
        return PAGED if self.paged else PREFILL

    def with_topk(self, topk: int) -> "Workload":
        """The indexer step on the same inputs: this workload's top-k op, selecting ``topk`` keys a row."""
        return replace(self, op=TOPK_OF[self.logits_op], topk=topk)

    def logits_only(self) -> "Workload":
        """This workload's logits op; for a top-k workload its clean logits, the selection's reference."""
        return replace(self, op=self.logits_op, topk=0, clean=self.clean or bool(self.topk))

    @property
    def name(self) -> str:
        p = self.problem
        top = f" topk={self.topk}" if self.topk else ""
        if self.paged:
            return f"decode B={self.batch} next_n={self.next_n} ctx={p.n} H={p.h} D={p.d}{top}"
        return f"{self._kind_text} M={p.m} N={p.n} H={p.h} D={p.d}{top}"

    @property
    def _kind_text(self) -> str:
        if self.kind == "packed":
            return f"packed x{len(self.requests)}"
        if self.kind == "sliding":
            return f"sliding W={self.window}"
        return self.kind

    @property
    def label(self) -> str:
        """Short, multi-line: a plot's x tick."""
        p = self.problem
        if self.paged:
            return f"B{self.batch} n{self.next_n}\nctx {_k(p.n)}\nH{p.h}"
        kind = {"packed": f"packed x{len(self.requests)}", "sliding": f"sliding {_k(self.window)}"}
        return f"{kind.get(self.kind, self.kind)}\n{_k(p.m)}x{_k(p.n)}\nH{p.h} D{p.d}"

    def scaled(self, factor: int) -> "Workload":
        """The same workload with every token count (M, N, request lengths, window, context) divided
        by ``factor``, rounded up: the engine preset's structure at a size a CPU runs in seconds."""
        if factor < 1:
            raise ValueError(f"scale factor must be >= 1, got {factor}")
        if factor == 1:
            return self

        def c(v: int) -> int:
            return max(1, -(-v // factor))

        p = self.problem
        if self.paged:
            return replace(self, problem=Problem(p.m, c(p.n), p.h, p.d))
        requests = tuple((c(q), c(k)) for q, k in self.requests)
        m, n = ((sum(q for q, _ in requests), sum(k for _, k in requests)) if requests
                else (c(p.m), c(p.n)))
        return replace(self, problem=Problem(m, n, p.h, p.d), requests=requests,
                       window=c(self.window) if self.window else 0)

    def windows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ks, ke) int32 [M] on the CPU, as an engine would build them for this workload."""
        p = self.problem
        if self.kind == "packed":
            ks_parts, ke_parts, start = [], [], 0
            for q, k in self.requests:
                ks_parts.append(torch.full((q,), start))
                ke_parts.append(start + (k - q) + torch.arange(q) + 1)
                start += k
            ks, ke = torch.cat(ks_parts), torch.cat(ke_parts)
        elif self.kind == "full":
            ks, ke = torch.zeros(p.m), torch.full((p.m,), p.n)
        else:  # causal, suffix, chunk, sliding: the last M of N tokens, each seeing its prefix
            ke = torch.arange(p.m) + (p.n - p.m) + 1
            ks = (ke - self.window).clamp(min=0) if self.kind == "sliding" else torch.zeros(p.m)
        return ks.to(torch.int32), ke.to(torch.int32)

    # -- setup ---------------------------------------------------------------------------------
    def setup(self, device: torch.device, seed: int) -> Any:
        g = torch.Generator(device=device).manual_seed(seed)
        if self.paged:
            return _paged_inputs(self, device, g)
        p = self.problem
        ks, ke = self.windows()
        return Inputs(_fp8((p.m, p.h, p.d), g, device), _fp8((p.n, p.d), g, device),
                      torch.rand(p.n, generator=g, device=device) * 0.9 + 0.1,
                      torch.randn(p.m, p.h, generator=g, device=device) * p.h ** -0.5,
                      ks.to(device), ke.to(device))

    def input_bytes(self) -> int:
        p = self.problem
        if self.paged:
            blocks = self.batch * -(-p.n // PAGED_BLOCK_SIZE)
            return p.m * p.h * (p.d + 4) + blocks * PAGED_BLOCK_SIZE * (p.d + 4)
        return p.m * p.h * (p.d + 4) + p.n * (p.d + 4) + 8 * p.m

    # -- run -----------------------------------------------------------------------------------
    def run(self, provider: Provider, x: Any) -> torch.Tensor:
        """The op's output: logits, or (top-k ops) int32 positions, absolute (prefill) or ``p < len``."""
        if self.op == PAGED_TOPK:
            q, cache, weights, lens, tables, n = x.args()
            return provider.fp8_paged_mqa_topk(q, cache, weights, lens, tables, n, self.topk)
        if self.op == PREFILL_TOPK:
            q, kv, weights, ks, ke = x.args()
            return provider.fp8_mqa_topk(q, kv, weights, ks, ke, self.topk, positions="absolute")
        if self.paged:
            return provider.fp8_paged_mqa_logits(*x.args(), clean_logits=self.clean)
        return provider.fp8_mqa_logits(*x.args(), clean_logits=self.clean)

    def key_windows(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(ks, ke) on the device: the keys each output row may select (paged: ``[0, visible)``)."""
        if not self.paged:
            return x.ks, x.ke
        from ..composed import paged_windows

        ke = paged_windows(x.context_lens, self.next_n, x.block_tables, PAGED_BLOCK_SIZE, x.max_context_len)
        return torch.zeros_like(ke), ke

    # -- verify --------------------------------------------------------------------------------
    def oracle_fits(self) -> bool:
        p = self.problem
        return p.m * p.h * p.n <= ORACLE_CELLS

    def float64_reference(self, x: Any) -> torch.Tensor:
        if self.paged:
            return x.reference().to(x.q.device)
        dev = x.q.device
        return fp8_mqa_logits_ref(x.q.cpu().double().to(dev), x.k.cpu().double().to(dev), x.k_scale,
                                  x.weights, x.ks, x.ke)

    def valid_pairs(self, x: Any) -> int:
        if self.paged:
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


#: The indexer's sizes: DeepSeek-V3.2 has index_n_heads=64, index_head_dim=128 (its config.json);
#: GLM-5 (glm_moe_dsa) has index_n_heads=32, index_head_dim=128 (transformers' GlmMoeDsaConfig
#: defaults, which follow zai-org/GLM-5). Both keep the top 2048 keys per query.
DEEPSEEK_V32_H, GLM5_H, INDEX_D = 64, 32, 128
#: Issue 14's host-cost shape: small enough that an H200 finishes the kernel (about 10 us) long
#: before the host has issued the next call, so back-to-back calls measure the host alone.
HOST_COST_PROBLEM = Problem(128, 2048, DEEPSEEK_V32_H, INDEX_D)
#: 32 short prompts of odd, unequal lengths (64..511 tokens), packed as a serving batch of chats.
_SHORT_PROMPTS = tuple(64 + (149 * i) % 448 for i in range(32))


def _packed(requests: tuple[tuple[int, int], ...], h: int, clean: bool) -> Workload:
    m, n = sum(q for q, _ in requests), sum(k for _, k in requests)
    return Workload(PREFILL, Problem(m, n, h, INDEX_D), "packed", clean, requests=requests)


def engine_preset(clean: bool = True) -> list[Workload]:
    """What inference engines send in prefill, small calls first: engines pay the host cost there."""
    def shape(m: int, n: int, h: int, kind: str, window: int = 0) -> Workload:
        return Workload(PREFILL, Problem(m, n, h, INDEX_D), kind, clean, window=window)

    return [
        # Small chunks (M=128..1k, N=1k..8k): short prompts and the first chunks of longer ones, where
        # the host, not the kernel, sets the time. 128 x 2k at H=64 is issue 14's host-cost shape.
        shape(128, 2048, DEEPSEEK_V32_H, "suffix"),
        shape(512, 4096, GLM5_H, "suffix"),
        shape(1024, 8192, DEEPSEEK_V32_H, "suffix"),
        # A whole 1k-token prompt: issue 14's small-shape goal (>= 1.0x DeepGEMM, whole call).
        shape(1024, 1024, DEEPSEEK_V32_H, "causal"),
        # Packed batches: vLLM and SGLang flatten the batch's prompts into one call; every row's window
        # starts at its own request's first key (vLLM's kv_spans_from_batches builds these ks/ke).
        _packed(tuple((n, n) for n in (1024, 512, 2048, 256, 128, 3072, 768, 384)), DEEPSEEK_V32_H, clean),
        _packed(tuple((n, n) for n in _SHORT_PROMPTS), GLM5_H, clean),
        # Chunked prefill of several requests at once, each with a cached prefix: queries are the last
        # tokens of each request, keys its whole context (vLLM's prefill with prefix caching).
        _packed(((512, 4096), (1024, 1024), (256, 16384), (2048, 6144)), DEEPSEEK_V32_H, clean),
        # The last chunk of a long prompt (chunked prefill: M small, N long, suffix-causal windows).
        # 256 x 64k at H=64 is issue 14's second small-shape goal; 1k of 128k is the models' context limit.
        shape(256, 65536, DEEPSEEK_V32_H, "chunk"),
        shape(4096, 32768, DEEPSEEK_V32_H, "chunk"),
        shape(1024, 131072, GLM5_H, "chunk"),
        # Sliding windows (ke - ks = W for every row): windows that do not start at key 0, as sliding-
        # window layers and context-parallel shards send; they test the kernels' ks handling and skipping.
        shape(4096, 16384, DEEPSEEK_V32_H, "sliding", window=2048),
        shape(1024, 8192, GLM5_H, "sliding", window=512),
        # Large shapes (as in the prefill preset), so that tuning for small calls shows any regression.
        shape(8192, 8192, DEEPSEEK_V32_H, "causal"),
        shape(4096, 16384, GLM5_H, "suffix"),
    ]


def host_cost_workload(clean: bool = True, scale: int = 1) -> Workload:
    """The shape on which ``mqa bench --preset engine`` measures the host's cost per call."""
    return Workload(PREFILL, HOST_COST_PROBLEM, "suffix", clean).scaled(scale)


PRESETS = {"quick": quick_preset, "prefill": prefill_preset, "decode": decode_preset, "engine": engine_preset}


def shape_workload(problem: Problem, clean: bool = True) -> Workload:
    """``--shape M,N,H,D``: a causal prefill (the last M of N tokens, each seeing its prefix)."""
    return Workload(PREFILL, problem, "causal", clean)


def input_sets(w: Workload, device: torch.device, budget_bytes: int | None = None) -> int:
    """How many input sets to rotate so that caches do not hold one set between calls: enough to
    exceed a budget (512 MiB on a GPU, past any L2 or Infinity Cache; 64 MiB on a CPU), from 2 up
    to 64 on a GPU (small calls: 64 sets of 128 x 2k inputs still exceed an H200's 50 MiB L2) and
    4 on a CPU."""
    budget = budget_bytes or (512 if device.type != "cpu" else 64) * 2**20
    return max(2, min(64 if device.type != "cpu" else 4, math.ceil(budget / max(1, w.input_bytes()))))
