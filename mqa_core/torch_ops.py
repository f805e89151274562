"""The ops as PyTorch custom ops, ``torch.ops.mqa.*``, for torch.compile and CUDA graphs.

Importing this module registers ``torch.ops.mqa.fp8_mqa_logits`` and
``torch.ops.mqa.fp8_paged_mqa_logits`` (once per process; ``import mqa_core`` alone never imports
torch). :func:`register` is the explicit, idempotent spelling of that import.

Each op is opaque to the compiler: dynamo records one call, the fake implementation tells it the
output's shape, dtype and strides, and at run time the real implementation asks :mod:`mqa_core`
for the provider (a cached dictionary lookup) and runs it. See ``docs/torch-compile.md``.

The output layout is fixed by the op, not by the provider, because the fake must state the exact
strides: ``[M, N]`` float32 whose rows are padded to a multiple of 16 floats (64 bytes), the
layout the Triton kernels allocate, so their results pass through untouched. A provider that returns
another layout (torch_ref's contiguous rows, when N is not a multiple of 16) is copied into it: one
extra write and read of the logits, only on that provider's path.
"""

from typing import Any

import torch

from . import api

__all__ = ["ROW_ALIGN", "fp8_mqa_logits", "fp8_paged_mqa_logits", "logits_layout", "register"]

#: The row stride of every logits tensor the ops return is N rounded up to this many floats.
ROW_ALIGN = 16


def logits_layout(m: Any, n: Any) -> tuple[tuple[Any, Any], tuple[Any, int]]:
    """(size, stride) of an ``[m, n]`` logits tensor; works on ints and SymInts alike."""
    return (m, n), ((n + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN, 1)


def _empty_logits(like: torch.Tensor, m: Any, n: Any) -> torch.Tensor:
    size, stride = logits_layout(m, n)
    return like.new_empty_strided(size, stride, dtype=torch.float32)


def _in_layout(out: torch.Tensor) -> torch.Tensor:
    """``out`` itself when it already has the declared strides, else a copy that has them."""
    size, stride = logits_layout(*out.shape)
    if out.stride() == stride and out.storage_offset() == 0:
        return out
    return _empty_logits(out, *size).copy_(out)


@torch.library.custom_op("mqa::fp8_mqa_logits", mutates_args=())
def fp8_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                   clean_logits: bool = True) -> torch.Tensor:
    """:func:`mqa_core.fp8_mqa_logits` with ``kv`` passed as ``k, k_scale`` (a schema has no tuples)."""
    out = api.fp8_mqa_logits(q, (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke,
                             clean_logits=clean_logits)
    return _in_layout(out)


@fp8_mqa_logits.register_fake
def _(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
      cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
      clean_logits: bool = True) -> torch.Tensor:
    torch._check(q.dim() == 3 and k.dim() == 2, lambda: "q must be [M, H, D] and k [N, D]")
    return _empty_logits(q, q.shape[0], k.shape[0])


@torch.library.custom_op("mqa::fp8_paged_mqa_logits", mutates_args=())
def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                         *, clean_logits: bool = True) -> torch.Tensor:
    """:func:`mqa_core.fp8_paged_mqa_logits`: ``[B * next_n, max_context_len]`` float32."""
    out = api.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                   int(max_context_len), clean_logits=clean_logits)
    return _in_layout(out)


@fp8_paged_mqa_logits.register_fake
def _(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
      block_tables: torch.Tensor, max_context_len: int, *, clean_logits: bool = True) -> torch.Tensor:
    torch._check(q.dim() == 4, lambda: "q must be [B, next_n, H, D]")
    return _empty_logits(q, q.shape[0] * q.shape[1], max_context_len)


def register() -> Any:
    """Make sure the ops are registered (they are, once this module is imported); returns
    ``torch.ops.mqa``. Idempotent: engines may call it from any number of places."""
    return torch.ops.mqa
