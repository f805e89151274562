"""Time a call: device events on GPUs, perf_counter on the CPU; warm-up first, inputs rotated."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call over the repeats."""

    samples: tuple[float, ...]

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
