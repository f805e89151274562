"""The ops as PyTorch operators, ``torch.ops.mqa.*``, for torch.compile and CUDA graphs.

Importing this module registers ``torch.ops.mqa.fp8_mqa_logits``, ``torch.ops.mqa.fp8_paged_mqa_logits``
and the indexer step's ``fp8_mqa_topk``, ``fp8_paged_mqa_topk`` and ``topk_per_row`` (once per process;
``import mqa_core`` alone never imports torch). :func:`register` is the explicit, idempotent spelling of that import.

Each op is opaque to the compiler: dynamo records one call, the fake implementation tells it the
output's shape, dtype and layout, and at run time the real implementation is :mod:`mqa_core`'s op
(a signature lookup on a repeated call, then the provider). See ``docs/torch-compile.md``.

The ops are defined with ``torch.library.Library`` and their implementation registered for every
backend (``CompositeExplicitAutograd``), not with ``torch.library.custom_op``: the latter wraps each
call in Python layers (autograd, argument handling) that cost more host time than the whole core.

**Layout.** The result is what the chosen provider returned, never copied: ``[M, N]`` float32 (or the
``logits_dtype`` asked for: ``torch.bfloat16``), last
dim contiguous, row stride any value ``>= N`` (the op's contract; DeepGEMM pads rows to
``align(N + 256, 256)`` floats, AITER to 256, the Triton kernels to 16, torch_ref not at all). The
fake states exactly that: a row stride that is a fresh data-dependent size (an unbacked SymInt, read
from the real result at run time, checked ``>= N``), so a compiled graph holds whatever the provider
chosen at run time returns, after a ``reload()`` too, with dynamic shapes, and in a CUDA graph.
"""

from typing import Any

import torch

from . import api
from .validate import _same_device

__all__ = ["fp8_mqa_logits", "fp8_mqa_topk", "fp8_paged_mqa_logits", "fp8_paged_mqa_topk", "register", "topk_indices",
           "topk_per_row"]

_PREFILL = ("fp8_mqa_logits(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seqlen_ks, "
            "Tensor cu_seqlen_ke, *, bool clean_logits=True, ScalarType? logits_dtype=None) -> Tensor")
_PAGED = ("fp8_paged_mqa_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, "
          "Tensor block_tables, SymInt max_context_len, *, bool clean_logits=True, Tensor? schedule=None, "
          "ScalarType? logits_dtype=None) -> Tensor")

_lib = torch.library.Library("mqa", "DEF")  # kept alive here: the registrations last as long as it does
_lib.define(_PREFILL)
_lib.define(_PAGED)


def _rows(out: torch.Tensor) -> torch.Tensor:
    """The provider's result as the fake describes it: ``out`` itself, as the result check has made
    sure (last dim contiguous, row stride >= N), except in a degenerate shape where that check lets
    one stride be anything (one row, or at most one column): then a view stating the same cells."""
    m, n = out.shape
    s0, s1 = out.stride()
    if s1 == 1 and s0 >= n:
        return out
    return out.as_strided((m, n), (max(s0, n), 1))


