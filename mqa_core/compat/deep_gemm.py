"""DeepGEMM's indexer API (at commit 54e2261) dispatched through mqa-core: an engine changes one
import, ``import deep_gemm`` -> ``from mqa_core.compat import deep_gemm``, and gets the best
installed provider for its device instead of DeepGEMM's kernels.

The three functions keep DeepGEMM's names, positional order and defaults. They call the public
``mqa_core.fp8_mqa_logits`` / ``mqa_core.fp8_paged_mqa_logits`` (validation, provider choice,
``MQA_PROVIDER`` and friends all apply), never a specific provider. What still differs from
DeepGEMM is listed in ``docs/compat-deep-gemm.md``; the main points:

- ``schedule_meta`` is mqa-core's schedule (``mqa_core.paged_schedule``, DeepGEMM's shape) and goes to
  the chosen provider as a hint: a provider that reads it (the Gluon sm_90 kernel) returns the same
  logits whatever its values, one that does not balances the batch itself.
- 1-D and 2-D ``context_lens`` with any values are accepted, and ``clean_logits=True`` works for
  the paged op (DeepGEMM requires 2-D lengths and then refuses ``clean_logits``).
- Row strides of the results are the chosen provider's (the op's contract: last dim contiguous,
  row stride ``>= N``; the Triton kernels pad rows to 16 floats, torch_ref not at all), not
  necessarily DeepGEMM's 256-float alignment; shapes and values are the same.
"""

from __future__ import annotations

import torch

import mqa_core
from mqa_core.schedule import describe, paged_schedule, schedule_problem

__all__ = ["fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata"]

#: Bound on the full-width logits the compressed prefill layout computes per row chunk.
COMPRESSED_CHUNK_BYTES = 256 * 2**20


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                   clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """``[M, N]`` float32 logits (``max_seqlen_k == 0``), or DeepGEMM's compressed ``[M, max_seqlen_k]``
    layout: ``out[i, j] = logit(i, ks[i] + j)`` for ``ks[i] + j`` inside row i's window.

    Compressed cells past the window are unspecified in DeepGEMM (left unwritten); here they are
    -inf. As in DeepGEMM, ``max_seqlen_k > 0`` requires ``clean_logits=False``, and it should be at
    least the longest window (longer windows are cut). The compressed layout is computed as full-width
    rows (in chunks of at most ``COMPRESSED_CHUNK_BYTES``) and gathered: no host synchronisation.
    """
    if not isinstance(max_seqlen_k, int) or isinstance(max_seqlen_k, bool) or max_seqlen_k < 0:
        raise TypeError(f"fp8_mqa_logits: max_seqlen_k must be a non-negative int; got {max_seqlen_k!r}")
    if max_seqlen_k == 0:
        return mqa_core.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                       clean_logits=clean_logits)
    if clean_logits:
        raise ValueError("fp8_mqa_logits: max_seqlen_k > 0 (the compressed layout) needs "
                         "clean_logits=False, as in DeepGEMM")
    return _compressed(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k)


def _compressed(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                ks: torch.Tensor, ke: torch.Tensor, width: int) -> torch.Tensor:
    m, n = q.shape[0], kv[0].shape[0]
    out = torch.empty((m, width), dtype=torch.float32, device=q.device)
    if m == 0:
        return out
    rows = max(1, COMPRESSED_CHUNK_BYTES // max(4 * n, 1))
    j = torch.arange(width, device=q.device)[None, :]
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        s, e = ks[r0:r1].long()[:, None], ke[r0:r1].long()[:, None]
        full = mqa_core.fp8_mqa_logits(q[r0:r1], kv, weights[r0:r1], ks[r0:r1], ke[r0:r1],
                                       clean_logits=False)
        pos = s + j
        inside = (pos >= 0) & (pos < e) & (pos < n)
        if n:
            got = torch.gather(full, 1, pos.clamp(0, n - 1))
            out[r0:r1] = got.masked_fill_(~inside, float("-inf"))
        else:
            out[r0:r1] = float("-inf")
    return out


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """``[num_sms + 1, 2]`` int32 on ``context_lens``' device, DeepGEMM's shape: mqa-core's schedule
    (:func:`mqa_core.paged_schedule`), row ``i`` where program ``i`` of an even split of the batch's
    64-token tiles starts (sequence, tile), the last row ``(B, 0)``. ``fp8_paged_mqa_logits`` hands it to
    the chosen provider as the call's ``schedule``: computed once per step, as in DeepGEMM, instead of
    in every call. ``block_kv`` is checked, not used: the split is in the Gluon kernel's 64-token tiles
    whatever the page size. Device ops only: capturable in a CUDA graph."""
    if not isinstance(block_kv, int) or isinstance(block_kv, bool) or block_kv < 1:
        raise TypeError(f"get_paged_mqa_logits_metadata: block_kv must be a positive int; got {block_kv!r}")
    try:
        return paged_schedule(context_lens, num_sms)
    except TypeError as exc:
        raise TypeError(str(exc).replace("paged_schedule", "get_paged_mqa_logits_metadata")) from None


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor,
                         schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False) -> torch.Tensor:
    """``[B * next_n, max_context_len]`` float32 logits over DeepGEMM's paged cache, in DeepGEMM's
    argument order (``schedule_meta`` sixth, ``clean_logits`` last and False by default).

    Row ``b * next_n + j`` sees positions ``p < context_lens[b, j]`` (2-D, any values) or
    ``p < context_lens[b] - next_n + j + 1`` (1-D). ``kv_cache`` may be a strided page pool.
    Cells outside a row's context are -inf with ``clean_logits``, unspecified without.
    """
    if schedule_meta is None:  # DeepGEMM requires one; the core would take None as "no schedule"
        _schedule_meta_check(schedule_meta)
    try:  # the core checks the schedule's layout on a new signature; a known one was checked before
        return mqa_core.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                                             clean_logits=clean_logits, schedule=schedule_meta)
    except (TypeError, ValueError) as exc:
        _schedule_meta_check(schedule_meta, exc)  # DeepGEMM's name for it, before any other complaint
        raise


def _schedule_meta_check(schedule_meta: object, cause: BaseException | None = None) -> None:
    """TypeError unless ``schedule_meta`` is laid out as :func:`get_paged_mqa_logits_metadata` makes it
    (the core's layout check, with DeepGEMM's name for the argument; None is refused)."""
    if schedule_meta is None or schedule_problem(schedule_meta, getattr(schedule_meta, "device", None)):
        raise TypeError("fp8_paged_mqa_logits: schedule_meta must be int32 [num_sms + 1, 2] (from "
                        f"get_paged_mqa_logits_metadata); got {describe(schedule_meta)}") from cause
