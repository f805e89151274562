"""A chosen provider: its spec, its loaded kernel object, and the ops with checks on both sides.

Arguments are validated before the kernel runs (once per call signature: :mod:`mqa_core.memo`); what
the kernel returns is checked against the op's contract on every call before the caller sees it
(:mod:`mqa_core.result`), so a provider that returns a wrong shape, dtype or device, or a list, is
named instead of passed on.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import validate
from .errors import ProviderResultError
from .memo import Signature, mqa_recall, paged_problem, paged_recall, remember
from .spec import Problem, ProviderSpec

if TYPE_CHECKING:
    import torch

#: A kernel object's paged call prepared for one call signature: (q, kv_cache, weights, context_lens,
#: block_tables) -> logits.
PagedCall = Callable[..., Any]


def load_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Provider:
    """What :func:`mqa_core.get_provider` returns. Calls are validated, passed to the kernel, and its
    result is checked."""

    __slots__ = ("spec", "impl", "_validate_full", "_result", "_passed_mqa", "_passed_paged")

    def __init__(self, spec: ProviderSpec, impl: Any, validate_full: bool = False) -> None:
        for op in spec.ops:
            if not callable(getattr(impl, op, None)):
                raise TypeError(f"{spec.load} has no method {op}() although the spec declares it")
        from . import result  # imports torch: only once a kernel is loaded

        self.spec = spec
        self.impl = impl
        self._validate_full = validate_full
        self._result = result
        # Signature -> problem, for the signatures this provider's checks have passed (mqa_core.memo),
        # and for the paged op the kernel's prepared call too; None under MQA_VALIDATE=full. The
        # registry makes a new provider for each state.
        self._passed_mqa: dict[Signature, Problem] | None = None if validate_full else {}
        self._passed_paged: dict[Signature, tuple[Problem, PagedCall | None]] | None = (
            None if validate_full else {})

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def distribution(self) -> str:
        return self.spec.distribution

    @property
    def id(self) -> str:
        """``distribution:name``."""
        return self.spec.id

    def __repr__(self) -> str:
        return f"<mqa_core.Provider {self.name} from {self.spec.distribution}=={self.spec.version}>"

    def _require(self, op: str) -> None:
        if op not in self.spec.ops:
            raise NotImplementedError(f"provider {self.name} does not serve {op} "
                                      f"(declares {', '.join(sorted(self.spec.ops))})")

    def _exited(self, op: str, exc: SystemExit) -> ProviderResultError:
        return ProviderResultError(f"provider {self.name} ({self.spec.distribution}=={self.spec.version}) "
                                   f"raised SystemExit({exc.code!r}) from {op} instead of returning logits",
                                   self.name, self.spec.distribution)

    def fp8_mqa_logits(self, q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]",
                       weights: "torch.Tensor", cu_seqlen_ks: "torch.Tensor",
                       cu_seqlen_ke: "torch.Tensor", *, clean_logits: bool = True) -> "torch.Tensor":
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in [ks[m], ke[m])."""
        table = self._passed_mqa
        key, problem = mqa_recall(table, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
        if problem is None:
            self._require("fp8_mqa_logits")
            problem = validate.mqa_logits_args(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits,
                                               spec=self.spec, full=self._validate_full)
            remember(table, key, problem)
        return self.run_mqa_logits(problem, q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)

    def run_mqa_logits(self, problem: Problem, q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]",
                       weights: "torch.Tensor", ks: "torch.Tensor", ke: "torch.Tensor",
                       clean_logits: bool) -> "torch.Tensor":
        """The kernel on arguments already validated (``problem`` is what validation returned), and
        the check of its result."""
        try:
            out = self.impl.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean_logits)
        except SystemExit as exc:  # a kernel must not end the caller's process
            raise self._exited("fp8_mqa_logits", exc) from exc
        self._result.check_logits(out, self.spec, "fp8_mqa_logits", problem.m, problem.n, q.device)
        if self._validate_full:
            self._result.check_mqa_values(out, ks, ke, clean_logits, self.spec)
        return out

    def fp8_paged_mqa_logits(self, q: "torch.Tensor", kv_cache: "torch.Tensor",
                             weights: "torch.Tensor", context_lens: "torch.Tensor",
                             block_tables: "torch.Tensor", max_context_len: int, *,
                             clean_logits: bool = True) -> "torch.Tensor":
        """The decode variant over a paged fp8 cache (DeepGEMM's block layout)."""
        table = self._passed_paged
        key, hit = paged_recall(table, q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                clean_logits)
        if hit is not None:
            return self.run_paged_mqa_logits(hit[0], q, kv_cache, weights, context_lens, block_tables,
                                             max_context_len, clean_logits, hit[1])
        self._require("fp8_paged_mqa_logits")
        problem = paged_problem(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                clean_logits, spec=self.spec, full=self._validate_full)
        out = self.run_paged_mqa_logits(problem, q, kv_cache, weights, context_lens, block_tables,
                                        max_context_len, clean_logits)
        if key is not None:
            remember(table, key, (problem, self.prepare_paged(q, kv_cache, weights, context_lens,
                                                              block_tables, max_context_len, clean_logits)))
        return out

    def prepare_paged(self, q: "torch.Tensor", kv_cache: "torch.Tensor", weights: "torch.Tensor",
                      context_lens: "torch.Tensor", block_tables: "torch.Tensor", max_context_len: int,
                      clean_logits: bool) -> PagedCall | None:
        """The kernel object's call prepared for this call's signature (``mqa_core.memo``), asked once
        the signature has passed the checks and run: ``impl.prepare_fp8_paged_mqa_logits(...)`` where
        the kernel object has one, else None. Later calls with the same signature hand it the five
        tensors instead of calling ``impl.fp8_paged_mqa_logits`` (its result checked all the same)."""
        prepare = getattr(self.impl, "prepare_fp8_paged_mqa_logits", None)
        if prepare is None:
            return None
        try:
            prepared = prepare(q, kv_cache, weights, context_lens, block_tables, max_context_len,
                               clean_logits=clean_logits)
        except (Exception, SystemExit) as exc:  # optional: a failure costs the shortcut, not the call
            warnings.warn(f"provider {self.name} ({self.spec.distribution}=={self.spec.version}): "
                          f"prepare_fp8_paged_mqa_logits raised {type(exc).__name__}: {exc}; its calls "
                          "take fp8_paged_mqa_logits", RuntimeWarning, stacklevel=2)
            return None
        if prepared is not None and not callable(prepared):
            warnings.warn(f"provider {self.name} ({self.spec.distribution}=={self.spec.version}): "
                          f"prepare_fp8_paged_mqa_logits returned {type(prepared).__name__}, not a callable "
                          "or None; its calls take fp8_paged_mqa_logits", RuntimeWarning, stacklevel=2)
            return None
        return prepared

    def run_paged_mqa_logits(self, problem: Problem, q: "torch.Tensor", kv_cache: "torch.Tensor",
                             weights: "torch.Tensor", context_lens: "torch.Tensor",
                             block_tables: "torch.Tensor", max_context_len: int,
                             clean_logits: bool, prepared: PagedCall | None = None) -> "torch.Tensor":
        """As :meth:`run_mqa_logits`, for the paged op; through ``prepared`` (what
        :meth:`prepare_paged` returned for this call's signature) when there is one."""
        try:
            if prepared is None:
                out = self.impl.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                                     max_context_len, clean_logits=clean_logits)
            else:
                out = prepared(q, kv_cache, weights, context_lens, block_tables)
        except SystemExit as exc:
            raise self._exited("fp8_paged_mqa_logits", exc) from exc
        self._result.check_logits(out, self.spec, "fp8_paged_mqa_logits", problem.m, problem.n, q.device)
        if self._validate_full:
            self._result.check_paged_values(out, context_lens, q.shape[1], clean_logits, self.spec)
        return out
