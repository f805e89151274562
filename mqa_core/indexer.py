"""The indexer step as ops of the plugin system: the top-k key positions per query.

Engines do not want logits; they want, per query, the ``topk`` keys sparse attention will read. Three
ops serve that step (docs/indexer-step.md):

- ``fp8_mqa_topk``: the prefill scoring op and the selection in one call;
- ``fp8_paged_mqa_topk``: the same over the paged decode cache;
- ``topk_per_row``: the selection alone over given logits, so that top-k kernels are providers too.

The selection rule is exact and the same everywhere: row m holds the positions of the ``topk`` largest
logits inside its window, ties to the smaller position, in ascending order, ``-1`` where the window
holds fewer than ``topk`` keys; logits compare as floats (``-0.0 == 0.0``, ``-inf`` an ordinary value,
NaN below everything). ``return_values=True`` also returns the float32 logits of those positions
(``-inf`` in the padding), which a key-sharded merge needs.

This module checks the arguments before any kernel runs, asks the provider's kernel object, and
checks what it returns; :mod:`mqa_core.composed` is the core's own provider of the two fused ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ProviderResultError
from .spec import Problem, ProviderSpec
from .validate import _desc, _same_device, _tensor, mqa_logits_args, paged_mqa_logits_args

if TYPE_CHECKING:
    import torch

    from .provider import Provider

#: How positions are counted: from each row's window start (vLLM's ``top_k_per_row_prefill``) or from key 0.
POSITIONS = ("relative", "absolute")
#: The logits dtypes ``topk_per_row`` selects over.
LOGITS_DTYPES = ("float32", "bfloat16")
#: Output tensors' names, for the overlap check.
_OUT_NAMES = ("indices", "values")


def _topk_options(op: str, topk: Any, positions: Any, return_values: Any) -> None:
    if not isinstance(topk, int) or isinstance(topk, bool):
        raise TypeError(f"{op}: topk must be an int; got {type(topk).__name__}")
    if not 1 <= topk < 2**31:
        raise ValueError(f"{op}: topk must be at least 1 (and below 2**31); got {topk}")
    if positions not in POSITIONS:
        raise ValueError(f"{op}: positions must be one of {', '.join(map(repr, POSITIONS))}; got {positions!r}")
    if not isinstance(return_values, bool):
        raise TypeError(f"{op}: return_values must be a bool; got {type(return_values).__name__}")


def topk_per_row_args(logits: Any, ks: Any, ke: Any, topk: Any, positions: Any, return_values: Any) -> Problem:
    """Check ``topk_per_row``'s arguments; the problem is (rows, columns, 1, 1)."""
    op = "topk_per_row"
    _tensor(op, "logits", logits, LOGITS_DTYPES, (None, None), "[M, N]")
    m, n = logits.shape
    if n > 1 and m > 0 and logits.stride(1) != 1:
        raise ValueError(f"{op}: logits must have a contiguous last dim (any row stride); got strides "
                         f"{tuple(logits.stride())}")
    _tensor(op, "ks", ks, ["int32"], (m,), "[M]")
    _tensor(op, "ke", ke, ["int32"], (m,), "[M]")
    _same_device(op, {"logits": logits, "ks": ks, "ke": ke})
    _topk_options(op, topk, positions, return_values)
    if max(m, n) >= 2**31:
        raise ValueError(f"{op}: sizes must be below 2**31; got {_desc(logits)}")
    return Problem(m, n, 1, 1)


def mqa_topk_args(args: tuple[Any, ...], topk: Any, positions: Any, return_values: Any,
                  spec: ProviderSpec | None = None, full: bool = False) -> Problem:
    """Check ``fp8_mqa_topk``'s arguments (the prefill op's tensors, then the selection's options)."""
    q, kv, weights, ks, ke = args
    problem = mqa_logits_args(q, kv, weights, ks, ke, True, spec=spec, full=full, op="fp8_mqa_topk")
    _topk_options("fp8_mqa_topk", topk, positions, return_values)
    return problem


def paged_topk_args(args: tuple[Any, ...], topk: Any, return_values: Any, spec: ProviderSpec | None = None,
                    full: bool = False) -> Problem:
    """Check ``fp8_paged_mqa_topk``'s arguments: ``args`` = (q, kv_cache, weights, context_lens,
    block_tables, max_context_len, schedule)."""
    from dataclasses import replace

    q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule = args
    problem = paged_mqa_logits_args(q, kv_cache, weights, context_lens, block_tables, max_context_len, True,
                                    schedule=schedule, spec=spec, full=full, op="fp8_paged_mqa_topk")
    _topk_options("fp8_paged_mqa_topk", topk, "relative", return_values)
    values = q[0] if isinstance(q, (tuple, list)) else q
    return replace(problem, next_n=values.shape[1], block_size=kv_cache.shape[1])