def _prefill(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
             cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *, clean_logits: bool = True,
             logits_dtype: torch.dtype | None = None) -> torch.Tensor:
    return _rows(api.fp8_mqa_logits(q, (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke,
                                    clean_logits=clean_logits, logits_dtype=logits_dtype))


def _paged(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
           block_tables: torch.Tensor, max_context_len: int, *, clean_logits: bool = True,
           schedule: torch.Tensor | None = None, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
    return _rows(api.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                          clean_logits=clean_logits, schedule=schedule, logits_dtype=logits_dtype))


def _fake_logits(like: torch.Tensor, m: Any, n: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[m, n]`` logits (float32 unless ``dtype``) whose row stride is known at run time only (read
    from the result), >= n.

    Without a shape environment (meta tensors, or a bare ``FakeTensorMode``) there is no compiled
    code to read the strides, and the stride cannot be symbolic: contiguous rows are stated."""
    dtype = dtype or torch.float32
    try:
        ctx = torch.library.get_ctx()
    except RuntimeError:  # meta tensors: get_ctx() refuses outside a fake-tensor mode
        return like.new_empty((m, n), dtype=dtype)
    if getattr(ctx, "_shape_env", True) is None:
        return like.new_empty((m, n), dtype=dtype)
    row = ctx.new_dynamic_size()
    torch._check(row >= n, lambda: "the logits' row stride is at least N")
    return like.new_empty_strided((m, n), (row, 1), dtype=dtype)


def _prefill_fake(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                  cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                  clean_logits: bool = True, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
    # The dispatcher runs this (the Meta kernel) when any one argument is on the meta device: mixed
    # devices get the public op's refusal here, not an uninitialised result.
    _same_device("fp8_mqa_logits", {"q": q, "k": k, "k_scale": k_scale, "weights": weights,
                                    "cu_seqlen_ks": cu_seqlen_ks, "cu_seqlen_ke": cu_seqlen_ke})
    torch._check(q.dim() == 3 and k.dim() == 2, lambda: "q must be [M, H, D] and k [N, D]")
    return _fake_logits(q, q.shape[0], k.shape[0], logits_dtype)


def _paged_fake(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                block_tables: torch.Tensor, max_context_len: Any, *, clean_logits: bool = True,
                schedule: torch.Tensor | None = None, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
    op = "fp8_paged_mqa_logits"
    _same_device(op, {"q": q, "kv_cache": kv_cache, "weights": weights, "context_lens": context_lens,
                      "block_tables": block_tables})
    if schedule is not None and schedule.device != q.device:  # the device only: no guard on its sizes
        raise TypeError(f"{op}: schedule is on {schedule.device}, the call's tensors on {q.device}")
    torch._check(q.dim() == 4, lambda: "q must be [B, next_n, H, D]")
    return _fake_logits(q, q.shape[0] * q.shape[1], max_context_len, logits_dtype)


# The fake first: it is also the Meta kernel, which must not be the backend-wide implementation.
torch.library.register_fake("mqa::fp8_mqa_logits", _prefill_fake, lib=_lib)
torch.library.register_fake("mqa::fp8_paged_mqa_logits", _paged_fake, lib=_lib)
_lib.impl("fp8_mqa_logits", _prefill, "CompositeExplicitAutograd")
_lib.impl("fp8_paged_mqa_logits", _paged, "CompositeExplicitAutograd")

# -- the indexer step -------------------------------------------------------------------------------
# A schema has a fixed number of outputs and none of them optional, so each top-k operator always
# returns (indices, values): values is ``[rows, topk]`` float32 with ``return_values=True``, and an
# empty ``[0, topk]`` float32 tensor otherwise (no memory, nothing computed). ``topk_indices`` is the
# Python wrapper that drops it. The results are contiguous (a provider's rarer layout is copied), so
# the fake states plain contiguous tensors.

_TOPK = ("fp8_mqa_topk(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seqlen_ks, "
         "Tensor cu_seqlen_ke, int topk, *, str positions=\"relative\", bool return_values=False) -> (Tensor, Tensor)")
_PAGED_TOPK = ("fp8_paged_mqa_topk(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, "
               "Tensor block_tables, SymInt max_context_len, int topk, *, Tensor? schedule=None, "
               "bool return_values=False) -> (Tensor, Tensor)")
_PER_ROW = ("topk_per_row(Tensor logits, Tensor ks, Tensor ke, int topk, *, str positions=\"relative\", "
            "bool return_values=False) -> (Tensor, Tensor)")
_lib.define(_TOPK)
_lib.define(_PAGED_TOPK)
_lib.define(_PER_ROW)


def _pair(out: Any, topk: int, return_values: bool) -> tuple[torch.Tensor, torch.Tensor]:
    idx, values = out if return_values else (out, None)
    idx = idx if idx.is_contiguous() else idx.contiguous()
    if values is None:
        return idx, idx.new_empty((0, topk), dtype=torch.float32)
    return idx, values if values.is_contiguous() else values.contiguous()


def _topk(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
          cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, topk: int, *, positions: str = "relative",
          return_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _pair(api.fp8_mqa_topk(q, (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke, topk, positions=positions,
                                  return_values=return_values), topk, return_values)


def _paged_topk(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                block_tables: torch.Tensor, max_context_len: int, topk: int, *, schedule: torch.Tensor | None = None,
                return_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _pair(api.fp8_paged_mqa_topk(q, kv_cache, weights, context_lens, block_tables, max_context_len, topk,
                                        schedule=schedule, return_values=return_values), topk, return_values)


def _per_row(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *, positions: str = "relative",
             return_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _pair(api.topk_per_row(logits, ks, ke, topk, positions=positions, return_values=return_values), topk,
                 return_values)


def _fake_pair(like: torch.Tensor, rows: Any, topk: int, return_values: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk must be an int of at least 1; got {topk!r}")
    return (like.new_empty((rows, topk), dtype=torch.int32),
            like.new_empty((rows if return_values else 0, topk), dtype=torch.float32))


def _topk_fake(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
               cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, topk: int, *, positions: str = "relative",
               return_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _same_device("fp8_mqa_topk", {"q": q, "k": k, "k_scale": k_scale, "weights": weights,
                                  "cu_seqlen_ks": cu_seqlen_ks, "cu_seqlen_ke": cu_seqlen_ke})
    torch._check(q.dim() == 3 and k.dim() == 2, lambda: "q must be [M, H, D] and k [N, D]")
    return _fake_pair(q, q.shape[0], topk, return_values)


def _paged_topk_fake(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                     block_tables: torch.Tensor, max_context_len: Any, topk: int, *,
                     schedule: torch.Tensor | None = None, return_values: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    _same_device("fp8_paged_mqa_topk", {"q": q, "kv_cache": kv_cache, "weights": weights,
                                        "context_lens": context_lens, "block_tables": block_tables})
    torch._check(q.dim() == 4, lambda: "q must be [B, next_n, H, D]")
    return _fake_pair(q, q.shape[0] * q.shape[1], topk, return_values)


def _per_row_fake(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                  positions: str = "relative", return_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _same_device("topk_per_row", {"logits": logits, "ks": ks, "ke": ke})
    torch._check(logits.dim() == 2, lambda: "logits must be [M, N]")
    return _fake_pair(logits, logits.shape[0], topk, return_values)


for _name, _fake, _impl in (("fp8_mqa_topk", _topk_fake, _topk),
                            ("fp8_paged_mqa_topk", _paged_topk_fake, _paged_topk),
                            ("topk_per_row", _per_row_fake, _per_row)):
    torch.library.register_fake(f"mqa::{_name}", _fake, lib=_lib)
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")

#: The operators themselves (``torch.ops.mqa.*``), callable with the ops' arguments.
fp8_mqa_logits = torch.ops.mqa.fp8_mqa_logits
fp8_paged_mqa_logits = torch.ops.mqa.fp8_paged_mqa_logits
#: The top-k operators: each returns (indices, values); values is empty unless ``return_values=True``.
fp8_mqa_topk = torch.ops.mqa.fp8_mqa_topk
fp8_paged_mqa_topk = torch.ops.mqa.fp8_paged_mqa_topk
topk_per_row = torch.ops.mqa.topk_per_row


def topk_indices(out: tuple[torch.Tensor, torch.Tensor], return_values: bool = False) -> Any:
    """A top-k operator's result as the public op returns it: the indices, or (indices, values) when
    ``return_values``. Traceable: ``torch.compile`` sees a tuple index."""
    return out if return_values else out[0]


def register() -> Any:
    """Make sure the ops are registered (they are, once this module is imported); returns
    ``torch.ops.mqa``. Idempotent: engines may call it from any number of places."""
    return torch.ops.mqa
