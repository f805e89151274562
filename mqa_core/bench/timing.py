"""Time a call: device events on GPUs, perf_counter on the CPU; warm-up first, inputs rotated.

Two methods. ``time_calls`` puts an event pair around each single call, one candidate after another.
``time_interleaved`` times batches of back-to-back calls, every candidate once per round: what an
engine sees (calls issued back to back), with drift shared by all candidates. Use it to compare.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call, one sample per repeat (or per round); each sample the mean of ``calls``
    calls issued back to back."""

    samples: tuple[float, ...]
    calls: int = 1

    def __post_init__(self) -> None:
        if not self.samples or self.calls < 1:
            raise ValueError(f"Timing needs >= 1 sample and calls >= 1; got {len(self.samples)} samples, "
                             f"calls={self.calls}")

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def percentile(self, q: float) -> float:
        s = sorted(self.samples)
        pos = (len(s) - 1) * q / 100
        lo, hi = int(pos), min(len(s) - 1, int(pos) + 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def summary(self) -> dict[str, float]:
        return {"median": self.median, "p10": self.percentile(10), "p90": self.percentile(90),
                "min": min(self.samples), "mean": statistics.fmean(self.samples)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rotating(call: Callable[[Any], Any], inputs: Sequence[Any]) -> Callable[[], Any]:
    """A zero-argument ``call`` that reads the next input set each time (so caches do not hold one
    set), for timers that take a bare callable (``do_bench``, CUDA-graph capture)."""
    state = {"i": 0}

    def fn() -> Any:
        state["i"] += 1
        return call(inputs[state["i"] % len(inputs)])

    return fn


def time_calls(call: Callable[[Any], Any], inputs: Sequence[Any], device: torch.device, *,
               warmup: int, repeat: int) -> Timing:
    """Time ``call(inputs[i % len(inputs)])``: each repeat reads a set the previous ones did not.

    On a GPU each call sits between two CUDA events on the current stream (launch included, no host
    sync in between); on the CPU it is wall time. The output is dropped at once, so the caching
    allocator hands the same block to the next call, as in a serving loop.
    """
    for i in range(warmup):
        call(inputs[i % len(inputs)])
    sync(device)
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        for i in range(repeat):
            starts[i].record()
            call(inputs[(warmup + i) % len(inputs)])
            ends[i].record()
        torch.cuda.synchronize(device)
        return Timing(tuple(s.elapsed_time(e) for s, e in zip(starts, ends)))
    samples = []
    for i in range(repeat):
        t0 = time.perf_counter()
        call(inputs[(warmup + i) % len(inputs)])
        sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(tuple(samples))


def interleaved(batches: Mapping[str, Callable[[], T]], rounds: int, *, rotate: bool = False) -> dict[str, list[T]]:
    """``rounds`` results of each batch, the batches run in the mapping's order within every round, so
    drift of the machine (clocks, heat, other jobs) falls on every name alike, not on whichever ran
    last; the median over rounds then drops a round that one disturbance hit. ``rotate``: round ``r``
    starts at the ``r``-th name (mod their count), so no name always follows the same one (a kernel's
    time can depend on what ran just before it)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    results: dict[str, list[T]] = {name: [] for name in batches}
    names = list(batches)
    for r in range(rounds):
        first = r % len(names) if rotate and names else 0
        for name in names[first:] + names[:first]:
            results[name].append(batches[name]())
    return results


def batch_ms(call: Callable[[Any], Any], inputs: Sequence[Any], start: int, calls: int, device: torch.device,
             timer: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds for ``calls`` calls issued back to back on the input sets from ``start`` on, the
    device idle before: on a GPU two events around the whole batch and one sync after (a host-bound
    call shows the host's pace, as in a serving loop), elsewhere ``timer`` and a sync."""
    sync(device)
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for i in range(start, start + calls):
            call(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        return float(begin.elapsed_time(end))
    t0 = timer()
    for i in range(start, start + calls):
        call(inputs[i % len(inputs)])
    sync(device)
    return (timer() - t0) * 1e3


def calls_for(ms_of: Callable[[int], float], *, target_ms: float, most: int) -> int:
    """How many back-to-back calls make a batch of about ``target_ms`` (1 to ``most``): ``ms_of(n)``
    times batches of 1, 2, 4, ... calls until one lasts that long, then the count is scaled to it. A
    batch that long measures a small call in its steady state, not one launch from an idle device."""
    if most < 1:
        raise ValueError(f"most must be >= 1, got {most}")
    n = 1
    while True:
        ms = ms_of(n)
        if ms >= target_ms or n >= most:
            break
        n = min(most, 2 * n)
    return most if ms <= 0 else max(1, min(most, math.ceil(round(n * target_ms / ms, 6))))  # no call for float noise


def time_interleaved(calls: Mapping[str, Callable[[Any], Any]], inputs: Sequence[Any], device: torch.device, *,
                     warmup: int, rounds: int, target_ms: float = 1.0, most: int = 256,
                     scopes: Mapping[str, Callable[[], AbstractContextManager[Any]]] | None = None,
                     timer: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Per name, ms per call of ``calls[name](inputs[i % len(inputs)])``: one sample per round, each
    the mean of a batch of back-to-back calls (``batch_ms``), every name once per round (``interleaved``).

    Each name gets ``warmup`` single calls, at least one per input set when ``warmup`` > 0 (a kernel
    that caches per address, as TMA descriptor encodings are, meets each set's first call before the
    timing, as an engine's steady state has met its few addresses), then its batch size from
    ``calls_for`` (a batch lasts at least ``target_ms``, at most ``most`` calls). Each name reads the
    input sets in turn across all its calls. ``scopes[name]()``, where given, is entered around each
    of that name's batches (once around its warm-up and sizing) and outside the timed span: the
    settings a configuration needs, say.
    """
    if warmup < 0 or rounds < 1:
        raise ValueError(f"warmup must be >= 0 and rounds >= 1, got {warmup} and {rounds}")
    scope = (lambda name: scopes[name]()) if scopes else (lambda name: nullcontext())
    start = dict.fromkeys(calls, 0)  # the next input set of each name

    def timed(name: str, n: int) -> float:
        ms = batch_ms(calls[name], inputs, start[name], n, device, timer)
        start[name] += n
        return ms

    def scoped(name: str, n: int) -> float:
        with scope(name):
            return timed(name, n)

    sizes: dict[str, int] = {}
    warm = max(warmup, len(inputs)) if warmup else 0
    for name, call in calls.items():
        with scope(name):
            for i in range(warm):
                call(inputs[i % len(inputs)])
            start[name] = warm
            sizes[name] = calls_for(functools.partial(timed, name), target_ms=target_ms, most=most)
    samples = interleaved({name: functools.partial(scoped, name, sizes[name]) for name in calls}, rounds)
    return {name: Timing(tuple(ms / sizes[name] for ms in samples[name]), sizes[name]) for name in calls}


def host_syncs(call: Callable[[], Any]) -> str:
    """Why ``call`` cannot be captured in a CUDA graph because it waits for the device (``.item()``,
    ``.tolist()``, a copy to the host), or "" when it does not. Run under torch's sync debug mode,
    outside any capture: a failed capture would leave the stream in a bad state."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    except RuntimeError as exc:
        return f"it synchronises with the host ({str(exc).splitlines()[0][:120]})"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return ""


def graph_time(call: Callable[[Any], Any], inputs: Sequence[Any], device: torch.device, *,
               replays: int = 10, min_calls: int = 16) -> tuple[Timing | None, str]:
    """Milliseconds per call replaying a CUDA graph of calls over the input sets: the device's time
    alone, no Python and no launch gaps (how engines run small calls). Returns (None, why) where a
    graph cannot be used: not CUDA, or the call synchronises with the host."""
    if device.type != "cuda":
        return None, f"no CUDA graphs on {device.type}"
    why = host_syncs(lambda: call(inputs[0]))
    if why:
        return None, f"not captured in a CUDA graph: {why}"
    calls = len(inputs) * max(1, -(-min_calls // len(inputs)))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm up on a side stream, as capture asks
        for x in inputs:
            call(x)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(inputs[i % len(inputs)])  # each output is dropped: the graph's pool reuses it
    graph.replay()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    del graph
    return Timing(tuple(samples)), ""
