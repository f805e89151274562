"""Selection as a pure function: (specs, broken plugins, settings, facts, request) -> Decision.

No device, environment or import is touched here; the registry feeds in what it found, so tests
can pass a fake system. The precedence lives in :func:`sort_key`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .decision import Candidate, Decision
from .discovery import BrokenPlugin, describe_error
from .names import names_provider, names_provider_or_distribution, normalize_distribution, printable
from .settings import Settings
from .spec import (
    COMPOSED_DISTRIBUTION,
    COMPOSED_ID,
    COMPOSED_NAME,
    SCORING_OP,
    TOPK_OPS,
    Problem,
    ProviderSpec,
    dtype_pair,
    format_pairs,
)

#: (spec, arch) -> None or the reason the runtime check rejects it. The registry caches it.
CheckFn = Callable[[ProviderSpec, str], str | None]
#: (arch, op, problem, usable names in priority order) -> (chosen, why), (None, note for the priority
#: rule's why) or None: a measured table's say (mqa_core.tuning.Tuning.choose).
TuningFn = Callable[[str, str, "Problem | None", Sequence[str]], "tuple[str | None, str] | None"]

_INSTALL_HINT = ("from a checkout of mqa-core, pip install ./providers/torch_ref (any arch), ./providers/gluon "
                 "(NVIDIA/AMD GPUs) or ./providers/flydsl (AMD gfx942/gfx950)")


def sort_key(spec: ProviderSpec) -> tuple[int, str, str]:
    """Highest priority first, then name, then distribution: the same order in every process and on
    every rank."""
    return (-spec.priority, spec.name, normalize_distribution(spec.distribution))


def _ask(what: str, fn: Callable[[Any], object], arg: Any) -> str | None:
    """Call a plugin's callable; anything it raises (SystemExit too) is a reason, never a crash. The
    reason is shown by ``mqa explain`` and in errors: one printable line."""
    try:
        reason = fn(arg)
        return None if reason is None else printable(str(reason))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"{what} raised {describe_error(exc)}"


def run_check(spec: ProviderSpec, arch: str) -> str | None:
    """Call a spec's runtime check; one that raises is a rejection, never a crash."""
    return None if spec.check is None else _ask("runtime check", spec.check, arch)


def shape_reason(spec: ProviderSpec, problem: Problem) -> str | None:
    return None if spec.shape_limits is None else _ask("shape limits", spec.shape_limits, problem)


def blocked_by(spec: ProviderSpec, settings: Settings) -> str | None:
    """The ``MQA_DISABLE_PROVIDERS`` entry that blocks ``spec``, if any."""
    for ref in sorted(settings.disabled):
        if names_provider_or_distribution(ref, spec.distribution, spec.name):
            return ref
    return None


def picked(spec: ProviderSpec, settings: Settings) -> bool:
    """Whether ``MQA_PROVIDER`` names ``spec`` by ``distribution:name`` (resolves an ambiguous name)."""
    return any(":" in ref and names_provider(ref, spec.distribution, spec.name) for ref in settings.preference)


def _origin(spec: ProviderSpec) -> str:
    return f"{spec.distribution or '?'}=={spec.version or '?'}"


