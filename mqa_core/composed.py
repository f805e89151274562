"""The core's own provider of the fused top-k ops: any logits provider, then any ``topk_per_row``
provider, in row chunks whose logits fit the workspace bound.

So every logits kernel gets the indexer step for free (DeepGEMM's, a third party's), and a provider
with a fused kernel wins where its priority (or a tuning table) says it is faster. The parts are
chosen as the public ops choose (``MQA_PROVIDER``, ``MQA_DISABLE_PROVIDERS``, ``MQA_BATCH_INVARIANT``
apply to each), and called through their :class:`~mqa_core.provider.Provider`, so their arguments and
results are checked like any call's.

Memory: the logits of a chunk take at most half the workspace; the selection gets the other half for
its own temporaries, and a chunk's indices (and values) are copied into the output. Rows are chunked
so that, whatever N is, the peak beyond inputs and output stays within ``MQA_WORKSPACE_MB``.

The chunk loops (:func:`chunked_prefill_topk`, :func:`chunked_paged_topk`) take the two parts as
functions, so a provider that composes its own kernels (torch_ref) reuses them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .spec import (
    COMPOSED_DISTRIBUTION,
    COMPOSED_NAME,
    DTYPE_PAIRS,
    FP4_PAIR,
    ProviderSpec,
)

if TYPE_CHECKING:
    import torch
    from numpy.typing import ArrayLike

#: (q, kv, weights, ks, ke) -> float32 logits [rows, keys]
PrefillLogits = Callable[..., "torch.Tensor"]
#: (q, kv_cache, weights, context_lens, block_tables, max_context_len) -> float32 logits [rows, max_context_len]
PagedLogits = Callable[..., "torch.Tensor"]
#: (logits, ks, ke, topk, positions, return_values, workspace_bytes) -> (indices, values or None)
Select = Callable[..., "tuple[torch.Tensor, torch.Tensor | None]"]

#: Bytes per logit of a chunk (float32).
_CELL = 4


@dataclass(frozen=True)
class Chunk:
    """Rows ``[r0, r1)`` scored over keys ``[lo, hi)`` (the union of their windows)."""

    r0: int
    r1: int
    lo: int
    hi: int


def split_workspace(workspace_bytes: int, topk: int, return_values: bool) -> tuple[int, int]:
    """(logits cells a chunk may hold, bytes its selection may use): half the workspace each, less the
    chunk's copy of its indices and values."""
    half = workspace_bytes // 2
    return half // _CELL, workspace_bytes - half


def plan_prefill(ks: "ArrayLike", ke: "ArrayLike", n: int, cells: int, topk: int, return_values: bool,
                 op: str = "fp8_mqa_topk") -> list[Chunk]:
    """Every chunk :func:`prefill_chunks` yields, as a list."""
    return list(prefill_chunks(ks, ke, n, cells, topk, return_values, op))


def prefill_chunks(ks: "ArrayLike", ke: "ArrayLike", n: int, cells: int, topk: int, return_values: bool,
                   op: str = "fp8_mqa_topk") -> Iterator[Chunk]:
    """Consecutive rows while ``rows * (hi - lo)`` logits plus their ``rows * topk`` outputs fit
    ``cells`` (``[lo, hi)``: the union of the rows' windows; an empty window widens nothing); raises
    ValueError here, before any chunk is yielded (and so before any kernel runs), when one row's
    window alone does not fit.

    The chunks come one at a time, each planned when the caller asks for it: a caller that launches a
    chunk's kernels before asking for the next keeps the planning of every later chunk off the GPU's
    critical path (planning all 17 chunks of a 4k x 128k call first cost 0.2-0.5 ms of host time while
    the GPU waited). Vectorised per chunk (numpy, over the rows the chunk could hold at most: no more
    than ``cells`` over its first row's own cost, since the union holds that row's window); a packed
    batch has tens of thousands of rows, and a Python loop over them cost more host time than the
    kernels of the whole call."""
    import numpy as np

    out = (2 if return_values else 1) * topk
    a = np.maximum(np.asarray(ks, dtype=np.int64), 0)  # np.maximum/minimum: np.clip's own overhead is ~10 us
    b = np.minimum(np.asarray(ke, dtype=np.int64), n)
    empty = a >= b
    a, b = np.where(empty, n, a), np.where(empty, 0, b)
    own = np.maximum(b - a, 0) + out
    if own.size and int(own.max()) > cells:
        r = int(np.argmax(own > cells))
        raise ValueError(f"{op}: row {r}'s window [{a[r]}, {b[r]}) needs {(b[r] - a[r]) * _CELL / 2**20:.1f} MiB of "
                         f"logits, more than half the workspace ({2 * cells * _CELL / 2**20:.0f} MiB); raise "
                         "MQA_WORKSPACE_MB")
    return _walk_chunks(a, b, own, cells, out)


