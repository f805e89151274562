"""DeepGEMM's indexer API (at commit 54e2261) dispatched through mqa-core: an engine changes one
import, ``import deep_gemm`` -> ``from mqa_core.compat import deep_gemm``, and gets the best
installed provider for its device instead of DeepGEMM's kernels.

Both generations of DeepGEMM's names, with DeepGEMM's positional order and defaults: the current
``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` (q as a tensor or ``(q, q_sf)``, ``q_sf=None``
for fp8; ``logits_dtype``) and the legacy ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``, which call
them as DeepGEMM's own legacy wrappers do. They call the public ``mqa_core.fp8_mqa_logits`` /
``mqa_core.fp8_paged_mqa_logits`` (validation, provider choice, ``MQA_PROVIDER`` and friends all
apply), never a specific provider. What still differs from DeepGEMM is listed in
``docs/compat-deep-gemm.md``; the main points:

- ``schedule_meta`` is mqa-core's schedule (``mqa_core.paged_schedule``, DeepGEMM's shape) and goes to
  the chosen provider as a hint: a provider that reads it (the Gluon sm_90 kernel) returns the same
  logits whatever its values, one that does not balances the batch itself.
- 1-D and 2-D ``context_lens`` with any values are accepted, and ``clean_logits=True`` works for
  the paged op (DeepGEMM requires 2-D lengths and then refuses ``clean_logits``).
- Row strides of the results are the chosen provider's (the op's contract: last dim contiguous,
  row stride ``>= N``; the Triton kernels pad rows to 64 bytes, torch_ref not at all), not
  necessarily DeepGEMM's 1024-byte alignment; shapes and values are the same.
- FP4 (``q_sf`` given) is served where a provider declares the FP4 pair on the device's arch, and
  refused with one error naming FP4 and the arch elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch

import mqa_core
from mqa_core.schedule import describe, paged_schedule, schedule_problem

__all__ = ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits", "fp8_paged_mqa_logits",
           "get_paged_mqa_logits_metadata"]

#: Bound on the full-width logits the compressed prefill layout computes per row chunk.
COMPRESSED_CHUNK_BYTES = 256 * 2**20


def fp8_fp4_mqa_logits(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
                       kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                       clean_logits: bool = True, max_seqlen_k: int = 0,
                       logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DeepGEMM's current prefill name: ``[M, N]`` logits of ``logits_dtype`` (float32 or bfloat16)
    (``max_seqlen_k == 0``), or DeepGEMM's compressed ``[M, max_seqlen_k]`` layout: ``out[i, j] =
    logit(i, ks[i] + j)`` for ``ks[i] + j`` inside row i's window.

    ``q`` is a tensor or ``(q, q_sf)``: ``q_sf=None`` means fp8 (``kv = (k, k_scale float32)``);
    a ``q_sf`` means FP4, DeepGEMM's layout: q packed e2m1 ``[M, H, D / 2]`` with UE8M0 scales of
    32 values packed four to an int32 ``[M, H]``, ``kv = (k [N, D / 2], k_sf int32 [N])``. As in
    DeepGEMM, bfloat16 ``weights`` need ``logits_dtype=torch.bfloat16``; they are widened to float32
    (exactly) for the core.

    Compressed cells past the window are unspecified in DeepGEMM (left unwritten); here they are
    -inf. As in DeepGEMM, ``max_seqlen_k > 0`` requires ``clean_logits=False``, and it should be at
    least the longest window (longer windows are cut). The compressed layout is computed as full-width
    rows (in chunks of at most ``COMPRESSED_CHUNK_BYTES``) and gathered: no host synchronisation.
    """
    op = "fp8_fp4_mqa_logits"
    qq = _q_of(op, q)
    out_dtype = _logits_dtype(op, logits_dtype)
    weights = _weights(op, weights, logits_dtype)
    if not isinstance(max_seqlen_k, int) or isinstance(max_seqlen_k, bool) or max_seqlen_k < 0:
        raise TypeError(f"{op}: max_seqlen_k must be a non-negative int; got {max_seqlen_k!r}")
    if max_seqlen_k == 0:
        return mqa_core.fp8_mqa_logits(qq, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                       clean_logits=clean_logits, logits_dtype=out_dtype)
    if clean_logits:
        raise ValueError(f"{op}: max_seqlen_k > 0 (the compressed layout) needs clean_logits=False, as in DeepGEMM")
    return _compressed(qq, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k, out_dtype)


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                   clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """DeepGEMM's legacy prefill name: :func:`fp8_fp4_mqa_logits` with ``(q, None)`` and float32
    logits (what DeepGEMM's own legacy wrapper passes)."""
    if not isinstance(max_seqlen_k, int) or isinstance(max_seqlen_k, bool) or max_seqlen_k < 0:
        raise TypeError(f"fp8_mqa_logits: max_seqlen_k must be a non-negative int; got {max_seqlen_k!r}")
    if max_seqlen_k and clean_logits:
        raise ValueError("fp8_mqa_logits: max_seqlen_k > 0 (the compressed layout) needs "
                         "clean_logits=False, as in DeepGEMM")
    if max_seqlen_k == 0:
        return mqa_core.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                       clean_logits=clean_logits)
    return _compressed(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k, None)


