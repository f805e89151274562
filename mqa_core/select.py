"""Selection as a pure function: (specs, broken plugins, settings, facts, request) -> Decision.

No device, environment or import is touched here; the registry feeds in what it found, so tests
can pass a fake system. The precedence lives in :func:`sort_key`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .decision import Candidate, Decision
from .discovery import BrokenPlugin
from .settings import Settings
from .spec import Problem, ProviderSpec

#: (spec, arch) -> None or the reason the runtime check rejects it. The registry caches it.
CheckFn = Callable[[ProviderSpec, str], str | None]
#: (arch, op, problem, usable names in priority order) -> (chosen, why), (None, note for the priority
#: rule's why) or None: a measured table's say (mqa_core.tuning.Tuning.choose).
TuningFn = Callable[[str, str, "Problem | None", Sequence[str]], "tuple[str | None, str] | None"]


def sort_key(spec: ProviderSpec) -> tuple[int, str]:
    """Highest priority first, then name: the same order in every process and on every rank."""
    return (-spec.priority, spec.name)


def run_check(spec: ProviderSpec, arch: str) -> str | None:
    """Call a spec's runtime check; one that raises is a rejection, never a crash."""
    if spec.check is None:
        return None
    try:
        reason = spec.check(arch)
    except Exception as exc:
        return f"runtime check raised {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason)


def shape_reason(spec: ProviderSpec, problem: Problem) -> str | None:
    if spec.shape_limits is None:
        return None
    try:
        reason = spec.shape_limits(problem)
    except Exception as exc:
        return f"shape limits raised {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason)


def _judge(spec: ProviderSpec, arch: str, op: str, dtype: str | None,
           problem: Problem | None, settings: Settings, check: CheckFn,
           load_errors: Mapping[str, str]) -> Candidate:
    def reject(code: str, reason: str) -> Candidate:
        return Candidate(spec.name, False, code, reason, spec.priority, spec.distribution, spec.version)

    if spec.name in settings.disabled:
        return reject("blocked", "named in MQA_DISABLE_PROVIDERS")
    if op not in spec.ops:
        return reject("op", f"declares ops {', '.join(sorted(spec.ops))}; asked for {op}")
    if not spec.serves_arch(arch):
        return reject("arch", f"declares archs {', '.join(sorted(spec.archs))}; this system has {arch}")
    if dtype is not None and dtype not in spec.dtypes:
        return reject("dtype", f"declares dtypes {', '.join(sorted(spec.dtypes))}; asked for {dtype}")
    if problem is not None:
        reason = shape_reason(spec, problem)
        if reason:
            return reject("shape", reason)
    reason = check(spec, arch)
    if reason:
        return reject("check", reason)
    if spec.name in load_errors:
        return reject("import", f"cannot load {spec.load}: {load_errors[spec.name]}")
    return Candidate(spec.name, True, "", "", spec.priority, spec.distribution, spec.version)


def decide(specs: Sequence[ProviderSpec], broken: Sequence[BrokenPlugin], settings: Settings, *,
           arch: str, op: str, dtype: str | None = None, problem: Problem | None = None,
           check: CheckFn = run_check, load_errors: Mapping[str, str] = {},
           tuning: TuningFn | None = None) -> Decision:
    """Judge every spec for the request and choose; never substitutes for an explicit preference."""
    ordered = sorted(specs, key=sort_key)
    judged = [_judge(s, arch, op, dtype, problem, settings, check, load_errors) for s in ordered]
    chosen: str | None = None
    if settings.preference:
        by_name = {c.name: c for c in judged}
        for name in settings.preference:
            c = by_name.get(name)
            if c is not None and c.accepted:
                chosen = name
                break
        pref = ",".join(settings.preference)
        judged = [c if c.name in settings.preference or not c.accepted else
                  Candidate(c.name, False, "preference", f"usable, but MQA_PROVIDER={pref} names others",
                            c.priority, c.distribution, c.version) for c in judged]
        missing = [n for n in settings.preference if n not in by_name]
        if chosen:
            why = f"named in MQA_PROVIDER={pref}"
        else:
            why = f"MQA_PROVIDER={pref} is honoured or fails: no provider it names can serve"
            if missing:
                why += f" ({', '.join(missing)} not installed)"
    else:
        accepted = [c for c in judged if c.accepted]
        tuned = tuning(arch, op, problem, [c.name for c in accepted]) if tuning and accepted else None
        if tuned is not None and tuned[0] is not None:
            chosen, why = tuned[0], tuned[1]
        elif accepted:
            chosen = accepted[0].name
            why = (f"highest priority ({accepted[0].priority}) of {len(accepted)} usable provider"
                   f"{'s' if len(accepted) > 1 else ''}; ties break by name"
                   + (f"; {tuned[1]}" if tuned is not None else ""))
        elif not specs:
            why = ("no provider is installed: pip install mqa-provider-torch-ref (any arch), "
                   "mqa-provider-gluon (NVIDIA/AMD GPUs) or mqa-provider-flydsl (AMD gfx942/gfx950)")
        else:
            why = "no installed provider can serve this request (reasons above)"
    candidates = tuple(judged) + tuple(
        Candidate(b.entry_point, False, "broken", f"{b.stage}: {b.error}", None, b.distribution, b.version)
        for b in broken)
    return Decision(arch, op, dtype, problem, candidates, chosen, why)
