"""The public entry points: choose a provider, explain the choice, run the ops.

Each request reads the registry's state once and passes that snapshot down (never a second
``state()`` deep inside), so a concurrent :func:`reload` cannot mix two states in one answer.

The ops remember, in that state, what each call signature has already passed (the checks' problem,
the provider chosen for it and its prepared call): a repeated call costs a signature and a dictionary
lookup, not the checks and the choice (:mod:`mqa_core.memo`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import registry
from .arch import arch_of_device, detect_arch, normalize_arch
from .decision import Decision
from .errors import ProviderUnavailableError
from .memo import MQA, MQA_BF16, PAGED, PAGED_BF16, Op, Signature, device_of, logits_dtype_name, output_check, remember
from .provider import Entry, Provider
from .spec import FP4_PAIR, OPS, Pair, Problem, dtype_pair
from .validate import fp4_text

if TYPE_CHECKING:
    import torch

DEFAULT_OP = "fp8_mqa_logits"


def _normalize(arch: str | None, op: str, dtype: Any) -> tuple[str, Pair | None]:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}")
    arch = detect_arch() if arch is None else normalize_arch(arch)
    return arch, dtype_pair(dtype)


def get_provider(arch: str | None = None, *, op: str = DEFAULT_OP, dtype: Any = None,
                 problem: Problem | None = None) -> Provider:
    """The provider that serves ``op`` on ``arch`` (None: this process's current device).

    ``dtype`` is None (any), a q dtype meaning q and k alike, or a ``(q_dtype, k_dtype)`` pair;
    torch dtypes or their names. For an explicit arch the answer is what would serve that arch with
    what is installed here. Raises :class:`ProviderUnavailableError` (a LookupError) with every
    provider's reason when none can, or when ``MQA_PROVIDER`` names providers none of which can.
    """
    s = registry.state()
    key: tuple[object, str, object] | None = (arch, op, dtype)
    if problem is None and arch is not None:
        try:
            provider = s.fast.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable dtype (a list): take the slow path
            provider = key = None
        if provider is not None:
            return provider
    a, pair = _normalize(arch, op, dtype)
    return registry.provider_for(a, op, pair, problem, fast_key=key if arch is not None else None, s=s)


def explain(arch: str | None = None, *, op: str = DEFAULT_OP, dtype: Any = None,
            problem: Problem | None = None) -> Decision:
    """Every discovered provider (and broken plugin), accepted or rejected with reasons, and the choice.

    The chosen provider's kernel object is loaded, so a provider that fails to import shows as
    rejected ("import") and the next one is chosen, exactly as :func:`get_provider` would.
    ``dtype`` as for :func:`get_provider`; the decision shows the pair asked for and what every
    provider declares on ``arch``.
    """
    s = registry.state()
    a, pair = _normalize(arch, op, dtype)
    try:
        registry.provider_for(a, op, pair, problem, s=s)
    except LookupError:
        pass
    return registry.decision(a, op, pair, problem, s=s)


def fp8_mqa_logits(q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]", weights: "torch.Tensor",
                   cu_seqlen_ks: "torch.Tensor", cu_seqlen_ke: "torch.Tensor", *,
                   clean_logits: bool = True, logits_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """fp8 MQA logits, served by the provider chosen for ``q``'s device, the (q, k) dtype pair and shape.

    ``logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n])`` for
    ``max(ks[m], 0) <= n < min(ke[m], N)``, ``-inf`` elsewhere when ``clean_logits``.

    ``logits_dtype``: ``torch.float32`` (the default; None means the same) or ``torch.bfloat16``:
    each logit computed as for float32, then rounded once to bfloat16 (-inf stays -inf). Providers
    whose kernel writes bf16 itself halve the bytes written; the others' float32 result is rounded.
    """
    s = registry.state()
    if logits_dtype is None:
        return _call(s, MQA, s.mqa_calls, (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke), clean_logits)
    if logits_dtype_name(logits_dtype, MQA.name) == "float32":
        return _call(s, MQA, s.mqa_calls, (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke), clean_logits)
    import torch

    return _call(s, MQA_BF16, s.mqa_bf16_calls, (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, torch.bfloat16),
                 clean_logits)


def fp8_paged_mqa_logits(q: "torch.Tensor", kv_cache: "torch.Tensor", weights: "torch.Tensor",
                         context_lens: "torch.Tensor", block_tables: "torch.Tensor",
                         max_context_len: int, *, clean_logits: bool = True,
                         schedule: "torch.Tensor | None" = None,
                         logits_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """The decode variant over a paged fp8 cache; see the docs for the block layout.

    The cache holds bytes of q's fp8 flavour, so the provider is chosen on the pair (q, q).
    ``schedule``: the step's :func:`mqa_core.paged_schedule`, computed once for all of a step's calls;
    a hint, read by the providers that can use it (the results do not depend on it).
    ``logits_dtype``: as in :func:`fp8_mqa_logits`.
    """
    s = registry.state()
    args = (q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule)
    if logits_dtype is None:
        return _call(s, PAGED, s.paged_calls, args, clean_logits)
    if logits_dtype_name(logits_dtype, PAGED.name) == "float32":
        return _call(s, PAGED, s.paged_calls, args, clean_logits)
    import torch

    return _call(s, PAGED_BF16, s.paged_bf16_calls, (*args, torch.bfloat16), clean_logits)


def _call(s: registry._State, op: Op, table: "dict[Signature, Entry] | None", args: tuple[Any, ...],
          clean_logits: Any) -> "torch.Tensor":
    """Either public op on state ``s``: a remembered signature goes straight to its provider (and its
    prepared call); a new one is checked, a provider chosen, and after it ran, remembered with the
    provider's prepared call. (``table`` is None under MQA_VALIDATE=full: every call is checked.)"""
    key, hit = op.recall(table, *args, clean_logits)
    if hit is not None:  # selection matched the provider to the arch, pair and shape: no checks again
        return hit[1].run(op, hit[0], args, clean_logits, hit[2], hit[3])
    problem = op.check(*args, clean_logits, full=s.settings.validate_full)
    arch, pair = arch_of_device(device_of(args[0])), op.pair(args)
    try:
        provider = registry.provider_for(arch, op.name, pair, problem, s=s)
    except ProviderUnavailableError as exc:
        if pair != FP4_PAIR:
            raise
        raise ProviderUnavailableError(f"{op.name}: {fp4_text(arch)}.\n{exc}", getattr(exc, "decision", None)) from None
    out = provider.run(op, problem, args, clean_logits)
    if key is not None:
        remember(table, key, (problem, provider, provider.prepare(op, args, clean_logits),
                              output_check(out, op.tensors(args))))
    return out


