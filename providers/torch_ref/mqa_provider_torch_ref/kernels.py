"""Exact implementations of the ops, chunked so temporaries stay under a memory bound.

fp8 is upcast to float64 chunk by chunk (fp8 matmul on the CPU is hundreds of times slower, and an
[H, M, N] intermediate for an 8k prompt does not fit), and each row chunk computes only the key
columns its windows can see, so causal prefill does about half the work.

Why float64: every fp8 product is a multiple of 2^-18 below 2^18, so a head's dot product over D <=
128 is exact in float64 whatever order the BLAS sums it in; the head sum then runs in one fixed
order, elementwise. A logit's value therefore never depends on how rows or keys were chunked, nor on
the rest of the batch: this provider is deterministic and batch-invariant by construction, which the
top-k ops (and the kit's batch-invariance cases) need of a reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mqa_core import env_positive_number, fp4
from mqa_core.reference import split_paged_cache, visible_lengths
from mqa_core.selection import select_topk

DEFAULT_MEMORY_MB = 512
#: Target size of one scores chunk: small enough to stay in cache between matmul, relu and head sum.
SCORES_BYTES = 4 * 2**20


def memory_bound_bytes() -> int:
    """Temporary-memory bound: ``MQA_TORCH_REF_MEMORY_MB`` (default 512 MiB), a positive number;
    anything else raises SettingsError naming the variable."""
    return max(1, int(env_positive_number("MQA_TORCH_REF_MEMORY_MB", DEFAULT_MEMORY_MB) * 2**20))


def chunk_sizes(rows: int, h: int, d: int, n: int, budget: int) -> tuple[int, int]:
    """Row and column chunk sizes whose fp32 temporaries stay under ``budget`` bytes.

    Per step the temporaries are the float64 scores [rc*H, cc], the head sum (float64), its float32
    copy and three masks [rc, cc], the column indices and key scales (int64, float64) [cc], and the
    float64 q [rc, H, D] and k [cc, D]. Few rows (32) keep a causal chunk's key span tight;
    the scores stay near cache size (4 MiB), since relu and the head sum each pass over them once.
    """
    rc = max(1, min(rows, 32))
    while True:
        per_col = rc * h * 8 + rc * 15 + d * 8 + 16
        cc = min((budget - rc * h * d * 8) // per_col, max(64, SCORES_BYTES // (rc * h * 4)))
        if cc >= 64 or rc == 1:
            return rc, int(max(1, min(n, cc, 8192)))
        rc = max(1, rc // 2)


#: (c0, c1) -> (keys [c1-c0, D] in any float dtype, their scales [c1-c0] float32)
Keys = Callable[[int, int], "tuple[torch.Tensor, torch.Tensor]"]


def _row_chunk(out: torch.Tensor, q: torch.Tensor, w: torch.Tensor, keys: Keys,
               ks: torch.Tensor, ke: torch.Tensor, lo: int, hi: int, cols: int) -> None:
    """Fill out[:, lo:hi] (one row chunk) with the contract's values, -inf outside each window."""
    rc, h, d = q.shape
    flat = q.double().reshape(rc * h, d)
    w = w.double()
    for c0 in range(lo, hi, cols):
        c1 = min(hi, c0 + cols)
        k, k_scale = keys(c0, c1)
        scores = torch.mm(flat, k.double().T).relu_().view(rc, h, c1 - c0)  # exact (module docstring)
        acc = scores[:, 0].mul(w[:, :1])
        for j in range(1, h):  # one fixed order, elementwise: the same rounding for any chunking
            acc.addcmul_(scores[:, j], w[:, j:j + 1])
        res = acc.mul_(k_scale.double()).float()
        idx = torch.arange(c0, c1, device=q.device)[None, :]
        res.masked_fill_((idx < ks[:, None]) | (idx >= ke[:, None]), float("-inf"))
        out[:, c0:c1] = res