def _judge(spec: ProviderSpec, arch: str, op: str, pair: tuple[str, str] | None,
           problem: Problem | None, settings: Settings, check: CheckFn,
           load_errors: Mapping[str, str], rivals: Sequence[ProviderSpec],
           import_seconds: float | None) -> Candidate:
    declared = tuple(sorted(spec.pairs_for(arch)))

    claims = tuple(sorted(spec.claims))

    def reject(code: str, reason: str) -> Candidate:
        return Candidate(spec.name, False, code, reason, spec.priority, spec.distribution, spec.version,
                         declared, import_seconds, claims)

    ref = blocked_by(spec, settings)
    if ref is not None:
        return reject("blocked", f"named in MQA_DISABLE_PROVIDERS ({ref})")
    if rivals and not picked(spec, settings):
        others = ", ".join(_origin(r) for r in rivals)
        if any(picked(r, settings) for r in rivals):
            return reject("ambiguous", f"name {spec.name!r} is also claimed by {others}, which MQA_PROVIDER picks")
        return reject("ambiguous", f"name {spec.name!r} is also claimed by {others}: neither is used until "
                                   f"MQA_PROVIDER={spec.distribution}:{spec.name} (or the other's "
                                   f"distribution:name) picks one, or one is uninstalled")
    if op not in spec.ops:
        return reject("op", f"declares ops {', '.join(sorted(spec.ops))}; asked for {op}")
    if not spec.serves_arch(arch):
        return reject("arch", f"declares archs {', '.join(sorted(spec.archs))}; asked for {arch}")
    if pair is not None and pair not in declared:
        return reject("dtype", f"declares {format_pairs(declared) or 'no dtypes'} on {arch}; "
                               f"asked for {format_pairs([pair])}")
    if settings.batch_invariant and "batch_invariant" not in spec.claims:
        return reject("claims", "MQA_BATCH_INVARIANT=1 chooses only providers claiming batch_invariant; claims "
                                f"{', '.join(claims) or 'nothing'}")
    if problem is not None:
        reason = shape_reason(spec, problem)
        if reason:
            return reject("shape", reason)
    reason = check(spec, arch)
    if reason:
        return reject("check", reason)
    if spec.id in load_errors:
        return reject("import", f"cannot load {spec.load}: {load_errors[spec.id]}")
    return Candidate(spec.name, True, "", "", spec.priority, spec.distribution, spec.version, declared,
                     import_seconds, claims)


def _rivals(specs: Sequence[ProviderSpec], settings: Settings) -> dict[str, list[ProviderSpec]]:
    """Provider name -> the unblocked specs that claim it, where more than one does."""
    claims: dict[str, list[ProviderSpec]] = {}
    for s in specs:
        if blocked_by(s, settings) is None:
            claims.setdefault(s.name, []).append(s)
    return {n: c for n, c in claims.items() if len(c) > 1}


def preference_for(specs: Sequence[ProviderSpec], settings: Settings, op: str) -> Settings:
    """``settings`` as they apply to ``op``. ``MQA_PROVIDER`` is honoured or fails for the logits ops
    and for any op one of the providers it names declares. For a top-k op none of them declares:

    - a fused op (``fp8_mqa_topk``, ``fp8_paged_mqa_topk``) goes to the core's composed provider, whose
      logits part then honours the preference (or fails saying so): ``MQA_PROVIDER=deepgemm`` runs
      the indexer step on DeepGEMM's logits instead of failing because DeepGEMM has no top-k kernel;
    - ``topk_per_row`` is chosen by the other rules (the preference names logits kernels).

    ``MQA_PROVIDER=composed`` (the core's own provider, which serves the fused ops only) names no
    provider of the other ops: for those it is dropped from the preference, so the composed path's
    parts (a logits provider, a ``topk_per_row`` provider) are chosen by the other rules.

    A name that matches nothing installed keeps the preference, and the failure that says so.
    """
    if settings.preference and op not in SCORING_OP:
        rest = tuple(r for r in settings.preference if not names_provider(r, COMPOSED_DISTRIBUTION, COMPOSED_NAME))
        if len(rest) < len(settings.preference):
            settings = replace(settings, preference=rest)
    if not settings.preference or op not in TOPK_OPS:
        return settings
    named = [s for s in specs if any(names_provider(r, s.distribution, s.name) for r in settings.preference)]
    if any(op in s.ops for s in named):
        return settings
    if any(not any(names_provider(r, s.distribution, s.name) for s in specs) for r in settings.preference):
        return settings
    return replace(settings, preference=(COMPOSED_ID,) if op in SCORING_OP else ())


