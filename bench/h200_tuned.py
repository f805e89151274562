"""Tuned selection on one H200: ``mqa tune --preset engine`` for gluon, triton and deepgemm, then the tuned
choice against each single provider over an engine-like mix of shapes (< 5 min).

    cd <repo> && pip install --no-deps --no-build-isolation -q -e . -e providers/torch_ref \\
        -e providers/gluon -e providers/deepgemm && PYTHONPATH=<DeepGEMM build>:$PYTHONPATH python bench/h200_tuned.py

1. ``mqa tune --device cuda --preset engine --providers gluon,triton,deepgemm --out $OUT/h200_tuning.json
   --budget 160`` (kit subset per provider, each bucket's shape checked then timed; the table and summary).
2. The mix: shapes inside the tuned buckets but not the tuned shapes themselves (so the table is used as
   an engine would use it), plus two outside every bucket (priority decides there). For each shape every
   configuration is checked against a reference (float64 oracle, or torch_ref fp32 for large shapes),
   then timed through the public op, ``mqa_core.fp8_mqa_logits`` / ``fp8_paged_mqa_logits``, so the
   tuned lookup's host cost is included: ``tuned`` (MQA_TUNING=table) and ``P-only`` (MQA_PROVIDER=P) for
   each provider. Prefill shapes: the configurations are interleaved in the same rounds
   (``time_interleaved``): per round, each in turn switches its MQA_* settings (reload, then one untimed
   call), then times a batch of back-to-back calls lasting >= 1 ms, as an engine issues them; median of
   15 rounds after warm-up calls that meet every input set, inputs rotated. Decode shapes (on CUDA), as
   ``mqa tune --replay auto`` times them and as engines run decode: each configuration's calls over the
   input sets captured in a CUDA graph under its settings (the lookup happens at capture, as in an
   engine's captured step) and replayed, the device's time (``graph_time``). ``--replay all`` times the
   prefill shapes that way too, in the table and in the mix: the device's time alone, which is what the
   choice of kernel changes (eager ~30 us calls carry the lent host's noise, 3-5% between two columns
   that run one kernel).
3. Per shape: tuned ms / best single provider's ms; geomean and worst case; the short table is printed
   last, everything goes to $OUT/h200_tuned.json.

Without ``deep_gemm`` importable it says so and compares gluon and triton only. ``--cpu-smoke`` runs
every step on the CPU, on tiny shapes, with torch_ref and example_chunked (the tutorial's provider).
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import mqa_core
from mqa_core.bench.timing import graph_time, sync, time_interleaved
from mqa_core.bench.verify import compare
from mqa_core.bench.workloads import Workload, input_sets
from mqa_core.cli.main import main as mqa_main
from mqa_core.cli.tune import EAGER, REPLAYED, TuneShape, replayed
from mqa_core.testing.providers import environment, provider_named, spec_named

OUT = os.environ.get("OUT", "/tmp/out")
#: The tune step starts no shape after TUNE_BUDGET_S (DeepGEMM's first JIT compiles can take tens of
#: seconds each on a fresh machine); the mix starts none after BUDGET_S, so the table (last) and the
#: JSON always come out inside 5 minutes.
#: ``--tune-budget S --budget S`` override both (a shorter device call).
TUNE_BUDGET_S, BUDGET_S = 160.0, 265.0
WARMUP, ROUNDS = 5, 15
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def deepgemm_status(arch: str) -> str | None:
    """None when DeepGEMM is usable here, else why not (printed, then the run goes on without it)."""
    try:
        module = importlib.import_module("deep_gemm")
    except Exception as exc:  # noqa: BLE001 - any import failure is the message
        return f"`import deep_gemm` failed ({type(exc).__name__}: {exc}); build DeepGEMM and put it on PYTHONPATH"
    if spec_named("deepgemm") is None:
        return "the deepgemm provider is not installed: pip install --no-deps -e providers/deepgemm"
    c = mqa_core.explain(arch).candidate("deepgemm")
    if not c.accepted:
        return f"deepgemm is not usable: [{c.code}] {c.reason}"
    log(f"DeepGEMM {getattr(module, '__version__', '?')} from {os.path.dirname(module.__file__ or '?')}")
    return None


def mix() -> list[TuneShape]:
    """Engine-like shapes: each inside a bucket the engine preset tunes (other sizes, other windows),
    and two outside every bucket."""
    out = []
    for h in (32, 64):
        out += [TuneShape.prefill(700, 900, h, 128), TuneShape.prefill(1500, 1800, h, 128),
                TuneShape.prefill(3000, 12000, h, 128, "suffix"), TuneShape.prefill(6000, 7000, h, 128),
                TuneShape.prefill(10000, 12000, h, 128), TuneShape.prefill(5000, 20000, h, 128, "full"),
                TuneShape.prefill(300, 70000, h, 128, "suffix"), TuneShape.prefill(1500, 40000, h, 128, "suffix"),
                TuneShape.decode(1, 6000, 1, h, 128), TuneShape.decode(24, 40000, 1, h, 128),
                TuneShape.decode(24, 6000, 2, h, 128), TuneShape.decode(100, 40000, 2, h, 128),
                TuneShape.decode(100, 5000, 1, h, 128)]
    out += [TuneShape.prefill(128, 2048, 64, 128), TuneShape.decode(8, 1000, 1, 64, 128)]  # outside the table
    return out


def smoke_tune_shapes() -> list[str]:
    """--cpu-smoke: what ``mqa tune --shapes`` measures, one shape per bucket, CPU-sized."""
    return ["prefill:64,256,32,128", "prefill:128,512,32,128:full", "decode:2,256,1,32,128"]


def smoke_mix() -> list[TuneShape]:
    """--cpu-smoke: one shape inside each bucket of ``smoke_tune_shapes``, and two outside every bucket."""
    return [TuneShape.prefill(100, 300, 32, 128), TuneShape.prefill(150, 600, 32, 128, "full"),
            TuneShape.decode(3, 300, 1, 32, 128),
            TuneShape.prefill(16, 2048, 32, 128), TuneShape.decode(1, 100, 1, 32, 128)]


def run_op(w: Workload, x: Any) -> torch.Tensor:
    if w.op == "fp8_paged_mqa_logits":
        return mqa_core.fp8_paged_mqa_logits(*x.args(), clean_logits=True)
    return mqa_core.fp8_mqa_logits(*x.args(), clean_logits=True)


def reference(w: Workload, x: Any, arch: str) -> torch.Tensor:
    if w.oracle_fits():
        return w.float64_reference(x)
    return w.run(provider_named("torch_ref", arch, op=w.op), x)


@contextmanager
def configured(env: dict[str, str | None], w: Workload, x: Any) -> Iterator[None]:
    """A configuration's MQA_* settings, its fresh state primed by one call (discovery, selection and
    the call-signature memo after the reload), so that the timed batch inside holds only steady calls."""
    with environment(**env):
        run_op(w, x)
        yield


def check(w: Workload, x: Any, ref: torch.Tensor, env: dict[str, str | None], device: torch.device,
          arch: str) -> tuple[str, str]:
    """(the provider the configuration picks, "ok" or what is wrong) for one call on ``x``."""
    with environment(**env):
        try:
            chosen = mqa_core.get_provider(arch, op=w.op, problem=w.problem).name
            out = run_op(w, x)
            sync(device)
            verdict = compare(out, ref, clean=True, against="reference")
            del out
        except Exception as exc:  # noqa: BLE001 - one failing config must not stop the others
            return "", f"ERROR {type(exc).__name__}: {str(exc)[:200]}"
    return chosen, "ok" if verdict.ok else f"WRONG ({chosen}): {verdict.detail}"


def measure(shape: TuneShape, configs: dict[str, dict[str, str | None]], device: torch.device, arch: str, *,
            warmup: int = WARMUP, rounds: int = ROUNDS, replay: str = "auto") -> dict[str, Any]:
    """Check every configuration on one shape, then time the correct ones interleaved in the same rounds."""
    w = shape.workload()
    sets = [w.setup(device, 1000 + j) for j in range(input_sets(w, device))]
    ref = reference(w, sets[0], arch)
    row: dict[str, Any] = {"shape": w.name, "op": w.op, "bucket": str(shape.bucket()), "ms": {}, "status": {},
                           "calls_per_round": {}}
    for label, env in configs.items():
        chosen, row["status"][label] = check(w, sets[0], ref, env, device, arch)
        if label == "tuned" and chosen:
            row["tuned_pick"] = chosen
    ok = [label for label, status in row["status"].items() if status == "ok"]
    graph = replayed(w.op, replay, device)
    row["timing"] = REPLAYED if graph else EAGER
    try:
        if graph:
            times = {}
            for label in ok:
                with configured(configs[label], w, sets[0]):
                    t, note = graph_time(functools.partial(run_op, w), sets, device)
                if t is None:
                    row["status"][label] = f"not capturable: {note}"
                else:
                    times[label] = t
        else:
            times = time_interleaved({label: functools.partial(run_op, w) for label in ok}, sets, device,
                                     warmup=warmup, rounds=rounds,
                                     scopes={label: functools.partial(configured, configs[label], w, sets[0])
                                             for label in ok}) if ok else {}
    except Exception as exc:  # noqa: BLE001 - the row says why it has no times
        row["status"].update(dict.fromkeys(ok, f"ERROR while timing: {type(exc).__name__}: {str(exc)[:200]}"))
        times = {}
    row["ms"] = {label: t.median for label, t in times.items()}
    row["calls_per_round"] = {label: t.calls for label, t in times.items()}
    del sets, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    singles = {k: v for k, v in row["ms"].items() if k != "tuned"}
    if "tuned" in row["ms"] and singles:
        best = min(singles, key=lambda k: singles[k])
        row["best_single"], row["tuned_vs_best"] = best, singles[best] / row["ms"]["tuned"]
        # The same comparison split in two, each within one protocol: the choice (the picked provider's
        # own "-only" column against the best one: 1.0 when the pick is the fastest) and the tuned
        # path's cost over running that provider (lookup plus noise between two columns of one kernel).
        pick = f"{row.get('tuned_pick')}-only"
        if pick in singles:
            row["pick_vs_best"] = singles[best] / singles[pick]
            row["tuned_vs_pick"] = singles[pick] / row["ms"]["tuned"]
    return row


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tune-budget", type=float, default=TUNE_BUDGET_S, help="seconds for mqa tune's shapes")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds from start after which no mix "
                    "shape is started")
    ap.add_argument("--cpu-smoke", action="store_true", help="every step on the CPU: tiny shapes, torch_ref "
                    "and example_chunked")
    ap.add_argument("--out", default=OUT, help="folder for the table and h200_tuned.json (default: $OUT)")
    ap.add_argument("--replay", choices=("auto", "all"), default="auto",
                    help="which shapes are timed by CUDA-graph replay, in mqa tune and in the mix: auto, decode "
                    "(as engines run it); all, prefill too (the device's time alone: what the choice of kernel "
                    "changes, without the host's noise on ~30 us eager calls)")
    args = ap.parse_args()
    replay = "auto" if args.cpu_smoke else args.replay
    smoke, out = args.cpu_smoke, args.out
    table = os.path.join(out, "h200_tuning.json")
    os.makedirs(out, exist_ok=True)
    device = torch.device("cpu" if smoke else "cuda")
    arch = "cpu" if smoke else mqa_core.detect_arch()
    device_name = "cpu" if smoke else torch.cuda.get_device_name()
    log(f"{device_name} ({arch}), torch {torch.__version__}")
    names, why = (["torch_ref", "example_chunked"], None) if smoke else (["gluon", "triton", "deepgemm"],
                                                                        deepgemm_status(arch))
    if why:
        log(f"NOTE: {why}. Comparing gluon and triton only.")
        names.remove("deepgemm")

    shapes_args = ["--shapes", *smoke_tune_shapes()] if smoke else ["--preset", "engine"]
    log(f"step 1: mqa tune {' '.join(shapes_args)} --providers {','.join(names)}")
    rc = mqa_main(["tune", "--device", device.type, *shapes_args, "--providers", ",".join(names),
                   "--out", table, "--warmup", "1" if smoke else "3", "--repeat", "3" if smoke else "15",
                   "--budget", str(args.tune_budget), "--replay", replay])
    log(f"mqa tune exit status {rc}; table {table}")
    if not os.path.exists(table):
        log("no table was written; stopping")
        return 1

    configs: dict[str, dict[str, str | None]] = {"tuned": {"MQA_TUNING": table, "MQA_PROVIDER": None}}
    configs.update({f"{n}-only": {"MQA_PROVIDER": n, "MQA_TUNING": None} for n in names})
    rows = []
    shapes = smoke_mix() if smoke else mix()
    warmup, rounds = (1, 3) if smoke else (WARMUP, ROUNDS)
    log(f"step 2: {len(shapes)} mix shapes x {len(configs)} configurations, checked then timed interleaved")
    for i, shape in enumerate(shapes, 1):
        if time.time() - T0 > args.budget:
            log(f"time budget reached: {len(shapes) - i + 1} mix shapes not started")
            break
        try:
            row = measure(shape, configs, device, arch, warmup=warmup, rounds=rounds, replay=replay)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            continue
        rows.append(row)
        ms = ", ".join(f"{k} {v:.4f}" for k, v in row["ms"].items())
        bad = {k: v for k, v in row["status"].items() if v != "ok"}
        log(f"[{i}/{len(shapes)}] {row['shape']}: pick {row.get('tuned_pick', '-')}; {ms}"
            + (f"; {bad}" if bad else ""))

    ratios = [r["tuned_vs_best"] for r in rows if "tuned_vs_best" in r]
    summary = {
        "device": device_name, "arch": arch, "torch": torch.__version__, "providers": names, "smoke": smoke,
        "deepgemm_absent": why, "table": table, "tune_exit_status": rc,
        "replay": replay,
        "timing": (f"prefill interleaved: {rounds} rounds, each a >= 1 ms batch of back-to-back calls per "
                   "configuration; decode on CUDA by CUDA-graph replay per configuration (row 'timing')")
        if replay == "auto" else "every shape by CUDA-graph replay per configuration (row 'timing')",
        "tuned_vs_best_geomean": geomean(ratios), "tuned_vs_best_worst": min(ratios) if ratios else None,
        # Within 3%: the medians of two configurations running the same kernel differ by about that.
        "tuned_at_least_best_everywhere_within_3pct": bool(ratios) and min(ratios) >= 0.97,
        "pick_vs_best_geomean": geomean(picks := [r["pick_vs_best"] for r in rows if "pick_vs_best" in r]),
        "pick_vs_best_worst": min(picks) if picks else None,
        "tuned_vs_pick_geomean": geomean([r["tuned_vs_pick"] for r in rows if "tuned_vs_pick" in r]),
        **{f"tuned_vs_{n}_only_geomean": geomean([r["ms"][f"{n}-only"] / r["ms"]["tuned"] for r in rows
                                                  if f"{n}-only" in r["ms"] and "tuned" in r["ms"]])
           for n in names},
        "rows": rows,
    }
    with open(os.path.join(out, "h200_tuned.json"), "w") as f:
        json.dump(summary, f, indent=1)

    cols = ["tuned", *[f"{n}-only" for n in names]]
    width = max(13, *(len(c) for c in cols))
    print("\nshape                                         pick      "
          + "  ".join(f"{c:>{width}}" for c in cols) + "  tuned/best  pick/best")
    for r in rows:
        cells = "  ".join(f"{r['ms'][c]:{width}.4f}" if c in r["ms"]
                          else f"{r['status'].get(c, '-')[:width]:>{width}}" for c in cols)
        ratio = f"{r['tuned_vs_best']:.2f}x" if "tuned_vs_best" in r else "-"
        pick = f"{r['pick_vs_best']:.2f}x" if "pick_vs_best" in r else "-"
        print(f"{r['shape'][:45]:45} {r.get('tuned_pick', '-'):9} {cells}  {ratio:>10}  {pick:>9}")
    g, worst = summary["tuned_vs_best_geomean"], summary["tuned_vs_best_worst"]
    print(f"tuned vs the best single provider per shape (ms ratio best/tuned, > 1 = tuned faster): geomean "
          f"{g:.3f}x, worst {worst:.3f}x over {len(ratios)} shapes" if ratios else "no shape was timed")
    if picks:
        print(f"the choice alone (the picked provider's -only column against the best -only column, same "
              f"protocol): geomean {summary['pick_vs_best_geomean']:.3f}x, worst {summary['pick_vs_best_worst']:.3f}x; "
              f"the tuned path against its pick's -only column: geomean {summary['tuned_vs_pick_geomean']:.3f}x")
    for n in names:
        v = summary[f"tuned_vs_{n}_only_geomean"]
        print(f"tuned vs {n}-only: geomean {v:.3f}x" if v else f"tuned vs {n}-only: -")
    print(f"JSON: {os.path.join(out, 'h200_tuned.json')}; table: {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