def _walk_chunks(a: Any, b: Any, own: Any, cells: int, out: int) -> Iterator[Chunk]:
    """:func:`prefill_chunks`' chunks over the validated windows ``[a, b)`` (empty ones as ``[n, 0)``)."""
    import numpy as np

    r0, m = 0, len(a)
    while r0 < m:
        most = cells // int(own[r0])  # >= 1: every row's own cost fits (checked)
        lo = np.minimum.accumulate(a[r0:r0 + most])
        hi = np.maximum.accumulate(b[r0:r0 + most])
        cost = np.arange(1, len(lo) + 1) * (np.maximum(hi - lo, 0) + out)
        over = cost > cells
        j = int(np.argmax(over)) if over.any() else len(lo)  # rows in this chunk (>= 1)
        yield Chunk(r0, r0 + j, int(lo[j - 1]), int(hi[j - 1]))
        r0 += j


def torch_where_valid(idx: "torch.Tensor", shift: int) -> "torch.Tensor":
    """``idx + shift`` where ``idx >= 0``; -1 padding stays."""
    return idx + (idx >= 0).to(idx.dtype) * shift


def whole_windows(out: "torch.Tensor", ks: "torch.Tensor", ke: "torch.Tensor", n: int, positions: str
                  ) -> "torch.Tensor":
    """Write into ``out`` [R, topk] the answer of rows whose window holds at most ``topk`` keys: every
    position of the window, ascending, then -1. Exact whatever the logits are (NaN and -inf cells are
    still in the window), so those rows need no scoring. Temporaries: one bool per cell."""
    import torch

    topk = out.shape[1]
    # both ends clamped to [0, n] before any cast or difference: an int32 ke near -2**31 less a
    # start would wrap, and an int64 window past 2**31 would wrap in the cast
    lo = ks.clamp(min=0, max=n).to(out.dtype)
    width = (ke.clamp(min=0, max=n).to(out.dtype) - lo).clamp(min=0)
    cols = torch.arange(topk, device=out.device, dtype=out.dtype)[None, :]
    if positions == "absolute":
        torch.add(cols, lo[:, None], out=out)
    else:
        out.copy_(cols.expand_as(out))
    out.masked_fill_(cols >= width[:, None], -1)
    return out