@dataclass(frozen=True)
class TorchRefKernels:
    """The kernel object named by the spec: one method per op."""

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                       weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                       *, clean_logits: bool = True, logits_dtype: torch.dtype = torch.float32,
                       _budget: int | None = None) -> torch.Tensor:
        """Exact float32 logits, rounded once to ``logits_dtype`` (bfloat16: as each chunk is stored).
        FP4 inputs (``q = (values, scales)``, ``kv = (k values, k scales)``) are decoded exactly to
        float32 first (``mqa_core.fp4``); they have no key scale."""
        k, k_scale = kv
        if isinstance(q, tuple):
            q, k = fp4.dequantize(*q), fp4.dequantize(k, k_scale)
            k_scale = torch.ones(k.shape[0], dtype=torch.float32, device=k.device)
        k_scale = k_scale.reshape(-1).float()
        m, h, d = q.shape
        n = k.shape[0]
        # -inf everywhere first: out-of-window cells are -inf (clean) and never NaN (not clean).
        out = torch.full((m, n), float("-inf"), dtype=logits_dtype, device=q.device)
        if m == 0 or n == 0:
            return out
        ks = cu_seqlen_ks.long().clamp(0, n)
        ke = cu_seqlen_ke.long().clamp(0, n)
        rc, cols = chunk_sizes(m, h, d, n, _budget or memory_bound_bytes())
        ks_host, ke_host = ks.tolist(), ke.tolist()  # one sync: chunk spans are host decisions
        for r0 in range(0, m, rc):
            r1 = min(m, r0 + rc)
            lo, hi = min(ks_host[r0:r1]), max(ke_host[r0:r1])
            if lo < hi:
                _row_chunk(out[r0:r1], q[r0:r1], weights[r0:r1],
                           lambda c0, c1: (k[c0:c1], k_scale[c0:c1]),
                           ks[r0:r1], ke[r0:r1], lo, hi, cols)
        return out

    def fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor,
                             max_context_len: int, *, clean_logits: bool = True,
                             logits_dtype: torch.dtype = torch.float32, _budget: int | None = None) -> torch.Tensor:
        """Per sequence, keys gathered through the block table in column chunks. Strided page pools
        are read in place (views, no copy of the pool); 2-D lengths may take any values; a position
        whose block id is outside [0, num_blocks) is -inf and its block is never read."""
        packed = isinstance(q, tuple)  # FP4: q = (values, scales); the cache holds packed values + scale words
        if packed:
            q = fp4.dequantize(*q)
        b, next_n, h, d = q.shape
        out = torch.full((b * next_n, max_context_len), float("-inf"), dtype=logits_dtype, device=q.device)
        if out.numel() == 0 or kv_cache.shape[0] == 0:
            return out
        if packed:
            values, scales = fp4.split_paged_cache(kv_cache)
        else:
            values, scales = split_paged_cache(kv_cache)
            values = values.view(q.dtype)
        blocks, block_size = values.shape[0], values.shape[1]
        covered = min(max_context_len, block_tables.shape[1] * block_size)
        ke = visible_lengths(context_lens, next_n).clamp(0, covered)
        zero = torch.zeros_like(ke)
        rc, cols = chunk_sizes(next_n, h, d, covered, _budget or memory_bound_bytes())
        ke_host = ke.tolist()
        for bi in range(b):
            rows = slice(bi * next_n, (bi + 1) * next_n)
            hi = max(ke_host[rows])
            if hi <= 0:
                continue
            pos = torch.arange(hi, device=q.device)
            blk = block_tables[bi, pos // block_size].long()
            ok = (blk >= 0) & (blk < blocks)
            blk = torch.where(ok, blk, 0)  # never read outside the pool; masked below
            off = pos % block_size

            def keys(c0: int, c1: int, blk: torch.Tensor = blk, off: torch.Tensor = off
                     ) -> tuple[torch.Tensor, torch.Tensor]:
                v, sc = values[blk[c0:c1], off[c0:c1]], scales[blk[c0:c1], off[c0:c1]]
                if packed:  # decoded per chunk; no key scale
                    return fp4.dequantize(v, sc), torch.ones(c1 - c0, dtype=torch.float32, device=v.device)
                return v, sc

            for r0 in range(0, next_n, rc):
                r1 = min(next_n, r0 + rc)
                chunk = slice(bi * next_n + r0, bi * next_n + r1)
                top = max(ke_host[chunk])
                if top > 0:
                    _row_chunk(out[chunk], q[bi, r0:r1], weights[chunk], keys, zero[chunk], ke[chunk],
                               0, top, cols)
            if not bool(ok.all()):
                out[rows, :hi].masked_fill_(~ok[None, :], float("-inf"))
        return out

    def topk_per_row(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The exact selection (:func:`mqa_core.selection.select_topk`), its temporaries within
        ``workspace_bytes`` (rows, then column blocks of a row, per step)."""
        m, _ = logits.shape
        values = torch.empty((m, topk), dtype=torch.float32, device=logits.device) if return_values else None
        room = max(1, workspace_bytes - m * topk * (8 if return_values else 4))  # beside the outputs
        return select_topk(logits, ks, ke, topk, positions=positions, values=values, budget_bytes=room)

    def _select(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, positions: str,
                return_values: bool, workspace_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.topk_per_row(logits, ks, ke, topk, positions=positions, return_values=return_values,
                                 workspace_bytes=workspace_bytes)

    def fp8_mqa_topk(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                     cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This provider's logits, then its selection, in row chunks within ``workspace_bytes`` (the
        core's chunk loop, :func:`mqa_core.composed.chunked_prefill_topk`)."""
        from mqa_core.composed import chunked_prefill_topk

        # A chunk's logits take half the workspace; while they are computed the selection's half is free,
        # so the scoring's own temporaries get half of that (not MQA_TORCH_REF_MEMORY_MB): the float64
        # matmul's own buffers are not in chunk_sizes' count (an H200 measured 21 MiB against 16 with
        # the whole half).
        scratch = max(1, workspace_bytes // 4)

        def logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, ks: torch.Tensor,
                   ke: torch.Tensor) -> torch.Tensor:
            return self.fp8_mqa_logits(q, kv, w, ks, ke, _budget=scratch)

        return chunked_prefill_topk(logits, self._select, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, topk,
                                    positions, return_values, workspace_bytes)

    def fp8_paged_mqa_topk(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                           context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                           topk: int, *, schedule: torch.Tensor | None = None, return_values: bool = False,
                           workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The paged logits, then the selection, a chunk of whole sequences at a time."""
        from mqa_core.composed import chunked_paged_topk

        scratch = max(1, workspace_bytes // 4)  # as for prefill

        def logits(q: torch.Tensor, kv_cache: torch.Tensor, w: torch.Tensor, lens: torch.Tensor,
                   tables: torch.Tensor, max_len: int, schedule: torch.Tensor | None) -> torch.Tensor:
            return self.fp8_paged_mqa_logits(q, kv_cache, w, lens, tables, max_len, _budget=scratch)

        return chunked_paged_topk(logits, self._select, q, kv_cache, weights, context_lens, block_tables,
                                  max_context_len, topk, schedule, return_values, workspace_bytes)


KERNELS = TorchRefKernels()
