"""The one piece of process state: discovered specs, runtime-check results, plans, loaded providers.

Everything here is filled lazily and guarded by a single lock; reads on the per-call path are one
dictionary lookup without the lock (a dict read is atomic in CPython and entries are never changed
once written, only the whole state is replaced by :func:`reload`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from .decision import Decision
from .discovery import Discovery, discover
from .errors import ProviderUnavailableError
from .provider import Provider, load_object
from .select import decide, run_check, shape_reason
from .settings import Settings
from .spec import Problem, ProviderSpec
from .tuning import Tuning, from_setting

log = logging.getLogger("mqa_core")

PlanKey = tuple[str, str, str | None]  # (arch, op, dtype)


@dataclass
class _State:
    settings: Settings
    discovery: Discovery
    checks: dict[tuple[str, str], str | None] = field(default_factory=dict)
    load_errors: dict[str, str] = field(default_factory=dict)
    providers: dict[str, Provider] = field(default_factory=dict)
    #: (arch, op, dtype) -> specs that may serve it, in the order they are tried.
    plans: dict[PlanKey, tuple[ProviderSpec, ...]] = field(default_factory=dict)
    #: (raw arch, op, raw dtype) -> provider, for requests without a problem: the hot path.
    fast: dict[tuple[object, str, object], Provider] = field(default_factory=dict)
    #: MQA_TUNING's table: orders the plan per shape bucket.
    tuning: Tuning | None = None


_lock = threading.RLock()
_state: _State | None = None


def state() -> _State:
    """The current state, discovering plugins on first use (once, whatever the number of threads)."""
    s = _state
    if s is not None:
        return s
    return _build()


def _build() -> _State:
    global _state
    with _lock:
        if _state is None:
            settings = Settings.from_env()
            _state = _State(settings, discover(settings), tuning=from_setting(settings.tuning))
        return _state


def reload() -> None:
    """Forget everything: the environment is read and entry points are discovered again on next use."""
    global _state
    with _lock:
        _state = None


def _check(s: _State, spec: ProviderSpec, arch: str) -> str | None:
    key = (spec.name, arch)
    if key not in s.checks:
        s.checks[key] = run_check(spec, arch)
    return s.checks[key]


def decision(arch: str, op: str, dtype: str | None, problem: Problem | None) -> Decision:
    """The full trace for a request, as of what has been checked and loaded so far."""
    s = state()
    with _lock:
        return decide(s.discovery.specs, s.discovery.broken, s.settings, arch=arch, op=op,
                      dtype=dtype, problem=problem, check=lambda sp, a: _check(s, sp, a),
                      load_errors=s.load_errors, tuning=s.tuning.choose if s.tuning else None)


def _plan(s: _State, key: PlanKey) -> tuple[ProviderSpec, ...]:
    plan = s.plans.get(key)
    if plan is None:
        d = decision(*key, None)
        by_name = {sp.name: sp for sp in s.discovery.specs}
        names = [c.name for c in d.accepted]
        if s.settings.preference:
            names = [n for n in s.settings.preference if n in names]
        plan = s.plans[key] = tuple(by_name[n] for n in names)
        log.info("mqa_core: arch=%s op=%s dtype=%s -> %s (%s)", *key, d.chosen or "none", d.why)
    return plan


def _load(s: _State, spec: ProviderSpec) -> Provider | None:
    provider = s.providers.get(spec.name)
    if provider is None and spec.name not in s.load_errors:
        try:
            provider = Provider(spec, load_object(spec.load), s.settings.validate_full)
        except Exception as exc:
            s.load_errors[spec.name] = f"{type(exc).__name__}: {exc}"
            s.plans.clear()  # later plans must see the failure
            log.warning("mqa_core: provider %s failed to load (%s); it is skipped",
                        spec.name, s.load_errors[spec.name])
            return None
        s.providers[spec.name] = provider
    return provider


def provider_for(arch: str, op: str, dtype: str | None, problem: Problem | None,
                 fast_key: tuple[object, str, object] | None = None) -> Provider:
    """Choose and load the provider for a request, or raise with the whole trace."""
    s = state()
    with _lock:
        while True:
            plan = _plan(s, (arch, op, dtype))
            if s.tuning is not None and problem is not None and not s.settings.preference:
                plan = s.tuning.order(arch, op, problem, plan)
            for spec in plan:
                if problem is not None and shape_reason(spec, problem):
                    continue
                provider = _load(s, spec)
                if provider is None:
                    break  # the plan was invalidated by the load failure: plan again
                if problem is None and fast_key is not None:
                    s.fast[fast_key] = provider
                return provider
            else:
                d = decision(arch, op, dtype, problem)
                raise ProviderUnavailableError(str(d), d)