def preferred_order(accepted: Sequence[Candidate], settings: Settings) -> list[Candidate]:
    """The accepted candidates ``MQA_PROVIDER`` names, in its order (empty preference: all of them)."""
    if not settings.preference:
        return list(accepted)
    out: list[Candidate] = []
    for ref in settings.preference:
        out += [c for c in accepted if names_provider(ref, c.distribution, c.name) and c not in out]
    return out


def decide(specs: Sequence[ProviderSpec], broken: Sequence[BrokenPlugin], settings: Settings, *,
           arch: str, op: str, dtype: Any = None, problem: Problem | None = None,
           check: CheckFn = run_check, load_errors: Mapping[str, str] = {},
           import_seconds: Mapping[str, float] = {}, skipped: Sequence[str] = (),
           tuning: TuningFn | None = None) -> Decision:
    """Judge every spec for the request and choose; never substitutes for an explicit preference.

    :param dtype: None (any), a q dtype meaning (q, q), or a (q, k) pair.
    :param load_errors: spec id -> why its kernel object failed to load.
    :param import_seconds: spec id -> how long its plugin's import took.
    :param skipped: entry points ``MQA_PLUGINS`` left out, to say so when nothing is left.
    :param tuning: a measured table's choice among the usable providers (``MQA_TUNING``); it orders
        them after the filters and before the priority rule, and never overrides ``MQA_PROVIDER``.
    """
    pair = dtype_pair(dtype)
    settings = preference_for(specs, settings, op)
    ordered = sorted(specs, key=sort_key)
    claims = _rivals(ordered, settings)
    judged = [_judge(s, arch, op, pair, problem, settings, check, load_errors,
                     [r for r in claims.get(s.name, ()) if r is not s], import_seconds.get(s.id))
              for s in ordered]
    accepted = [c for c in judged if c.accepted]
    order = preferred_order(accepted, settings)
    tuned = tuning(arch, op, problem, [c.name for c in order]) if tuning and order and not settings.preference \
        else None
    if tuned is not None and tuned[0] is not None:
        order = sorted(order, key=lambda c: c.name != tuned[0])  # the measured winner, then priority
    first = order[0] if order else None
    if settings.preference:
        pref = ",".join(settings.preference)
        judged = [c if not c.accepted or c in order else
                  Candidate(c.name, False, "preference", f"usable, but MQA_PROVIDER={pref} names others",
                            c.priority, c.distribution, c.version, c.pairs, c.import_seconds, c.claims)
                  for c in judged]
        missing = [r for r in settings.preference
                   if not any(names_provider(r, s.distribution, s.name) for s in specs)]
        if first:
            why = f"named in MQA_PROVIDER={pref}"
        else:
            why = f"MQA_PROVIDER={pref} is honoured or fails: no provider it names can serve"
            if missing:
                why += f" ({', '.join(missing)} not installed)"
    elif tuned is not None and tuned[0] is not None:
        why = tuned[1]
    elif first:
        why = (f"highest priority ({first.priority}) of {len(accepted)} usable provider"
               f"{'s' if len(accepted) > 1 else ''}; ties break by name" + (f"; {tuned[1]}" if tuned else ""))
    elif not specs and settings.plugins is not None:
        asked = ",".join(sorted(settings.plugins)) or "(empty)"
        why = (f"MQA_PLUGINS={asked} loads only the plugins it names, and no provider came of it; "
               f"installed plugins: {', '.join(skipped) or 'none'}")
    elif not specs and not broken:
        why = f"no provider is installed: {_INSTALL_HINT}"
    elif not specs:
        why = f"every installed plugin is broken (above); working providers: {_INSTALL_HINT}"
    else:
        why = "no installed provider can serve this request (reasons above)"
    candidates = tuple(judged) + tuple(
        Candidate(b.entry_point, False, "broken", f"{b.stage}: {b.error}", None, b.distribution, b.version,
                  (), b.import_seconds)
        for b in broken)
    return Decision(arch, op, pair, problem, candidates, first.name if first else None, why,
                    first.distribution if first else "")