def chunked_prefill_topk(logits_fn: PrefillLogits, select: Select, q: Any, kv: Any, weights: Any,
                         ks: "torch.Tensor", ke: "torch.Tensor", topk: int, positions: str, return_values: bool,
                         workspace_bytes: int) -> "tuple[torch.Tensor, torch.Tensor | None]":
    """``fp8_mqa_topk`` as logits then selection, in row chunks within ``workspace_bytes``.

    A chunk scores only the keys its windows cover (k sliced to ``[lo, hi)``, windows shifted), so a
    packed batch of short requests costs its windows, not ``rows x N``. Rows whose window holds at
    most ``topk`` keys are their whole window (:func:`whole_windows`): without values they are not
    scored at all, so a packed batch of requests no longer than ``topk`` runs no kernel but a fill.
    The windows are read to the host once (a prefill call syncs once; the paged op does not). After
    that the host only enqueues: each chunk is planned after the previous one's kernels are launched
    (:func:`prefill_chunks`), and windows are shifted and whole rows filled on the device.
    """
    import numpy as np
    import torch

    k, k_scale = kv
    q_rows = q[0] if isinstance(q, (tuple, list)) else q
    m, n = q_rows.shape[0], k.shape[0]
    cells, select_bytes = split_workspace(workspace_bytes, topk, return_values)
    wins = torch.stack((ks, ke))
    windows = wins.cpu().numpy()  # the one sync, for both
    device = q_rows.device
    whole = np.zeros(m, dtype=bool)
    if not return_values:
        lo = np.minimum(np.maximum(windows[0], 0), n)
        whole = np.minimum(np.maximum(windows[1], 0), n) - lo <= topk
    if whole.all():
        return whole_windows(torch.empty((m, topk), dtype=torch.int32, device=device), ks, ke, n, positions), None
    scored = np.where(whole, 0, windows)  # whole rows: empty windows, which widen no chunk
    chunks = prefill_chunks(scored[0], scored[1], n, cells, topk, return_values)  # refuses a row that cannot fit
    first = next(chunks)
    wins = wins.clamp(min=0, max=n)  # the same windows, whose shift by a chunk's start cannot wrap
    if whole.any():  # the whole rows' windows emptied on the device too (they are filled, not scored)
        wins = torch.where(_whole_rows(ks, ke, n, topk)[None, :], 0, wins)
    if first.r1 == m and first.lo == 0 and first.hi >= n:
        # the caller's own windows where none was emptied (their start addresses, which a prepared
        # logits call compares, are the caller's allocations, not rows of a stacked copy)
        ks_s, ke_s = (wins[0], wins[1]) if whole.any() else (ks, ke)
        logits = logits_fn(q, kv, weights, ks_s, ke_s)
        i, vals = select(logits, ks_s, ke_s, topk, positions, return_values, select_bytes)
        del logits
        if whole.any():
            _fill_whole(i, ks, ke, n, positions)
        return i, vals
    idx = torch.empty((m, topk), dtype=torch.int32, device=device)
    vals = torch.empty((m, topk), dtype=torch.float32, device=device) if return_values else None
    for c in itertools.chain((first,), chunks):
        rows = slice(c.r0, c.r1)
        if whole[rows].all():
            whole_windows(idx[rows], ks[rows], ke[rows], n, positions)
            continue
        lo, hi = (c.lo, c.hi) if c.lo < c.hi else (0, 0)
        qc = (q[0][rows], q[1][rows]) if isinstance(q, (tuple, list)) else q[rows]
        kc = (k[lo:hi], k_scale[lo:hi])
        shifted = wins[:, rows] - lo if lo else wins[:, rows]  # the windows in the chunk's key slice
        ks_c, ke_c = shifted[0], shifted[1]
        logits = logits_fn(qc, kc, weights[rows], ks_c, ke_c)
        i, v = select(logits, ks_c, ke_c, topk, positions, return_values, select_bytes)
        del logits
        idx[rows] = torch_where_valid(i, lo) if positions == "absolute" and lo else i
        if whole[rows].any():
            _fill_whole(idx[rows], ks[rows], ke[rows], n, positions)
        if vals is not None and v is not None:
            vals[rows] = v
    return idx, vals


def _whole_rows(ks: "torch.Tensor", ke: "torch.Tensor", n: int, topk: int) -> "torch.Tensor":
    """bool [R] on the device: rows whose window ``[max(ks, 0), min(ke, n))`` holds at most ``topk``
    keys, the rule the host applies to its copy of the windows (both ends clamped to ``[0, n]`` first,
    so no int32 difference overflows)."""
    return ke.clamp(min=0, max=n) - ks.clamp(min=0, max=n) <= topk


