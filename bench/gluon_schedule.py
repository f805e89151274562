"""The Gluon persistent kernel's balance per engine-preset shape, modelled on the CPU (seconds, no GPU).

    python bench/gluon_schedule.py [--sms 132] [--item-cost 1] [--variants today,rule,dyn+fill]

For each shape of ``mqa bench --preset engine`` and each launch variant: the work items, the rounds of
the persistent grid, the busiest program's time against the mean (key tiles: one [64 keys, 256
columns] wgmma and its epilogue), and a predicted time, next to what the 2026-12-02 H200 run measured
for today's config (graph replay, us). The walk is ``mqa_provider_gluon.ops.persistent_schedule``,
which mirrors the kernel's item order (static snake, or dynamic draws) with the launcher's own split
rules, on the workload's real windows.

The time model, fitted to that run: a tile costs 0.55 us at H=64 and 0.62 us at H=32 (BQ*H = 256 either
way: at H=32 the epilogue has twice the queries); an item costs ``item_cost`` tiles to start (0.3 when
it computes nothing); when the math warpgroups write the -inf tiles, each costs 0.02*BQ tiles (BQ*256
bytes at ~3 TB/s over 132 SMs); with the filler warp they overlap the math; and the output can never
be written faster than 3 TB/s; plus 5 us of launch and prologue. It fits the compute-bound shapes within
~5% and overstates the fill-bound ones (packed, sliding) by up to 30%: use it to rank, not to promise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "gluon"))

from engine_variants import VARIANTS as ENGINE_VARIANTS  # noqa: E402  (this script's folder)
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402
from mqa_provider_gluon.ops import persistent_schedule as sched  # noqa: E402

from mqa_core.bench import workloads as wl  # noqa: E402

#: Graph replay, us, of gluon (today's config) and DeepGEMM: bench/results/2026-12-02-h200-engine-v1.log.
MEASURED = {"suffix M=128 N=2048 H=64 D=128": (11, 13), "suffix M=512 N=4096 H=32 D=128": (25, 23),
            "suffix M=1024 N=8192 H=64 D=128": (143, 140), "causal M=1024 N=1024 H=64 D=128": (17, 17),
            "packed x8 M=8192 N=8192 H=64 D=128": (190, 222), "packed x32 M=10992 N=10992 H=32 D=128": (161, 193),
            "packed x4 M=3840 N=27648 H=64 D=128": (431, 381), "chunk M=256 N=65536 H=64 D=128": (310, 313),
            "chunk M=4096 N=32768 H=64 D=128": (2148, 2263), "chunk M=1024 N=131072 H=32 D=128": (1293, 1359),
            "sliding W=2048 M=4096 N=16384 H=64 D=128": (188, 221), "sliding W=512 M=1024 N=8192 H=32 D=128": (22, 20),
            "causal M=8192 N=8192 H=64 D=128": (594, 696), "suffix M=4096 N=16384 H=32 D=128": (580, 619)}
TILE_US = {64: 0.55, 32: 0.62}
WRITE_BYTES_PER_US = 3.0e6
FIXED_US = 5.0
#: The launch variants modelled by default, bench/engine_variants.py's configs (None: the shape rule);
#: ``--variants`` takes any of its names but ``triton``, which is another kernel.
VARIANTS: dict[str, dict[str, Any] | None] = {
    n: ENGINE_VARIANTS[n]
    for n in ("today", "rule", "bal", "fill", "bal+fill", "dyn", "dyn+fill", "dyn+fill+bal", "ips1", "ips16")}


def model(w: wl.Workload, config: dict[str, Any] | None, sms: int, item_cost: float) -> dict[str, Any]:
    p = w.problem
    cfg = g.resolve_config(p.h, config if config is not None else dict(g.shape_config(p.m, p.n, p.h, sms)))
    bq, bn = cfg["BQ"], cfg["BN"]
    if cfg["split"] == "balanced":
        splits, tps = g.persistent_split_balanced(p.m, p.n, bq, bn, sms, cfg["item_cost"])
    else:
        splits, tps = g.persistent_split(p.m, p.n, bq, bn, sms * cfg["items_per_sm"])
    ks, ke = w.windows()
    ranges = sched.block_ranges(ks.tolist(), ke.tolist(), p.m, p.n, bq)
    fill = 0.0 if cfg["filler"] else 0.02 * bq
    if cfg["dynamic"]:
        programs = sched.walk_dynamic(ranges, p.n, bn, splits, tps, sms, item_cost, 0.3, fill)
    else:
        programs = sched.walk(ranges, p.n, bn, splits, tps, sms)
    bal = sched.balance(programs, sms, item_cost, 0.3, fill)
    write_us = p.m * p.n * 4 / WRITE_BYTES_PER_US
    us = max(bal.busiest * TILE_US.get(p.h, 0.6), write_us) + FIXED_US
    return {"splits": splits, "tps": tps, "items": bal.items, "rounds": -(-bal.items // min(sms, bal.items)),
            "busiest": bal.busiest, "mean": bal.mean_work, "eff": bal.efficiency, "us": us}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--item-cost", type=float, default=1.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    print(f"busiest program / mean work in key tiles (efficiency), predicted us; {args.sms} SMs, "
          f"item cost {args.item_cost} tiles. Measured today / DeepGEMM: graph replay, 2026-12-02.")
    for w in wl.engine_preset(True):
        rows = {n: model(w, ENGINE_VARIANTS[n], args.sms, args.item_cost) for n in names}
        today, deepgemm = MEASURED.get(w.name, (None, None))
        print(f"\n{w.name}   measured today {today} us, DeepGEMM {deepgemm} us")
        for n, r in rows.items():
            print(f"  {n:13s} splits {r['splits']:4d} x {r['tps']:5d} tiles  items {r['items']:6d}  rounds "
                  f"{r['rounds']:4d}  busiest {r['busiest']:7.0f} / mean {r['mean']:7.0f} ({r['eff']:.2f})  "
                  f"-> {r['us']:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
