"""A chosen provider: its spec, its loaded kernel object, and the ops with checks on both sides.

Arguments are validated before the kernel runs (once per call signature: :mod:`mqa_core.memo`); what
the kernel returns is checked against the op's contract on every call before the caller sees it
(:mod:`mqa_core.result`), so a provider that returns a wrong shape, dtype or device, or a list, is
named instead of passed on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .discovery import describe_error
from .errors import ProviderResultError
from .memo import (
    MQA,
    MQA_BF16,
    PAGED,
    PAGED_BF16,
    VARIANTS,
    CallTable,
    Op,
    Signature,
    device_of,
    logits_dtype_name,
    output_check,
    remember,
)
from .spec import Problem, ProviderSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger("mqa_core")

#: A kernel object's call prepared for one call signature: the op's five tensor arguments -> logits
#: ((q, kv, weights, ks, ke) for prefill, (q, kv_cache, weights, context_lens, block_tables) for paged).
PreparedCall = Callable[..., Any]
#: What a memo table holds per signature, for both ops and in every table (the public ops' and a
#: provider's own): the checks' problem, the provider serving it, its prepared call or None, and the
#: check of its first output (``mqa_core.memo.output_check``).
Entry = tuple[Problem, "Provider", PreparedCall | None, Callable[[Any, tuple[Any, ...]], bool] | None]
#: The hints a kernel function takes: (name, index in the op's ``args``) for each it names.
Takes = tuple[tuple[str, int], ...]
#: The keyword arguments of a call that hands a kernel function no hint (shared: never written).
NO_HINTS: dict[str, Any] = {}


def load_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _named_parameters(impl: Any, name: str) -> frozenset[str]:
    """The parameter names ``impl.<name>`` declares by name (not ``*args`` / ``**kwargs``); none for a
    missing function or one whose signature cannot be read (whatever a third party's object raises)."""
    try:
        params = inspect.signature(getattr(impl, name)).parameters.values()
        return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    except Exception:
        return frozenset()


def _takes(impl: Any, name: str, op: Op) -> Takes:
    """The hints of ``op`` that ``impl.<name>`` names, with where each is in the op's ``args``."""
    named = _named_parameters(impl, name)
    return tuple((h, op.positional + i) for i, h in enumerate(op.hint_names) if h in named)


def _hints(takes: Takes, args: tuple[Any, ...]) -> dict[str, Any]:
    """The keyword arguments a kernel function that takes ``takes`` gets: the hints the call gives."""
    return {h: args[i] for h, i in takes if args[i] is not None} if takes else NO_HINTS


class Provider:
    """What :func:`mqa_core.get_provider` returns. Calls are validated, passed to the kernel, and its
    result is checked."""

    __slots__ = ("spec", "impl", "_validate_full", "_result", "_passed_mqa", "_passed_paged", "_passed_mqa_bf16",
                 "_passed_paged_bf16", "_takes", "_native")

    def __init__(self, spec: ProviderSpec, impl: Any, validate_full: bool = False) -> None:
        for op in spec.ops:
            if not callable(getattr(impl, op, None)):
                raise TypeError(f"{spec.load} has no method {op}() although the spec declares it")
        from . import result  # imports torch: only once a kernel is loaded

        self.spec = spec
        self.impl = impl
        self._validate_full = validate_full
        self._result = result
        # Signature -> entry, for the signatures this provider's checks have passed, per op
        # (mqa_core.memo); None under MQA_VALIDATE=full. The registry makes a new provider per state.
        self._passed_mqa: dict[Signature, Entry] | None = None if validate_full else CallTable()
        self._passed_paged: dict[Signature, Entry] | None = None if validate_full else CallTable()
        self._passed_mqa_bf16: dict[Signature, Entry] | None = None if validate_full else CallTable()
        self._passed_paged_bf16: dict[Signature, Entry] | None = None if validate_full else CallTable()
        # The call hints (a paged call's ``schedule``, a bf16 call's ``logits_dtype``) each of the kernel
        # object's op and prepare_<op> functions receives: those it names, per variant of the op. Read
        # once; a function whose signature cannot be read receives none.
        self._takes: dict[str, Takes] = {key: _takes(impl, name, variant) for op in spec.ops
                                         for variant in VARIANTS.get(op, ())
                                         for key, name in ((variant.key, variant.name),
                                                           (variant.prepare_key, variant.prepare))}
        # Per variant: whether the kernel writes that logits dtype itself (its op function names
        # ``logits_dtype``); where it does not, its float32 result is rounded to the dtype here.
        self._native: dict[str, bool] = {v.key: v.logits_dtype is None or "logits_dtype" in dict(self._takes[v.key])
                                         for op in spec.ops for v in VARIANTS.get(op, ())}

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
                       cu_seqlen_ke: "torch.Tensor", *, clean_logits: bool = True,
                       logits_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in [ks[m], ke[m]);
        ``logits_dtype`` as in :func:`mqa_core.fp8_mqa_logits`."""
        if logits_dtype is None or logits_dtype_name(logits_dtype, MQA.name) == "float32":
            return self.call(MQA, self._passed_mqa, (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke), clean_logits)
        import torch

        return self.call(MQA_BF16, self._passed_mqa_bf16,
                         (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, torch.bfloat16), clean_logits)

    def fp8_paged_mqa_logits(self, q: "torch.Tensor", kv_cache: "torch.Tensor",
                             weights: "torch.Tensor", context_lens: "torch.Tensor",
                             block_tables: "torch.Tensor", max_context_len: int, *,
                             clean_logits: bool = True, schedule: "torch.Tensor | None" = None,
                             logits_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
        """The decode variant over a paged fp8 cache (DeepGEMM's block layout); ``schedule`` as in
        :func:`mqa_core.fp8_paged_mqa_logits`, passed on only if this provider's kernel names it."""
        args = (q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule)
        if logits_dtype is None or logits_dtype_name(logits_dtype, PAGED.name) == "float32":
            return self.call(PAGED, self._passed_paged, args, clean_logits)
        import torch

        return self.call(PAGED_BF16, self._passed_paged_bf16, (*args, torch.bfloat16), clean_logits)

    def fp8_mqa_topk(self, q: "torch.Tensor", kv: "tuple[torch.Tensor, torch.Tensor]", weights: "torch.Tensor",
                     cu_seqlen_ks: "torch.Tensor", cu_seqlen_ke: "torch.Tensor", topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int | None = None) -> Any:
        """The top-k key positions per query (:func:`mqa_core.fp8_mqa_topk`), on this provider.
        ``workspace_bytes``: its bound on extra device memory (None: ``MQA_WORKSPACE_MB``)."""
        from .indexer import provider_call

        return provider_call(self, "fp8_mqa_topk", (q, kv, weights, cu_seqlen_ks, cu_seqlen_ke), topk, positions,
                             return_values, workspace_bytes)

    def fp8_paged_mqa_topk(self, q: "torch.Tensor", kv_cache: "torch.Tensor", weights: "torch.Tensor",
                           context_lens: "torch.Tensor", block_tables: "torch.Tensor", max_context_len: int,
                           topk: int, *, schedule: "torch.Tensor | None" = None, return_values: bool = False,
                           workspace_bytes: int | None = None) -> Any:
        """The decode step's top-k (:func:`mqa_core.fp8_paged_mqa_topk`), on this provider."""
        from .indexer import provider_call

        return provider_call(self, "fp8_paged_mqa_topk",
                             (q, kv_cache, weights, context_lens, block_tables, max_context_len, schedule), topk,
                             "relative", return_values, workspace_bytes)

    def topk_per_row(self, logits: "torch.Tensor", ks: "torch.Tensor", ke: "torch.Tensor", topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int | None = None) -> Any:
        """The selection alone over given logits (:func:`mqa_core.topk_per_row`), on this provider."""
        from .indexer import provider_call

        return provider_call(self, "topk_per_row", (logits, ks, ke), topk, positions, return_values,
                             workspace_bytes)

    def call(self, op: Op, table: "dict[Signature, Entry] | None", args: tuple[Any, ...],
             clean_logits: Any) -> "torch.Tensor":
        """Either op: a signature seen before runs its entry (no checks; its prepared call where it has
        one); a new one is checked, runs, and is remembered with its prepared call."""
        key, hit = op.recall(table, *args, clean_logits)
        if hit is not None:
            return self.run(op, hit[0], args, clean_logits, hit[2], hit[3])
        self._require(op.name)
        problem = op.check(*args, clean_logits, spec=self.spec, full=self._validate_full)
        out = self.run(op, problem, args, clean_logits)
        if key is not None:
            remember(table, key, (problem, self, self.prepare(op, args, clean_logits),
                                  output_check(out, op.tensors(args))))
        return out

    def prepare(self, op: Op, args: tuple[Any, ...], clean_logits: bool) -> PreparedCall | None:
        """The kernel object's call prepared for this call's signature (``mqa_core.memo``), asked once
        the signature has passed the checks and run: ``impl.prepare_<op>(*args, clean_logits=...)``
        where the kernel object has one, else None. Later calls with the same signature hand it the
        op's five tensor arguments instead of calling ``impl.<op>`` (its result checked all the same)."""
        name = op.prepare
        prepare = getattr(self.impl, name, None)
        if prepare is None:
            return None
        takes = self._takes[op.prepare_key]
        if op.logits_dtype is not None and self._native[op.key] and all(h != "logits_dtype" for h, _ in takes):
            return None  # it would prepare float32 logits where the kernel writes the variant's dtype
        try:
            prepared = prepare(*args[:op.positional], clean_logits=clean_logits, **_hints(takes, args))
        except KeyboardInterrupt:  # the user's
            raise
        except BaseException as exc:  # optional: any failure (GeneratorExit, SystemExit...) costs the shortcut
            self._no_shortcut(op, f"{name} raised {describe_error(exc)}")
            return None
        if prepared is not None and not callable(prepared):
            self._no_shortcut(op, f"{name} returned {type(prepared).__name__}, not a callable or None")
            return None
        return prepared

    def _no_shortcut(self, op: Op, what: str) -> None:
        """Warn that the shortcut is off; never raises (with warnings as errors it is logged instead),
        since the call it is about has a result to return."""
        text = (f"provider {self.name} ({self.spec.distribution}=={self.spec.version}): {what}; its calls take "
                f"{op.name}")
        try:
            warnings.warn(text, RuntimeWarning, stacklevel=3)
        except Exception:
            log.warning("mqa_core: %s", text)

    def run(self, op: Op, problem: Problem, args: tuple[Any, ...], clean_logits: bool,
            prepared: PreparedCall | None = None,
            out_check: Callable[[Any, tuple[Any, ...]], bool] | None = None) -> "torch.Tensor":
        """The kernel on arguments already validated (``problem`` is what validation returned),
        through ``prepared`` (what :meth:`prepare` returned for this call's signature) when there is
        one, and the check of its result. The call's hints go to the functions that name them (a
        prepared call gets those its ``prepare_<op>`` names). ``out_check``: the signature's check of
        an output that passed (``mqa_core.memo.output_check``); a result it accepts has that output's
        type, dtype, device, sizes and strides and overlaps no input, so it passes the full checks
        too, which any other result gets."""
        try:
            if prepared is None:
                out = getattr(self.impl, op.name)(*args[:op.positional], clean_logits=clean_logits,
                                                  **_hints(self._takes[op.key], args))
            else:  # the per-call path of a remembered signature
                takes = self._takes[op.prepare_key]
                out = prepared(*args[:5], **_hints(takes, args)) if takes else prepared(*args[:5])
        except SystemExit as exc:  # a kernel must not end the caller's process
            raise self._exited(op.name, exc) from exc
        inputs = op.tensors(args)
        if out_check is None or not out_check(out, inputs):
            if op.logits_dtype is None:
                self._result.check_logits(out, self.spec, op.name, problem.m, problem.n, device_of(args[0]))
            else:
                out = self._result.conform_logits(out, self.spec, op.name, problem.m, problem.n, device_of(args[0]),
                                                  op.logits_dtype, not self._native[op.key])
            self._result.check_disjoint(out, inputs, op.tensor_names, self.spec, op.name)
        if self._validate_full:
            op.values(self._result, out, args, clean_logits, self.spec)
        return out
