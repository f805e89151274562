"""The ops as PyTorch operators, ``torch.ops.mqa.*``, for torch.compile and CUDA graphs.

Importing this module registers ``torch.ops.mqa.fp8_mqa_logits`` and
``torch.ops.mqa.fp8_paged_mqa_logits`` (once per process; ``import mqa_core`` alone never imports
torch). :func:`register` is the explicit, idempotent spelling of that import.

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

__all__ = ["fp8_mqa_logits", "fp8_paged_mqa_logits", "register"]

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

#: The operators themselves (``torch.ops.mqa.*``), callable with the ops' arguments.
fp8_mqa_logits = torch.ops.mqa.fp8_mqa_logits
fp8_paged_mqa_logits = torch.ops.mqa.fp8_paged_mqa_logits


def register() -> Any:
    """Make sure the ops are registered (they are, once this module is imported); returns
    ``torch.ops.mqa``. Idempotent: engines may call it from any number of places."""
    return torch.ops.mqa
