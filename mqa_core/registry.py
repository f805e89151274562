"""The one piece of process state: discovered specs, runtime-check results, plans, loaded providers.

A :class:`_State` is built once (settings parsed, plugins discovered) and replaced whole by
:func:`reload`; it is never re-read midway: each request takes one snapshot (:func:`state`) and
passes it down, so a concurrent ``reload()`` cannot mix two states in one answer. Its caches only
grow (an entry, once written, never changes) and are written under one lock; reads on the per-call
path are one dictionary lookup without the lock (a dict read is atomic in CPython). The exception is
the per-signature memory of the ops' calls (:mod:`mqa_core.memo`): bounded, emptied when full, each
write one atomic dict operation, so the per-call path never takes the lock.

Fork: a child forked while another thread held the lock (discovering, or importing a kernel module)
gets a fresh lock. A module that thread was importing is never imported again in the child: its
import lock belongs to a thread the child does not have, so importing it would hang; it is recorded
as that plugin's failure instead.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field

from .decision import Decision
from .discovery import Discovery, cut_by_fork, describe_error, discover, unknown_names
from .errors import ProviderUnavailableError
from .memo import CallTable, Signature
from .provider import Entry, Provider, load_object
from .select import decide, preference_for, preferred_order, run_check, shape_reason
from .settings import Settings, unknown_variables
from .spec import SCORING_OP, Pair, Problem, ProviderSpec
from .tuning import Tuning, from_setting

log = logging.getLogger("mqa_core")

PlanKey = tuple[str, str, Pair | None]  # (arch, op, (q dtype, k dtype))


@dataclass(frozen=True)
class _Plan:
    """The specs that may serve (arch, op, pair), in the order they are tried."""

    specs: tuple[ProviderSpec, ...]
    chosen: str
    why: str


@dataclass
class _State:
    settings: Settings
    discovery: Discovery
    #: (spec id, arch) -> the runtime check's answer.
    checks: dict[tuple[str, str], str | None] = field(default_factory=dict)
    #: spec id -> why its kernel object failed to load.
    load_errors: dict[str, str] = field(default_factory=dict)
    #: spec id -> the loaded provider.
    providers: dict[str, Provider] = field(default_factory=dict)
    plans: dict[PlanKey, _Plan] = field(default_factory=dict)
    #: (raw arch, op, raw dtype) -> provider, for requests without a problem: the hot path.
    fast: dict[tuple[object, str, object], Provider] = field(default_factory=dict)
    #: MQA_TUNING's table: orders the plan per shape bucket.
    tuning: Tuning | None = None
    #: Call signature -> (problem, provider, its prepared call or None) for the public ops, bounded
    #: (see mqa_core.memo); None under MQA_VALIDATE=full, where every call is checked.
    mqa_calls: dict[Signature, Entry] | None = None
    paged_calls: dict[Signature, Entry] | None = None
    #: The same for calls asking for bfloat16 logits (``mqa_core.memo.MQA_BF16``, ``PAGED_BF16``).
    mqa_bf16_calls: dict[Signature, Entry] | None = None
    paged_bf16_calls: dict[Signature, Entry] | None = None
    #: The core's composed provider's spec, built on first use (it reads the installed version).
    composed: ProviderSpec | None = None

    def __post_init__(self) -> None:
        if not self.settings.validate_full:
            self.mqa_calls, self.paged_calls = CallTable(), CallTable()
            self.mqa_bf16_calls, self.paged_bf16_calls = CallTable(), CallTable()


_lock = threading.RLock()
_state: _State | None = None
#: Modules plugin code is importing right now, under _lock (what a fork would cut off).
_inflight: set[str] = set()
#: Modules whose import a fork cut off in this process: never imported here (it would hang).
_cut_by_fork: frozenset[str] = frozenset()


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
            found = discover(settings, forbidden=_cut_by_fork, inflight=_inflight)
            for message in [*unknown_variables(), *unknown_names(settings, found)]:
                log.warning("mqa_core: %s", message)
                warnings.warn(f"mqa_core: {message}", RuntimeWarning, stacklevel=4)
            _state = _State(settings, found, tuning=from_setting(settings.tuning))
        return _state


def reload() -> None:
    """Forget everything: the environment is read and entry points are discovered again on next use."""
    global _state
    with _lock:
        _state = None


def _after_fork_in_child() -> None:
    global _lock, _inflight, _cut_by_fork
    if _lock.acquire(blocking=False):  # free, or held by the thread that forked: all is consistent
        _lock.release()
        return
    # Held by a thread this child does not have. The state's caches are consistent (each write is
    # one dict assignment), but the lock will never be released and that thread's import never ends.
    _lock = threading.RLock()
    _cut_by_fork = _cut_by_fork | frozenset(_inflight)
    _inflight = set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check(s: _State, spec: ProviderSpec, arch: str) -> str | None:
    key = (spec.id, arch)
    if key not in s.checks:
        s.checks[key] = run_check(spec, arch)
    return s.checks[key]


def _skipped(s: _State) -> list[str]:
    return [f"{p.entry_point} ({p.distribution or '?'})" for p in s.discovery.plugins if p.status == "skipped"]


def _specs(s: _State, op: str) -> tuple[ProviderSpec, ...]:
    """The specs judged for ``op``: the discovered ones, and for the fused top-k ops the core's
    composed provider (:mod:`mqa_core.composed`), which is no plugin: always there, never blocked by
    ``MQA_PLUGINS``, and shown only where it can serve."""
    if op not in SCORING_OP:
        return s.discovery.specs
    if s.composed is None:
        from .composed import composed_spec

        s.composed = composed_spec()
    return (*s.discovery.specs, s.composed)


def all_specs(s: _State | None = None) -> tuple[ProviderSpec, ...]:
    """Every provider a name may resolve to: the discovered ones and the core's composed provider."""
    return _specs(state() if s is None else s, "fp8_mqa_topk")