def _fail(spec: ProviderSpec, op: str, what: str) -> ProviderResultError:
    return ProviderResultError(f"provider {spec.name} ({spec.distribution}=={spec.version}) returned a wrong "
                               f"result from {op}: {what}", spec.name, spec.distribution)


def check_result(out: Any, spec: ProviderSpec, op: str, rows: int, topk: int, device: "torch.device",
                 return_values: bool, inputs: tuple[Any, ...], names: tuple[str, ...]
                 ) -> "tuple[torch.Tensor, torch.Tensor | None]":
    """What a kernel object's top-k op returned, checked: ``(indices int32 [rows, topk], values float32
    [rows, topk] or None)`` on ``device``, last dims contiguous, memory of their own (no overlap with
    an input or with each other). Values are required when ``return_values``; otherwise dropped."""
    import torch

    from .result import overlap

    if not (isinstance(out, tuple) and len(out) == 2):
        raise _fail(spec, op, f"expected a tuple (indices, values or None); got {type(out).__name__}")
    idx, values = out
    want = [("indices", idx, torch.int32)]
    if return_values:
        want.append(("values", values, torch.float32))
    for name, t, dtype in want:
        if type(t) is not torch.Tensor:
            raise _fail(spec, op, f"{name} must be exactly a torch.Tensor; got {type(t).__name__}")
        if t.dtype != dtype or tuple(t.shape) != (rows, topk) or t.device != device:
            raise _fail(spec, op, f"{name} must be {str(dtype).removeprefix('torch.')} [{rows}, {topk}] on "
                                  f"{device}; got {_desc(t)}")
        if topk > 1 and rows > 0 and t.stride(1) != 1:
            raise _fail(spec, op, f"{name} must have a contiguous last dim; got strides {tuple(t.stride())}")
        hit = overlap(t, inputs)
        if hit is not None:
            raise _fail(spec, op, f"{name} overlaps input {names[hit]} in memory: a result must be memory of "
                                  "its own")
    if return_values and overlap(values, (idx,)) is not None:
        raise _fail(spec, op, "values overlap indices in memory")
    return idx, (values if return_values else None)


def provider_call(provider: "Provider", op: str, args: tuple[Any, ...], topk: Any, positions: Any,
                  return_values: Any, workspace_bytes: int | None) -> Any:
    """One of the top-k ops on ``provider``: its arguments checked against its spec before its kernel
    runs, the kernel object's result checked after. Returns the indices, or (indices, values)."""
    from . import registry
    from .memo import MQA, PAGED

    provider._require(op)
    s = registry.state()
    spec, full = provider.spec, s.settings.validate_full
    workspace = s.settings.workspace_bytes if workspace_bytes is None else workspace_bytes
    if not isinstance(workspace, int) or isinstance(workspace, bool) or workspace < 1:
        raise ValueError(f"{op}: workspace_bytes must be a positive int; got {workspace!r}")
    fn = getattr(provider.impl, op)
    inputs: tuple[Any, ...]
    names: tuple[str, ...]
    if op == "topk_per_row":
        logits, ks, ke = args
        problem = topk_per_row_args(logits, ks, ke, topk, positions, return_values)
        inputs, names = args, ("logits", "ks", "ke")
        out = fn(*args, topk, positions=positions, return_values=return_values, workspace_bytes=workspace)
        device = args[0].device
    elif op == "fp8_mqa_topk":
        problem = mqa_topk_args(args, topk, positions, return_values, spec=spec, full=full)
        inputs, names = MQA.tensors(args), MQA.tensor_names
        out = fn(*args, topk, positions=positions, return_values=return_values, workspace_bytes=workspace)
        device = inputs[0].device
    else:
        problem = paged_topk_args(args, topk, return_values, spec=spec, full=full)
        inputs, names = PAGED.tensors(args), PAGED.tensor_names
        out = fn(*args[:6], topk, schedule=args[6], return_values=return_values, workspace_bytes=workspace)
        device = inputs[0].device
    idx, values = check_result(out, spec, op, problem.m, topk, device, return_values, inputs, names)
    return (idx, values) if return_values else idx
