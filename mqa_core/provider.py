"""A chosen provider: its spec, its loaded kernel object, and the ops with validation in front."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import validate
from .spec import ProviderSpec

if TYPE_CHECKING:
    import torch


def load_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Provider:
    """What :func:`mqa_core.get_provider` returns. Calls are validated, then passed to the kernel."""

    __slots__ = ("spec", "impl", "_validate_full")

    def __init__(self, spec: ProviderSpec, impl: Any, validate_full: bool = False) -> None:
        for op in spec.ops:
            if not callable(getattr(impl, op, None)):
                raise TypeError(f"{spec.load} has no method {op}() although the spec declares it")
        self.spec = spec
        self.impl = impl
        self._validate_full = validate_full

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<mqa_core.Provider {self.name} from {self.spec.distribution}=={self.spec.version}>"

    def _require(self, op: str) -> None:
        if op not in self.spec.ops:
            raise NotImplementedError(f"provider {self.name} does not serve {op} "
                                      f"(declares {', '.join(sorted(self.spec.ops))})")

    def fp8_mqa_logits(self, q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]",
                       weights: "torch.Tensor", cu_seqlen_ks: "torch.Tensor",
                       cu_seqlen_ke: "torch.Tensor", *, clean_logits: bool = True) -> "torch.Tensor":
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in [ks[m], ke[m])."""
        self._require("fp8_mqa_logits")
        validate.mqa_logits_args(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits,
                                 spec=self.spec, full=self._validate_full)
        return self.impl.fp8_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke,
                                        clean_logits=clean_logits)

    def fp8_paged_mqa_logits(self, q: "torch.Tensor", kv_cache: "torch.Tensor",
                             weights: "torch.Tensor", context_lens: "torch.Tensor",
                             block_tables: "torch.Tensor", max_context_len: int, *,
                             clean_logits: bool = True) -> "torch.Tensor":
        """The decode variant over a paged fp8 cache (DeepGEMM's block layout)."""
        self._require("fp8_paged_mqa_logits")
        validate.paged_mqa_logits_args(q, kv_cache, weights, context_lens, block_tables,
                                       max_context_len, clean_logits, spec=self.spec,
                                       full=self._validate_full)
        return self.impl.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                              max_context_len, clean_logits=clean_logits)