def _decide(s: _State, arch: str, op: str, dtype: object, problem: Problem | None) -> Decision:
    with _lock:
        return decide(_specs(s, op), s.discovery.broken, s.settings, arch=arch, op=op,
                      dtype=dtype, problem=problem, check=lambda sp, a: _check(s, sp, a),
                      load_errors=dict(s.load_errors), import_seconds=s.discovery.import_seconds(),
                      skipped=_skipped(s), tuning=s.tuning.choose if s.tuning else None)


def decision(arch: str, op: str, dtype: object, problem: Problem | None, *, s: _State | None = None) -> Decision:
    """The full trace for a request, as of what has been checked and loaded so far in state ``s``
    (the current state when None)."""
    return _decide(state() if s is None else s, arch, op, dtype, problem)


def _plan(s: _State, key: PlanKey) -> _Plan:
    plan = s.plans.get(key)
    if plan is None:
        d = _decide(s, *key, None)
        by_id = {sp.id: sp for sp in _specs(s, key[1])}
        order = preferred_order(d.accepted, preference_for(list(by_id.values()), s.settings, key[1]))
        plan = s.plans[key] = _Plan(tuple(by_id[c.id] for c in order), d.chosen or "none", d.why)
        log.info("mqa_core: arch=%s op=%s dtype=%s -> %s (%s)", *key, plan.chosen, plan.why)
    return plan


def _load(s: _State, spec: ProviderSpec) -> Provider | None:
    """The spec's provider, loading its kernel object once; None (and the error recorded) when it fails."""
    provider = s.providers.get(spec.id)
    if provider is not None or spec.id in s.load_errors:
        return provider
    module = spec.load.partition(":")[0]
    cut = cut_by_fork(module, _cut_by_fork)
    if cut:
        error = cut
    else:
        _inflight.add(module)
        try:
            s.providers[spec.id] = provider = Provider(spec, load_object(spec.load), s.settings.validate_full)
            return provider
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a kernel module may raise anything on import, SystemExit included
            error = describe_error(exc)
        finally:
            _inflight.discard(module)
    s.load_errors[spec.id] = error
    log.warning("mqa_core: provider %s failed to load (%s); it is skipped", spec.id, error)
    return None


def provider_for(arch: str, op: str, dtype: Pair | None, problem: Problem | None,
                 fast_key: tuple[object, str, object] | None = None, *, s: _State | None = None) -> Provider:
    """Choose and load the provider for a request in state ``s``, or raise with the whole trace."""
    s = state() if s is None else s
    with _lock:
        specs = _plan(s, (arch, op, dtype)).specs
        if s.tuning is not None and problem is not None \
                and not preference_for(_specs(s, op), s.settings, op).preference:
            specs = s.tuning.order(arch, op, problem, specs)  # the measured winner of the bucket first
        for spec in specs:
            if problem is not None and shape_reason(spec, problem):
                continue
            provider = _load(s, spec)
            if provider is None:
                continue  # recorded; the decision now rejects it with code "import"
            if problem is None and fast_key is not None:
                s.fast[fast_key] = provider
            return provider
        d = _decide(s, arch, op, dtype, problem)
        raise ProviderUnavailableError(str(d), d)
