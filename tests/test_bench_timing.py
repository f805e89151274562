"""The interleaved throughput timer: its batch sizes, arithmetic and order, on a fake clock (no GPU)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from mqa_core.bench.timing import Timing, calls_for, interleaved, time_interleaved

CPU = torch.device("cpu")


class Clock:
    """A fake ``perf_counter``: only the calls advance it, by their declared cost."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[tuple[str, Any]] = []

    def __call__(self) -> float:
        return self.now

    def costing(self, name: str, ms: float) -> Callable[[Any], None]:
        def call(x: Any) -> None:
            self.log.append((name, x))
            self.now += ms / 1e3

        return call


def test_costs_come_out_per_call_with_batches_sized_to_the_target() -> None:
    clock = Clock()
    calls = {"fast": clock.costing("fast", 0.1), "slow": clock.costing("slow", 0.3)}
    t = time_interleaved(calls, list(range(5)), CPU, warmup=2, rounds=4, target_ms=1.0, timer=clock)
    assert t["fast"].median == pytest.approx(0.1) and t["slow"].median == pytest.approx(0.3)
    # probes of 1, 2, 4, ... calls until one lasts 1 ms: 16 x 0.1 = 1.6 ms -> 10 calls; 4 x 0.3 -> 4 calls
    assert (t["fast"].calls, t["slow"].calls) == (10, 4)
    assert all(len(x.samples) == 4 for x in t.values())


def test_rounds_interleave_the_names_and_each_name_rotates_its_inputs() -> None:
    clock = Clock()
    calls = {"a": clock.costing("a", 0.25), "b": clock.costing("b", 0.5), "c": clock.costing("c", 2.0)}
    t = time_interleaved(calls, list(range(3)), CPU, warmup=1, rounds=3, target_ms=1.0, timer=clock)
    sizes = {k: v.calls for k, v in t.items()}
    assert sizes == {"a": 4, "b": 2, "c": 1}
    timed = clock.log[-3 * sum(sizes.values()):]  # the rounds come last
    one_round = [n for n in "abc" for _ in range(sizes[n])]
    assert [n for n, _ in timed] == one_round * 3
    for name in "abc":  # every call of a name reads the set after its previous call's, warm-up included
        seen = [x for n, x in clock.log if n == name]
        assert seen == [i % 3 for i in range(len(seen))]


def test_each_input_sets_first_call_is_warm_up_not_timing() -> None:
    """A kernel that caches per address (descriptor encodings) pays once per input set: with more sets
    than warm-up calls, those first calls would land in the rounds and inflate the median."""
    clock = Clock()
    seen: set[int] = set()

    def cached(x: int) -> None:
        clock.now += (0.1 if x in seen else 10.0) / 1e3
        seen.add(x)

    t = time_interleaved({"cached": cached}, list(range(16)), CPU, warmup=2, rounds=5, target_ms=1.0, timer=clock)
    assert seen == set(range(16)) and t["cached"].median == pytest.approx(0.1)


def test_batch_size_is_capped_and_one_for_slow_calls() -> None:
    assert calls_for(lambda n: 0.001 * n, target_ms=1.0, most=5) == 5
    assert calls_for(lambda n: 0.0, target_ms=1.0, most=7) == 7  # a clock that never moves
    assert calls_for(lambda n: 3.0 * n, target_ms=1.0, most=256) == 1
    probes: list[int] = []
    assert calls_for(lambda n: (probes.append(n), 0.3 * n)[1], target_ms=1.0, most=256) == 4
    assert probes == [1, 2, 4]


def test_scopes_are_entered_around_each_batch_and_stay_out_of_the_time() -> None:
    clock = Clock()
    entered: list[str] = []

    def scope(name: str) -> Callable[[], Any]:
        @contextmanager
        def cm() -> Iterator[None]:
            entered.append(name)
            clock.now += 0.05  # a costly switch (a reload) must not show in the timings
            yield

        return cm

    calls = {"x": clock.costing("x", 0.5), "y": clock.costing("y", 0.5)}
    t = time_interleaved(calls, [0], CPU, warmup=1, rounds=2, target_ms=1.0, timer=clock,
                         scopes={"x": scope("x"), "y": scope("y")})
    assert t["x"].median == pytest.approx(0.5) and t["y"].median == pytest.approx(0.5)
    assert (t["x"].calls, t["y"].calls) == (2, 2)
    # once around the warm-up and the sizing, then around each batch of every round
    assert entered == ["x", "y"] + ["x", "y"] * 2


def test_real_sleeps_keep_their_order_and_rough_ratio() -> None:
    """Wall time on a possibly loaded machine: only a generous ratio."""
    calls = {"short": lambda x: time.sleep(0.001), "long": lambda x: time.sleep(0.004)}
    t = time_interleaved(calls, [None], CPU, warmup=0, rounds=3, target_ms=2.0, most=4)
    assert t["long"].median > 1.5 * t["short"].median and t["short"].median >= 1.0


def test_rotated_rounds_start_one_name_later_each_round() -> None:
    order: list[str] = []
    got = interleaved({k: (lambda k=k: order.append(k) or len(order)) for k in "abc"}, 4, rotate=True)
    assert order == list("abc" "bca" "cab" "abc")
    assert got["a"] == [1, 6, 8, 10] and all(len(v) == 4 for v in got.values())
    order.clear()
    interleaved({k: (lambda k=k: order.append(k)) for k in "ab"}, 2)
    assert order == list("abab")  # without rotate: the mapping's order every round


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved({"a": lambda: 1}, 0)
    with pytest.raises(ValueError, match="warmup must be >= 0 and rounds >= 1"):
        time_interleaved({"a": lambda x: None}, [0], CPU, warmup=0, rounds=0)
    with pytest.raises(ValueError, match="most must be >= 1"):
        calls_for(lambda n: 1.0, target_ms=1.0, most=0)
    with pytest.raises(ValueError, match="Timing needs >= 1 sample"):
        Timing(())
