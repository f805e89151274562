"""SM clock and board power while DeepGEMM's decode kernel and mqa-core's replay one ragged batch.

Why: on the large next_n = 2, H = 64 batches the SM clock falls under the power cap (round 18's trace:
1.58-1.65 GHz there, 1.78 elsewhere), and two kernels that do the same work per tile can end at
different clocks. This replays each implementation's CUDA graph (R calls over R caches, as
``h200_decode_vs_deepgemm.py`` times them) for a few seconds at a time, alternating, while
``nvidia-smi`` samples the SM clock, power and throttle reasons; per phase it prints the median
sample and the time per call. Run on the H200:

    python bench/h200_power.py [--batch 256 --ctx 65536 --next-n 2 --heads 64 --seconds 3 --phases 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h200_decode_vs_deepgemm as dec  # noqa: E402

FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
OLD_FIELDS = FIELDS.replace("clocks_event_reasons", "clocks_throttle_reasons")  # drivers before the rename


def fields() -> str:
    """The query nvidia-smi here accepts (the throttle reasons were renamed event reasons)."""
    ok = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader"], capture_output=True)
    return FIELDS if ok.returncode == 0 else OLD_FIELDS


def sample(seconds: float, replay, query: str) -> tuple[list[list[str]], float]:
    """Replays ``replay`` for ``seconds`` while nvidia-smi samples every 50 ms: (samples, us per replay)."""
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "50"],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # the sampler's start
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        replay()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    spent = time.perf_counter() - t0
    proc.terminate()
    rows = parse(proc.communicate()[0])
    return rows[6:-2] or rows, spent * 1e6 / n  # drop the ramp at both ends


def parse(out: str) -> list[list[str]]:
    """nvidia-smi's CSV samples (no header, no units) as rows of fields; lines that are not samples
    (a warning, a cut last line) are left out."""
    rows = [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()]
    return [r for r in rows if len(r) == 4 and _number(r[0]) and _number(r[1])]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def medians(rows: list[list[str]]) -> tuple[float, float, float, list[str]]:
    """Median SM clock (MHz), power (W) and temperature (C) of a phase's samples, and the throttle
    reasons seen."""
    return (statistics.median(float(r[0]) for r in rows), statistics.median(float(r[1]) for r in rows),
            statistics.median(float(r[2]) for r in rows), sorted({r[3] for r in rows}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ctx", type=int, default=65536)
    p.add_argument("--next-n", type=int, default=2)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--phases", type=int, default=4, help="alternating phases per implementation")
    p.add_argument("--gluon", default="", help="also these Gluon paged-kernel variants, as the decode bench names "
                                                "them (e.g. ws+schedule=1,ws+stages=12+schedule=1)")
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    bt = dec.Batch(a.batch, a.ctx, "cuda", g, dec.copies_for(a.batch, a.ctx))
    q, w = bt.operands(a.next_n, a.heads, g)
    lens = bt.lens_2d(a.next_n)
    impls = {"mqa_core+schedule": dec.public_impls()["mqa_core+schedule"]}
    impls.update(dec.gluon_impls([n for n in a.gluon.split(",") if n]))
    dg, note = dec.deepgemm_impl()
    print(note, flush=True)
    import mqa_core

    print(f"mqa_core's op runs provider {mqa_core.get_provider(op='fp8_paged_mqa_logits').name}", flush=True)
    if dg is not None:
        impls["deepgemm"] = dg
    graphs = {}
    for name, bind in impls.items():
        call = bind(q, w, lens, a.ctx, False)
        graphs[name] = dec._captured([lambda call=call, c=c, t=t: call(c, t) for c, t in zip(bt.caches, bt.tables)])
    calls = len(bt.caches)
    query = fields()
    print(f"B={a.batch} C={a.ctx} next_n={a.next_n} H={a.heads}: {calls} calls per replay; fields {query}")
    table = []
    for phase in range(a.phases):
        for name, graph in graphs.items():
            rows, us = sample(a.seconds, graph.replay, query)
            if not rows:
                raise SystemExit(f"h200_power: nvidia-smi gave no samples during {name}'s phase")
            clk, pw, temp, reasons = medians(rows)
            table.append((name, phase, us / calls, clk, pw, temp, reasons))
            print(f"phase {phase} {name:18s} {us / calls:8.1f} us/call  SM {clk:6.0f} MHz  {pw:6.1f} W  {temp:4.0f} C  "
                  f"reasons {reasons}", flush=True)
    print("\nimplementation       us/call   SM MHz   W   (medians over phases)")
    for name in graphs:
        mine = [r for r in table if r[0] == name]
        print(f"{name:18s} {statistics.median(r[2] for r in mine):8.1f} {statistics.median(r[3] for r in mine):8.0f} "
              f"{statistics.median(r[4] for r in mine):6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