def _q_of(op: str, q: Any) -> Any:
    """DeepGEMM's ``q`` argument as the core takes it: a tensor (fp8), or the pair (FP4)."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            raise TypeError(f"{op}: q must be a tensor or (q, q_sf); got a {type(q).__name__} of length {len(q)}")
        return q[0] if q[1] is None else (q[0], q[1])
    return q


def _logits_dtype(op: str, logits_dtype: Any) -> torch.dtype | None:
    """None for float32 (the core's default path), torch.bfloat16; TypeError otherwise (DeepGEMM
    asserts the same two)."""
    if logits_dtype is torch.float32:
        return None
    if logits_dtype is torch.bfloat16:
        return torch.bfloat16
    raise TypeError(f"{op}: logits_dtype must be torch.float32 or torch.bfloat16, as in DeepGEMM; "
                    f"got {logits_dtype!r}")


def _weights(op: str, weights: Any, logits_dtype: Any) -> Any:
    """bfloat16 weights (DeepGEMM sm_100) widened exactly to float32; only with bf16 logits, as there."""
    if isinstance(weights, torch.Tensor) and weights.dtype is torch.bfloat16:
        if logits_dtype is not torch.bfloat16:
            raise TypeError(f"{op}: bfloat16 weights need logits_dtype=torch.bfloat16, as in DeepGEMM")
        return weights.float()
    return weights


def _compressed(q: Any, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                ks: torch.Tensor, ke: torch.Tensor, width: int, logits_dtype: torch.dtype | None) -> torch.Tensor:
    values = q[0] if isinstance(q, tuple) else q
    m, n = values.shape[0], kv[0].shape[0]
    out = torch.empty((m, width), dtype=logits_dtype or torch.float32, device=values.device)
    if m == 0:
        return out
    rows = max(1, COMPRESSED_CHUNK_BYTES // max(4 * n, 1))
    j = torch.arange(width, device=values.device)[None, :]
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        s, e = ks[r0:r1].long()[:, None], ke[r0:r1].long()[:, None]
        part: Any = (q[0][r0:r1], q[1][r0:r1]) if isinstance(q, tuple) else q[r0:r1]
        full = mqa_core.fp8_mqa_logits(part, kv, weights[r0:r1], ks[r0:r1], ke[r0:r1],
                                       clean_logits=False, logits_dtype=logits_dtype)
        pos = s + j
        inside = (pos >= 0) & (pos < e) & (pos < n)
        if n:
            got = torch.gather(full, 1, pos.clamp(0, n - 1))
            out[r0:r1] = got.masked_fill_(~inside, float("-inf"))
        else:
            out[r0:r1] = float("-inf")
    return out


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """``[num_sms + 1, 2]`` int32 on ``context_lens``' device, DeepGEMM's shape: mqa-core's schedule
    (:func:`mqa_core.paged_schedule`), row ``i`` where program ``i`` of an even split of the batch's
    64-token tiles starts (sequence, tile), the last row ``(B, 0)``. ``fp8_paged_mqa_logits`` hands it to
    the chosen provider as the call's ``schedule``: computed once per step, as in DeepGEMM, instead of
    in every call. ``block_kv`` is checked, not used: the split is in the Gluon kernel's 64-token tiles
    whatever the page size. ``indices`` (DeepGEMM sm_100's varlen grouping) is checked as DeepGEMM
    does and otherwise not used. Device ops only: capturable in a CUDA graph."""
    if not isinstance(block_kv, int) or isinstance(block_kv, bool) or block_kv < 1:
        raise TypeError(f"get_paged_mqa_logits_metadata: block_kv must be a positive int; got {block_kv!r}")
    _indices_check("get_paged_mqa_logits_metadata", indices, context_lens)
    try:
        return paged_schedule(context_lens, num_sms)
    except TypeError as exc:
        raise TypeError(str(exc).replace("paged_schedule", "get_paged_mqa_logits_metadata")) from None


def fp8_fp4_paged_mqa_logits(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], kv_cache: torch.Tensor,
                             weights: torch.Tensor, context_lens: torch.Tensor, block_table: torch.Tensor,
                             schedule_meta: torch.Tensor, max_context_len: int, clean_logits: bool = False,
                             logits_dtype: torch.dtype = torch.float32,
                             indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM's current decode name: ``[B * next_n, max_context_len]`` logits of ``logits_dtype``
    over DeepGEMM's paged cache, in DeepGEMM's argument order (``schedule_meta`` sixth, then
    ``max_context_len``, ``clean_logits=False``, ``logits_dtype``, ``indices``).

    ``q`` is a tensor ``[B, next_n, H, D]`` or ``(q, q_sf)``: ``q_sf=None`` means fp8 (cache blocks of
    ``block_size * D`` fp8 bytes, then float32 scales); a ``q_sf`` (int32 ``[B, next_n, H]``) means FP4
    (q packed ``[B, next_n, H, D / 2]``; blocks of ``block_size * D / 2`` packed bytes, then one int32
    of four UE8M0 scales per token). Row ``b * next_n + j`` sees positions ``p < context_lens[b, j]``
    (2-D, any values) or ``p < context_lens[b] - next_n + j + 1`` (1-D). ``kv_cache`` may be a strided
    page pool. Cells outside a row's context are -inf with ``clean_logits``, unspecified without.
    ``indices`` (DeepGEMM sm_100's varlen: which request each row belongs to, next_n = 1) groups rows
    for DeepGEMM's scheduler only; it is checked and does not change the logits here.
    """
    op = "fp8_fp4_paged_mqa_logits"
    qq = _q_of(op, q)
    out_dtype = _logits_dtype(op, logits_dtype)
    weights = _weights(op, weights, logits_dtype)
    _indices_check(op, indices, context_lens, (qq[0] if isinstance(qq, tuple) else qq))
    return _paged(op, qq, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                  clean_logits, out_dtype)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor,
                         schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM's legacy decode name: :func:`fp8_fp4_paged_mqa_logits` with ``(q, None)`` and float32
    logits, in DeepGEMM's argument order (``schedule_meta`` sixth, ``clean_logits`` False by default).

    Row ``b * next_n + j`` sees positions ``p < context_lens[b, j]`` (2-D, any values) or
    ``p < context_lens[b] - next_n + j + 1`` (1-D). ``kv_cache`` may be a strided page pool.
    Cells outside a row's context are -inf with ``clean_logits``, unspecified without.
    """
    _indices_check("fp8_paged_mqa_logits", indices, context_lens, q)
    return _paged("fp8_paged_mqa_logits", q, kv_cache, weights, context_lens, block_table, schedule_meta,
                  max_context_len, clean_logits, None)


def _paged(op: str, q: Any, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
           block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int, clean_logits: bool,
           logits_dtype: torch.dtype | None) -> torch.Tensor:
    if schedule_meta is None:  # DeepGEMM requires one; the core would take None as "no schedule"
        _schedule_meta_check(op, schedule_meta)
    try:  # the core checks the schedule's layout on a new signature; a known one was checked before
        return mqa_core.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                                             clean_logits=clean_logits, schedule=schedule_meta,
                                             logits_dtype=logits_dtype)
    except (TypeError, ValueError) as exc:
        _schedule_meta_check(op, schedule_meta, exc)  # DeepGEMM's name for it, before any other complaint
        raise


def _indices_check(op: str, indices: Any, context_lens: Any, q: Any = None) -> None:
    """DeepGEMM's rules for ``indices``: None, or int32 ``[B]`` with next_n = 1 (its values group rows
    for DeepGEMM's scheduler; here they change nothing)."""
    if indices is None:
        return
    batch = getattr(context_lens, "shape", (None,))[0]
    ok = (isinstance(indices, torch.Tensor) and indices.dtype is torch.int32 and indices.dim() == 1
          and indices.shape[0] == batch)
    if not ok:
        raise TypeError(f"{op}: indices must be None or int32 [B] (B = {batch}, context_lens' rows); "
                        f"got {describe(indices)}")
    if q is not None and getattr(q, "dim", lambda: 0)() == 4 and q.shape[1] != 1:
        raise ValueError(f"{op}: indices (varlen rows) need next_n = 1, as in DeepGEMM; q has next_n = {q.shape[1]}")


def _schedule_meta_check(op: str, schedule_meta: object, cause: BaseException | None = None) -> None:
    """TypeError unless ``schedule_meta`` is laid out as :func:`get_paged_mqa_logits_metadata` makes it
    (the core's layout check, with DeepGEMM's name for the argument; None is refused)."""
    if schedule_meta is None or schedule_problem(schedule_meta, getattr(schedule_meta, "device", None)):
        raise TypeError(f"{op}: schedule_meta must be int32 [num_sms + 1, 2] (from "
                        f"get_paged_mqa_logits_metadata); got {describe(schedule_meta)}") from cause
