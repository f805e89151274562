"""Where the Gluon paged kernel's time goes: a ``trace=1`` build stamps each SM's clock at fixed points
(``TRACE_EVENTS``) and adds up, over warpgroup 0's tiles, the cycles it waits for data, for its wgmma
and spends in the epilogue, and the loader's waits for a free slot. This prints, per shape and build:
when the programs end (the balance) and whether any shares an SM, those per-tile cycles, and per event
the median and the slowest program's time since the program started, in ns.

    python bench/h200_decode_trace.py [--shapes 32x4096x2x64,256x4096x1x32] [--variants ws,ws+stages=12]

Each shape is run eagerly on R page pools in turn (so the timed call finds its cache in DRAM, as in
graph replay); the last call's stamps are reported. Same inputs as bench/h200_decode_vs_deepgemm.py.
The clock reads cost a few instructions per tile: compare builds within one run.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from h200_decode_vs_deepgemm import Batch, copies_for, variant_config  # noqa: E402


def trace(batch: Batch, next_n: int, h: int, cfg) -> list[list[int]]:
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import fp8_paged_mqa_logits_gluon

    g = torch.Generator(device="cuda").manual_seed(1)
    q = (torch.randn(batch.batch, next_n, h, 128, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
    w = torch.rand(batch.batch * next_n, h, device="cuda", generator=g)
    lens = batch.lens_2d(next_n)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import TRACE_WIDTH

    buf = torch.zeros(sms, TRACE_WIDTH.value, dtype=torch.int64, device="cuda")
    import dataclasses
    cfg_t = dataclasses.replace(cfg, trace=1)
    for _ in range(3):
        for c, t in zip(batch.caches, batch.tables):
            fp8_paged_mqa_logits_gluon(q, c, w, lens, t, batch.ctx, False, config=cfg_t, schedule=buf)
    torch.cuda.synchronize()
    return buf.tolist()


def report(rows: list[list[int]], label: str) -> None:
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import TRACE_EVENTS

    # clock rate from the programs' own start/end pairs (ns and cycles)
    rates = [(r[7] - r[1]) / max(r[11] - r[0], 1) for r in rows if r[11] > r[0]]
    ghz = statistics.median(rates) if rates else 1.0
    t0 = min(r[0] for r in rows)
    span = max(r[11] for r in rows) - t0
    print(f"{label}: clock {ghz:.2f} GHz, first start to last end {span} ns; "
          f"starts spread {max(r[0] for r in rows) - t0} ns; tiles per program {min(r[12] for r in rows)}-"
          f"{max(r[12] for r in rows)}")
    # balance: when each program ends (ns after the first start) and how many share an SM
    ends = sorted(r[11] - t0 for r in rows)
    per_sm = collections.Counter(r[14] for r in rows)
    print(f"  programs end at       min {ends[0]:8d} ns   median {ends[len(ends) // 2]:8d} ns   "
          f"p90 {ends[len(ends) * 9 // 10]:8d} ns   max {ends[-1]:8d} ns; SMs used {len(per_sm)}, "
          f"shared by 2+ programs {sum(n > 1 for n in per_sm.values())}")
    # the steady state: per tile of warpgroup 0, cycles waiting for data, for its wgmma, in the epilogue
    # (the rest: the warpgroup barrier, sequence switches); the loader's wait for free slots per tile
    tiles = [max(r[19], 1) for r in rows]
    per_tile = {name: statistics.median(r[i] / n for r, n in zip(rows, tiles))
                for i, name in ((16, "data"), (17, "wgmma"), (18, "epilogue"))}
    cycle = statistics.median((r[7] - r[6]) / n for r, n in zip(rows, tiles))
    loader = statistics.median(r[15] / max(r[12], 1) for r in rows)
    print(f"  wg0 per tile (cycles, median over programs): {cycle:.0f} in all; "
          + ", ".join(f"{k} {v:.0f}" for k, v in per_tile.items())
          + f"; loader waits {loader:.0f} per tile for a free slot")
    for i, name in enumerate(TRACE_EVENTS):
        if i in (0, 1, 11, 12, 14) or i >= 15:
            continue
        vals = [(r[i] - r[1]) / ghz for r in rows if r[i]]
        if vals:
            print(f"  {name:22s} median {statistics.median(vals):8.0f} ns   max {max(vals):8.0f} ns")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="32x4096x2x64,32x4096x1x32,256x4096x1x32,128x16384x2x64",
                    help="BxCxNEXT_NxH, comma-separated")
    ap.add_argument("--variants", default="ws",
                    help="GluonPagedConfig variants (as the decode bench)")
    args = ap.parse_args()
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import GluonPagedConfig

    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in args.shapes.split(","):
        b, c, nn, h = (int(x) for x in shape.split("x"))
        batch = Batch(b, c, "cuda", g, copies_for(b, c))
        for name in args.variants.split(","):
            cfg = variant_config(name, {"ws": GluonPagedConfig()})
            report(trace(batch, nn, h, cfg), f"B={b} C={c} next_n={nn} H={h} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