def _fill_whole(idx: "torch.Tensor", ks: "torch.Tensor", ke: "torch.Tensor", n: int, positions: str) -> None:
    """:func:`whole_windows` for the rows of ``idx`` whose window holds at most ``idx.shape[1]`` keys,
    in place: decided on the device, so a chunk holding such rows (a causal prompt's first ``topk``)
    copies no row list from the host and does not sync. Temporaries: one answer per row."""
    import torch

    part = whole_windows(torch.empty_like(idx), ks, ke, n, positions)
    idx.copy_(torch.where(_whole_rows(ks, ke, n, idx.shape[1])[:, None], part, idx))


def paged_windows(context_lens: "torch.Tensor", next_n: int, block_tables: "torch.Tensor", block_size: int,
                  max_context_len: int) -> "torch.Tensor":
    """int32 [B * next_n]: the keys each decode row sees, ``p < lens``, capped by max_context_len and
    what the block table covers; device ops only (capturable in a CUDA graph)."""
    from .reference import visible_lengths

    cap = min(max_context_len, block_tables.shape[1] * block_size)
    return visible_lengths(context_lens, next_n).clamp(0, cap).to(dtype=block_tables.dtype).int()


def chunked_paged_topk(logits_fn: PagedLogits, select: Select, q: Any, kv_cache: "torch.Tensor", weights: Any,
                       context_lens: "torch.Tensor", block_tables: "torch.Tensor", max_context_len: int, topk: int,
                       schedule: Any, return_values: bool, workspace_bytes: int
                       ) -> "tuple[torch.Tensor, torch.Tensor | None]":
    """``fp8_paged_mqa_topk`` as paged logits then selection, in chunks of whole sequences within
    ``workspace_bytes``. No host synchronisation: the chunks follow from the shapes alone, so a decode
    step can be captured in a CUDA graph when both parts can."""
    import torch

    q_rows = q[0] if isinstance(q, (tuple, list)) else q
    b, next_n = q_rows.shape[0], q_rows.shape[1]
    cells, select_bytes = split_workspace(workspace_bytes, topk, return_values)
    per_seq = next_n * (max_context_len + (2 if return_values else 1) * topk)
    if per_seq > cells:
        raise ValueError(f"fp8_paged_mqa_topk: one sequence's logits ({next_n} x {max_context_len}) need "
                         f"{per_seq * _CELL / 2**20:.1f} MiB, more than half the workspace; raise MQA_WORKSPACE_MB")
    seqs = max(1, cells // per_seq) if per_seq else max(b, 1)
    ke = paged_windows(context_lens, next_n, block_tables, kv_cache.shape[1], max_context_len)
    ks = torch.zeros_like(ke)
    if seqs >= b:
        logits = logits_fn(q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule)
        return select(logits, ks, ke, topk, "relative", return_values, select_bytes)
    idx = torch.empty((b * next_n, topk), dtype=torch.int32, device=q_rows.device)
    vals = torch.empty((b * next_n, topk), dtype=torch.float32, device=q_rows.device) if return_values else None
    for s0 in range(0, b, seqs):
        s1 = min(b, s0 + seqs)
        seq, rows = slice(s0, s1), slice(s0 * next_n, s1 * next_n)
        qc = (q[0][seq], q[1][seq]) if isinstance(q, (tuple, list)) else q[seq]
        logits = logits_fn(qc, kv_cache, weights[rows], context_lens[seq], block_tables[seq], max_context_len, None)
        i, v = select(logits, ks[rows], ke[rows], topk, "relative", return_values, select_bytes)
        del logits
        idx[rows] = i
        if vals is not None and v is not None:
            vals[rows] = v
    return idx, vals


class Composed:
    """The kernel object of the ``composed`` provider: for each call, the logits provider and the
    ``topk_per_row`` provider the registry chooses for the tensors' arch, pair and shape."""

    @staticmethod
    def _parts(q: Any, scoring: str, pair: Any, problem: Any) -> tuple[Any, Any]:
        """(the logits provider, the topk_per_row provider) for this call, as the public ops choose."""
        from . import registry
        from .arch import arch_of_device
        from .spec import Problem

        s = registry.state()
        arch = arch_of_device((q[0] if isinstance(q, (tuple, list)) else q).device)
        logits = registry.provider_for(arch, scoring, pair, problem, s=s)
        select = registry.provider_for(arch, "topk_per_row", None, Problem(problem.m, problem.n, 1, 1), s=s)
        return logits, select

    @staticmethod
    def _select(provider: Any) -> Select:
        """The topk_per_row provider as the chunk loops call it: always (indices, values or None)."""
        def select(logits: Any, ks: Any, ke: Any, topk: int, positions: str, return_values: bool,
                   workspace_bytes: int) -> Any:
            out = provider.topk_per_row(logits, ks, ke, topk, positions=positions, return_values=return_values,
                                        workspace_bytes=workspace_bytes)
            return out if return_values else (out, None)
        return select

    def fp8_mqa_topk(self, q: Any, kv: Any, weights: Any, ks: Any, ke: Any, topk: int, *, positions: str,
                     return_values: bool, workspace_bytes: int) -> Any:
        from .memo import MQA
        from .validate import mqa_logits_args

        args = (q, kv, weights, ks, ke)
        logits_p, select_p = self._parts(q, "fp8_mqa_logits", MQA.pair(args), mqa_logits_args(*args, True))

        def logits_fn(q: Any, kv: Any, w: Any, ks: Any, ke: Any) -> Any:
            return logits_p.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=True)

        return chunked_prefill_topk(logits_fn, self._select(select_p), q, kv, weights, ks, ke, topk, positions,
                                    return_values, workspace_bytes)

    def fp8_paged_mqa_topk(self, q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_tables: Any,
                           max_context_len: int, topk: int, *, schedule: Any, return_values: bool,
                           workspace_bytes: int) -> Any:
        from .memo import PAGED
        from .validate import paged_mqa_logits_args

        args = (q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule)
        logits_p, select_p = self._parts(q, "fp8_paged_mqa_logits", PAGED.pair(args),
                                         paged_mqa_logits_args(*args[:6], True, schedule=schedule))

        def logits_fn(q: Any, kv_cache: Any, w: Any, lens: Any, tables: Any, max_len: int, sched: Any) -> Any:
            return logits_p.fp8_paged_mqa_logits(q, kv_cache, w, lens, tables, max_len, clean_logits=True,
                                                 schedule=sched)

        return chunked_paged_topk(logits_fn, self._select(select_p), q, kv_cache, weights, context_lens,
                                  block_tables, max_context_len, topk, schedule, return_values, workspace_bytes)


