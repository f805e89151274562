"""The public entry points: choose a provider, explain the choice, run the ops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import registry, validate
from .arch import arch_of_device, detect_arch, normalize_arch
from .decision import Decision
from .provider import Provider
from .spec import OPS, Problem

if TYPE_CHECKING:
    import torch

DEFAULT_OP = "fp8_mqa_logits"


def _normalize(arch: str | None, op: str, dtype: Any) -> tuple[str, str | None]:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}")
    arch = detect_arch() if arch is None else normalize_arch(arch)
    return arch, None if dtype is None else validate.dtype_name(dtype)


def get_provider(arch: str | None = None, *, op: str = DEFAULT_OP, dtype: Any = None,
                 problem: Problem | None = None) -> Provider:
    """The provider that serves ``op`` on ``arch`` (None: this process's current device).

    For an explicit arch the answer is what would serve that arch with what is installed here.
    Raises :class:`ProviderUnavailableError` (a LookupError) with every provider's reason when none
    can, or when ``MQA_PROVIDER`` names providers none of which can.
    """
    key = (arch, op, dtype)
    if problem is None and arch is not None:
        provider = registry.state().fast.get(key)
        if provider is not None:
            return provider
    a, d = _normalize(arch, op, dtype)
    return registry.provider_for(a, op, d, problem, fast_key=key if arch is not None else None)


def explain(arch: str | None = None, *, op: str = DEFAULT_OP, dtype: Any = None,
            problem: Problem | None = None) -> Decision:
    """Every discovered provider (and broken plugin), accepted or rejected with reasons, and the choice.

    The chosen provider's kernel object is loaded, so a provider that fails to import shows as
    rejected ("import") and the next one is chosen, exactly as :func:`get_provider` would.
    """
    a, d = _normalize(arch, op, dtype)
    try:
        registry.provider_for(a, op, d, problem)
    except LookupError:
        pass
    return registry.decision(a, op, d, problem)


def fp8_mqa_logits(q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]", weights: "torch.Tensor",
                   cu_seqlen_ks: "torch.Tensor", cu_seqlen_ke: "torch.Tensor", *,
                   clean_logits: bool = True) -> "torch.Tensor":
    """fp8 MQA logits, served by the provider chosen for ``q``'s device, dtype and shape.

    ``logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n])`` for
    ``max(ks[m], 0) <= n < min(ke[m], N)``, ``-inf`` elsewhere when ``clean_logits``.
    """
    full = registry.state().settings.validate_full
    problem = validate.mqa_logits_args(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits, full=full)
    provider = registry.provider_for(arch_of_device(q.device), "fp8_mqa_logits",
                                     validate.dtype_name(q.dtype), problem)
    # Selection matched the provider to q's arch, dtype and shape: validating again would only cost.
    return provider.impl.fp8_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=clean_logits)


def fp8_paged_mqa_logits(q: "torch.Tensor", kv_cache: "torch.Tensor", weights: "torch.Tensor",
                         context_lens: "torch.Tensor", block_tables: "torch.Tensor",
                         max_context_len: int, *, clean_logits: bool = True) -> "torch.Tensor":
    """The decode variant over a paged fp8 cache; see the docs for the block layout."""
    full = registry.state().settings.validate_full
    problem = validate.paged_mqa_logits_args(q, kv_cache, weights, context_lens, block_tables,
                                             max_context_len, clean_logits, full=full)
    provider = registry.provider_for(arch_of_device(q.device), "fp8_paged_mqa_logits",
                                     validate.dtype_name(q.dtype), problem)
    return provider.impl.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                              max_context_len, clean_logits=clean_logits)


def reload() -> None:
    """Re-read the ``MQA_*`` environment variables and rediscover plugins on next use."""
    registry.reload()
