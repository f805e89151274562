"""The Gluon persistent kernel's work assignment, in plain Python: which items each program takes and
what each computes and fills.

It mirrors ``_p_rounds``, ``_p_item`` and ``_p_tiles`` of ``mqa_logits_gluon_sm90`` line for line, so
the launcher's split rules can be checked on the CPU (every cell computed or filled exactly once) and
their balance modelled per shape (``git show cb9ff2b:bench/gluon_schedule.py``). Times are in key tiles: one
[64 keys, BQ*H columns] wgmma plus its epilogue, about 0.55 us at H=64 and 0.62 us at H=32 on an
H200 (fitted to the 2026-12-02 engine run; see the bench script).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Item:
    """One work item: query block ``mb`` and its key tiles [c0, c1); [t0, t1) meets a window and is
    computed, the rest of [c0, c1) is filled with -inf."""

    mb: int
    c0: int
    c1: int
    t0: int
    t1: int

    @property
    def computed(self) -> int:
        return self.t1 - self.t0

    @property
    def filled(self) -> int:
        return (self.c1 - self.c0) - self.computed


def block_ranges(ks: Sequence[int], ke: Sequence[int], M: int, N: int, bq: int) -> list[tuple[int, int]]:
    """(lo, hi) per query block: the key range its clamped, non-empty windows cover (``_block_window``)."""
    out = []
    for mb in range(cdiv(M, bq)):
        lo, hi = N, 0
        for m in range(mb * bq, min(M, mb * bq + bq)):
            a, b = max(ks[m], 0), min(ke[m], N)
            if a < b:
                lo, hi = min(lo, a), max(hi, b)
        out.append((lo, hi))
    return out


def walk(ranges: Sequence[tuple[int, int]], N: int, bn: int, splits: int, tps: int, sms: int) -> list[list[Item]]:
    """The items of each program of the persistent grid, in the order it takes them."""
    num_mb, n_tiles = len(ranges), cdiv(N, bn)
    total = num_mb * splits
    grid = min(sms, total)
    programs: list[list[Item]] = [[] for _ in range(grid)]
    for r in range(cdiv(total, grid)):  # _p_rounds
        for p in range(grid):  # _p_item: snake order, heaviest query block first
            idx = r * grid + (p if r % 2 == 0 else grid - 1 - p)
            if idx >= total:
                continue
            mb = num_mb - 1 - idx // splits
            c0 = (idx % splits) * tps
            c1 = min(c0 + tps, n_tiles)
            lo, hi = ranges[mb]  # _p_tiles
            t0 = min(max(lo // bn, c0), c1)
            t1 = max(min(cdiv(hi, bn), c1), t0)
            programs[p].append(Item(mb, c0, c1, t0, t1))
    return programs


def items_in_order(ranges: Sequence[tuple[int, int]], N: int, bn: int, splits: int, tps: int) -> list[Item]:
    """Every item by index (``_p_decode``): query blocks heaviest first, then their key splits."""
    num_mb, n_tiles = len(ranges), cdiv(N, bn)
    out = []
    for idx in range(num_mb * splits):
        mb = num_mb - 1 - idx // splits
        c0 = (idx % splits) * tps
        c1 = min(c0 + tps, n_tiles)
        lo, hi = ranges[mb]
        t0 = min(max(lo // bn, c0), c1)
        out.append(Item(mb, c0, c1, t0, max(min(cdiv(hi, bn), c1), t0)))
    return out


def walk_dynamic(ranges: Sequence[tuple[int, int]], N: int, bn: int, splits: int, tps: int, sms: int,
                 item_cost: float = 1.0, empty_cost: float = 0.3, fill_cost: float = 0.0) -> list[list[Item]]:
    """The items of each program when they draw from a grid-wide counter (``dynamic``): item i goes
    to the program that frees up first (the loader draws one item ahead; ignored here)."""
    items = items_in_order(ranges, N, bn, splits, tps)
    grid = min(sms, len(items))
    programs: list[list[Item]] = [[] for _ in range(grid)]
    free = [(0.0, p) for p in range(grid)]
    for it in items:
        t, p = heapq.heappop(free)
        programs[p].append(it)
        cost = (item_cost if it.computed else empty_cost) + it.computed + fill_cost * it.filled
        heapq.heappush(free, (t + cost, p))
    return programs


@dataclasses.dataclass(frozen=True)
class Balance:
    """The modelled time of the busiest program against the mean, in key tiles."""

    busiest: float
    mean_work: float
    items: int

    @property
    def efficiency(self) -> float:
        return self.mean_work / self.busiest if self.busiest else 1.0


def balance(programs: list[list[Item]], sms: int, item_cost: float = 1.0, empty_cost: float = 0.3,
            fill_cost: float = 0.0) -> Balance:
    """Each program's time: per item ``item_cost`` (``empty_cost`` when nothing is computed), its
    computed tiles, and ``fill_cost`` per filled tile (0 when the filler warp writes them alongside).
    ``mean_work`` spreads the computed tiles over all ``sms`` programs: the ideal."""
    loads = [sum((item_cost if it.computed else empty_cost) + it.computed + fill_cost * it.filled for it in items)
             for items in programs]
    work = sum(it.computed for items in programs for it in items)
    return Balance(busiest=max(loads, default=0.0), mean_work=work / sms,
                   items=sum(len(items) for items in programs))