def reload() -> None:
    """Re-read the ``MQA_*`` environment variables and rediscover plugins on next use."""
    registry.reload()


def _topk_provider(op: str, problem: Problem, q: Any, pair: Pair | None) -> Provider:
    s = registry.state()
    return registry.provider_for(arch_of_device(device_of(q)), op, pair, problem, s=s)


def fp8_mqa_topk(q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]", weights: "torch.Tensor",
                 cu_seqlen_ks: "torch.Tensor", cu_seqlen_ke: "torch.Tensor", topk: int, *,
                 positions: str = "relative", return_values: bool = False) -> Any:
    """The indexer step for prefill: int32 ``[M, topk]``, row m the positions of the ``topk`` largest
    logits (as :func:`fp8_mqa_logits` defines them) inside ``[max(ks[m], 0), min(ke[m], N))``.

    Ties go to the smaller position; positions ascend; ``-1`` fills the tail of a window shorter than
    ``topk``. ``positions="relative"`` counts from the window start, ``"absolute"`` from key 0.
    ``return_values=True`` returns ``(indices, values)``: the float32 logits of those positions
    (``-inf`` in the padding). Extra device memory stays within ``MQA_WORKSPACE_MB`` whatever N is.
    """
    from .indexer import mqa_topk_args

    args = (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke)
    problem = mqa_topk_args(args, topk, positions, return_values)
    provider = _topk_provider("fp8_mqa_topk", problem, q, MQA.pair(args))
    return provider.fp8_mqa_topk(*args, topk, positions=positions, return_values=return_values)


def fp8_paged_mqa_topk(q: "torch.Tensor", kv_cache: "torch.Tensor", weights: "torch.Tensor",
                       context_lens: "torch.Tensor", block_tables: "torch.Tensor", max_context_len: int,
                       topk: int, *, schedule: "torch.Tensor | None" = None, return_values: bool = False) -> Any:
    """The indexer step for decode: int32 ``[B * next_n, topk]``, row ``b * next_n + j`` the positions
    ``p < len`` of its ``topk`` largest logits (:func:`fp8_paged_mqa_logits`; 1-D or 2-D
    ``context_lens``), with the rules of :func:`fp8_mqa_topk`. No host synchronisation where the
    chosen provider has none (the composed path has none): a decode step can be graph-captured."""
    from .indexer import paged_topk_args

    args = (q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule)
    problem = paged_topk_args(args, topk, return_values)
    provider = _topk_provider("fp8_paged_mqa_topk", problem, q, PAGED.pair(args))
    return provider.fp8_paged_mqa_topk(*args[:6], topk, schedule=schedule, return_values=return_values)


def topk_per_row(logits: "torch.Tensor", ks: "torch.Tensor", ke: "torch.Tensor", topk: int, *,
                 positions: str = "relative", return_values: bool = False) -> Any:
    """The selection of :func:`fp8_mqa_topk` over given logits (float32 or bfloat16 ``[M, N]``, any row
    stride; window ``[max(ks[m], 0), min(ke[m], N))``), served by the best ``topk_per_row`` provider."""
    from .indexer import topk_per_row_args

    problem = topk_per_row_args(logits, ks, ke, topk, positions, return_values)
    provider = _topk_provider("topk_per_row", problem, logits, None)
    return provider.topk_per_row(logits, ks, ke, topk, positions=positions, return_values=return_values)
