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
