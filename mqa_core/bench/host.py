"""What the host pays per call, at each level an engine might call: the API, the provider, the kernel.

N calls back to back without a synchronisation, divided by N. On a shape small enough that the device
finishes each kernel before the host has issued the next one, that is the host's cost alone: the
device time per call (CUDA-graph replay) is measured too and printed beside it, so the claim can be
checked. On a CPU the kernel itself runs on the host, so the figures include its arithmetic.
Levels are timed in interleaved rounds (median over rounds), so drift of the machine hits all alike.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..provider import Provider
from ..testing.data import Inputs
from ..testing.providers import environment
from .timing import graph_time, interleaved, sync
from .verify import compare
from .workloads import Workload

#: The levels, outermost first, and what each calls.
LEVELS = {"api": "mqa_core.fp8_mqa_logits", "provider": "Provider.fp8_mqa_logits",
          "kernel": "provider.impl.fp8_mqa_logits"}


@dataclass(frozen=True)
class HostCost:
    """Microseconds per call, one value per round: until the last call returned (host) and until the
    device finished them all (wall)."""

    host_us: tuple[float, ...]
    wall_us: tuple[float, ...]
    calls: int

    def __post_init__(self) -> None:
        if not self.host_us or len(self.host_us) != len(self.wall_us) or self.calls < 1:
            raise ValueError(f"HostCost needs as many host as wall samples (>= 1) and calls >= 1; got "
                             f"{len(self.host_us)}, {len(self.wall_us)}, calls={self.calls}")

    @property
    def median(self) -> float:
        return statistics.median(self.host_us)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall_us)


def per_call_us(fn: Callable[[], Any], calls: int, wait: Callable[[], None]) -> tuple[float, float]:
    """(host, wall) microseconds per call of ``calls`` calls of ``fn`` issued back to back."""
    wait()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    wait()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def host_costs(fns: Mapping[str, Callable[[], Any]], wait: Callable[[], None], *, calls: int, rounds: int,
               warmup: int = 3) -> dict[str, HostCost]:
    """Each callable timed ``rounds`` times, the callables interleaved within every round."""
    if calls < 1 or rounds < 1:
        raise ValueError(f"calls and rounds must be >= 1, got {calls} and {rounds}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = interleaved({k: functools.partial(per_call_us, fn, calls, wait) for k, fn in fns.items()}, rounds)
    return {k: HostCost(tuple(h for h, _ in s), tuple(w for _, w in s), calls) for k, s in samples.items()}


def level_calls(provider: Provider, x: Inputs, clean: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """One zero-argument call per level on the inputs ``x``, methods bound once as an engine would.
    The ``api`` level serves whatever the selection picks: hold ``MQA_PROVIDER`` while calling it."""
    from .. import api

    args = x.args()
    api_fn, provider_fn, kernel_fn = api.fp8_mqa_logits, provider.fp8_mqa_logits, provider.impl.fp8_mqa_logits
    return {"api": lambda: api_fn(*args, clean_logits=clean),
            "provider": lambda: provider_fn(*args, clean_logits=clean),
            "kernel": lambda: kernel_fn(*args, clean_logits=clean)}


def check_levels(fns: Mapping[str, Callable[[], torch.Tensor]], ref: torch.Tensor | None, against: str,
                 clean: bool, wait: Callable[[], None]) -> tuple[float | None, str]:
    """Each level's result against the reference: (worst calc_diff, "") or (None, what is wrong)."""
    if ref is None:
        return None, ""
    worst = 0.0
    for level, fn in fns.items():
        out = fn()
        wait()
        verdict = compare(out, ref, clean=clean, against=against)
        if not verdict.ok:
            return None, f"{LEVELS.get(level, level)}: {verdict.detail}"
        worst = max(worst, verdict.calc_diff)
    return worst, ""


def host_rows(w: Workload, names: Sequence[str], providers: Mapping[tuple[str, str], Provider],
              device: torch.device, arch: str, *, calls: int, rounds: int, seed: int = 0,
              common: Mapping[str, Any] | None = None,
              progress: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One row per provider: host us per call at each level on ``w``, each level's result checked
    against the reference first, plus the device's time per call from a CUDA graph where there is one
    (the same inputs every call, as in the host measurement)."""
    from .. import api
    from .runner import reference

    x = w.setup(device, seed)
    ref, against = reference(w, x, providers, arch)
    wait = lambda: sync(device)  # noqa: E731
    rows: list[dict[str, Any]] = []
    for name in names:
        provider = providers.get((name, w.op))
        row: dict[str, Any] = {"record": "host", "provider": name, "workload": w.name, "label": w.label,
                               "op": w.op, "kind": w.kind, "m": w.problem.m, "n": w.problem.n,
                               "h": w.problem.h, "d": w.problem.d, "clean": w.clean, "calls": calls,
                               "rounds": rounds, **(common or {})}
        rows.append(row)
        if provider is None:
            row.update(status="skipped", reason=f"does not declare {w.op}")
            continue
        tag = f"host cost {w.name} {name}"
        fns = level_calls(provider, x, w.clean)
        try:
            with environment(MQA_PROVIDER=name):  # the api level must reach this provider
                chosen = api.get_provider(arch, op=w.op, problem=w.problem).name
                if chosen != name:
                    raise RuntimeError(f"the API chose {chosen} under MQA_PROVIDER={name}")
                worst, wrong = check_levels(fns, ref, against, w.clean, wait)
                if wrong:
                    row.update(status="wrong", reason=wrong)
                    progress(f"{tag}: WRONG vs {against}: {wrong}")
                    continue
                costs = host_costs(fns, wait, calls=calls, rounds=rounds)
        except Exception as exc:  # reported; the other providers still run
            row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            progress(f"{tag}: ERROR {row['reason']}")
            continue
        kernel = fns["kernel"]
        try:
            device_t, note = graph_time(lambda _: kernel(), [None], device)
        except Exception as exc:  # the host figures stand; only the device's time is missing
            device_t, note = None, f"CUDA graph capture failed: {type(exc).__name__}: {exc}"
        device_us = None if device_t is None else device_t.median * 1e3
        row.update(status="ok", calc_diff=worst, verified_against=against or "none", device_us=device_us,
                   device_note=note or None,
                   gpu_kept_up=None if device_us is None else all(device_us < c.median for c in costs.values()))
        for level, cost in costs.items():
            row.update({f"host_us_{level}": cost.median, f"host_us_{level}_min": min(cost.host_us),
                        f"wall_us_{level}": cost.wall_median})
        progress(f"{tag}: " + ", ".join(f"{lv} {row[f'host_us_{lv}']:.1f} us" for lv in LEVELS)
                 + ("" if device_us is None else f"; device {device_us:.1f} us per call"))
    return rows