#: The one instance the composed spec loads.
KERNELS = Composed()


def _usable(arch: str) -> str | None:
    """The composed provider needs a provider of ``topk_per_row`` on ``arch`` (a logits provider is
    asked for per call, with the call's pair and shape)."""
    from . import registry
    from .errors import ProviderUnavailableError

    try:
        registry.provider_for(arch, "topk_per_row", None, None)
    except ProviderUnavailableError:
        return f"no provider of topk_per_row is usable on {arch} (`mqa explain --op topk_per_row` says why)"
    return None


def composed_spec() -> ProviderSpec:
    """The spec of the composed provider: every arch and pair its parts may serve, a priority below
    every kernel's fused op (100; torch_ref is 0), and the claims its parts are held to under
    ``MQA_BATCH_INVARIANT=1`` (otherwise it is as deterministic and batch-invariant as its parts)."""
    from .versions import installed_version

    return ProviderSpec(
        name=COMPOSED_NAME, ops=frozenset({"fp8_mqa_topk", "fp8_paged_mqa_topk"}), archs=frozenset({"any"}),
        priority=100, load="mqa_core.composed:KERNELS", check=_usable, distribution=COMPOSED_DISTRIBUTION,
        version=installed_version(COMPOSED_DISTRIBUTION) or "", dtype_pairs=(*DTYPE_PAIRS, FP4_PAIR),
        claims=frozenset({"deterministic", "batch_invariant"}),
        description="the best logits provider, then the best topk_per_row provider, in row chunks within "
                    "MQA_WORKSPACE_MB")
