"""``mqa bench``: A/B the providers usable here over a preset of shapes, correctness first.

Prints which provider serves this machine and why (the ``mqa explain`` table), then checks every
provider's output on every workload against a reference, times the correct ones (progress on
stderr), and prints one row per provider and workload plus geomeans; on a GPU each row also shows the
memory its checked call held at its peak beyond the inputs (``peak MiB``, the output included).
``--json`` appends the rows to a JSON Lines file; ``--plot`` draws them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import UserError, device_or_default, providers_for, refuse_named, shape_arg, timed_calls, writable_path

EPILOG = """presets:
  quick    causal and full prefill, M=256 N=1024 H=32 D=128 (seconds on a CPU)
  prefill  H=32,64 D=128: the last 4k of 16k tokens causal, 8k causal, the last 16k of 48k
           (ks=0, ke=32768+m+1), and 4k x 16k with full windows
  decode   paged: batch 1/32/128 x context 1k/8k/32k x next_n 1/2, H=32,64, D=128
  engine   what engines send in prefill, D=128, H=64 (DeepSeek-V3.2) and 32 (GLM-5): small chunks
           (128x2k .. 1kx8k), a 1k-token prompt, packed batches of 8 and 32 prompts and of 4
           requests with cached prefixes (each row sees only its request's keys), the last chunk of
           long prompts (256x64k, 4kx32k, 1kx128k), sliding windows (W=2048, 512), 8kx8k and 4kx16k;
           then the host's us per call (API, Provider, kernel object) on 128x2k, H=64. On a GPU also
           CUDA-graph replay (the device's time alone). On a CPU, add --scale 64.

columns: median ms of the whole call, TFLOP/s (2*H*D per in-window pair), % of the device's fp8 peak;
  with --graph the same from CUDA-graph replay; on a GPU, peak MiB (the checked call's peak memory
  beyond its inputs, the output included); with --baseline, the speedup against that provider.

examples:
  mqa bench                                   # quick preset, every provider usable here
  mqa bench --preset engine --providers gluon,triton,deepgemm   # side by side with DeepGEMM (GPU)
  mqa bench --preset prefill --baseline gluon --json bench/h200.jsonl --plot bench/h200.png
  mqa bench --providers gluon,triton --shape 4096,16384,64,128
  mqa bench --providers gluon,triton --timing interleaved --shape 128,2048,64,128   # small shapes
  mqa bench --preset engine --providers torch_ref --scale 64   # the engine preset, CPU-sized
  mqa bench --preset decode --topk 2048 --providers composed,gluon   # the indexer step, with peak MiB"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark providers over a preset of shapes, correctness first",
                       description="Check, then time, every provider usable on the device (or the ones "
                                   "named) over a preset of shapes. Exit status 1 when a provider "
                                   "computes a wrong result or crashes.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--providers", metavar="A,B", help="providers to compare (default: all usable here)")
    p.add_argument("--preset", choices=("quick", "prefill", "decode", "engine"),
                   help="the workloads (default: quick, unless --shape is given)")
    p.add_argument("--scale", type=int, default=1, metavar="F",
                   help="divide every token count of the preset (M, N, request lengths, windows, "
                        "contexts; the host-cost shape too) by F, rounded up: the same structure at a "
                        "size a CPU runs in seconds (default: 1)")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="also time each provider replaying a CUDA graph of its calls (GPU only; "
                        "default: on for the engine preset)")
    p.add_argument("--host-cost", action=argparse.BooleanOptionalAction, default=None, dest="host_cost",
                   help="measure host us per call (API, Provider, kernel object) on 128x2k H=64 "
                        "(default: on for the engine preset)")
    p.add_argument("--host-calls", type=int, default=None, metavar="N", dest="host_calls",
                   help="calls back to back per host-cost round (default: 200 on GPU, 20 on CPU)")
    p.add_argument("--shape", action="append", default=[], type=shape_arg, metavar="M,N,H,D",
                   help="a causal prefill workload (repeatable; added to --preset)")
    p.add_argument("--topk", type=int, default=0, metavar="K",
                   help="bench the indexer step instead: each workload's top-k op (fp8_mqa_topk, "
                        "fp8_paged_mqa_topk) selecting K keys a row, checked as a selection over the "
                        "reference logits; peak_mib shows what it holds beyond inputs and output")
    p.add_argument("--clean", action=argparse.BooleanOptionalAction, default=True,
                   help="clean_logits: -inf outside the windows (default: on)")
    p.add_argument("--baseline", metavar="NAME", help="show speedups against this provider")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed calls, or rounds with --timing interleaved (default: 30 on GPU, 5 on CPU)")
    p.add_argument("--timing", choices=("per-call", "interleaved"), default="per-call",
                   help="per-call: CUDA events around each call, one provider after another (default); "
                        "interleaved: per round, a >= 1 ms batch of back-to-back calls per provider, the "
                        "providers in turn (what an engine sees; use it to compare small shapes). Rows name it")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls first (default: 5 on GPU, 1 on CPU)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per provider x workload to FILE")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw TFLOP/s per workload and provider (needs matplotlib; without it and with "
                        "--json, skipped with a warning)")
    p.add_argument("--from-json", metavar="FILE", dest="from_json",
                   help="run nothing: print the table (and --plot) from rows an earlier --json saved")


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _plot_possible(args: argparse.Namespace) -> bool:
    """Whether --plot can be drawn; without matplotlib, fail now rather than after the run, unless
    --json keeps the rows (then warn: the plot can be drawn later with --from-json)."""
    if not args.plot:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        hint = "pip install 'mqa-core[plot]' (or pip install matplotlib)"
        if args.json and not args.from_json:
            _progress(f"mqa bench: --plot skipped, matplotlib is not installed ({hint}); draw it later "
                      f"with: mqa bench --from-json {args.json} --plot {args.plot}")
            return False
        raise UserError(f"--plot needs matplotlib: {hint}") from None
    return True


def _render(rows: list[dict[str, Any]], names: list[str], baseline: str | None, plot_path: str | None,
            title: str) -> None:
    from ..bench import report
    from ..bench.plot import PlotUnavailable, plot

    report.add_speedups(rows, baseline)
    print(report.table(rows, names, baseline))
    if report.host(rows):
        print()
        print(report.host_table(rows))
    if plot_path:
        workloads = list(dict.fromkeys((r["workload"], r.get("label") or r["workload"])
                                       for r in report.timed(rows)))
        try:
            plot(rows, workloads, names, plot_path, title)
        except PlotUnavailable as exc:
            raise UserError(str(exc)) from None
        print(f"wrote {plot_path}")


def _replay(args: argparse.Namespace) -> int:
    from ..bench import report

    try:
        rows = report.read_jsonl(args.from_json)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read benchmark rows from {args.from_json}: {exc}") from None
    if not rows:
        raise UserError(f"{args.from_json} holds no rows")
    names = list(dict.fromkeys(r["provider"] for r in rows))
    if args.providers:
        keep = [n.strip() for n in args.providers.split(",") if n.strip()]
        rows = [r for r in rows if r["provider"] in keep]
        names = [n for n in keep if n in names]
    first = rows[0]
    where = f"{first.get('device_name', '?')} ({first.get('arch', '?')})"
    print(f"fp8 MQA logits on {where}, from {args.from_json} ({first.get('date', '?')}, "
          f"commit {first.get('commit') or 'unknown'})")
    _render(rows, names, args.baseline, args.plot, f"fp8 MQA logits on {where}: TFLOP/s, higher is better")
    return 0


def run(args: argparse.Namespace) -> int:
    if not _plot_possible(args):
        args.plot = None
    if args.from_json:
        if args.plot:
            writable_path("--plot", args.plot)
        return _replay(args)

    from ..api import explain
    from ..arch import arch_of_device
    from ..bench import report
    from ..bench import workloads as wl
    from ..bench.runner import run_workloads
    from ..testing.providers import usable_providers

    if args.scale < 1 or (args.host_calls is not None and args.host_calls < 1):
        raise UserError(f"--scale and --host-calls must be >= 1, got {args.scale} and {args.host_calls}")
    if args.topk < 0:
        raise UserError(f"--topk must be >= 1 (or 0: the logits ops), got {args.topk}")
    device = device_or_default(args.device)
    arch = arch_of_device(device)
    gpu = device.type != "cpu"
    warmup, repeat = timed_calls(args, gpu, gpu_repeat=30)
    preset = args.preset or ("quick" if not args.shape else None)
    work = [w.scaled(args.scale) for w in wl.PRESETS[preset](args.clean)] if preset else []
    work += [wl.shape_workload(s, args.clean) for s in args.shape]
    if args.topk:
        work = [w.with_topk(args.topk) for w in work]
    engine = preset == "engine"
    graph = gpu and (engine if args.graph is None else args.graph)
    host_cost = (engine and not args.topk) if args.host_cost is None else args.host_cost
    if engine and not gpu and args.scale == 1:
        _progress("mqa bench: the engine preset at full size takes long on a CPU; --scale 64 keeps its "
                  "structure at a size that runs in seconds")
    ops = list(dict.fromkeys(w.op for w in work))
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            writable_path(option, path)
    names = ([n.strip() for n in args.providers.split(",") if n.strip()] if args.providers
             else usable_providers(arch, ops))
    if args.baseline and args.baseline not in names:
        names.append(args.baseline)
    if not names:
        raise UserError(f"no provider is usable on {device} ({arch}) for {', '.join(ops)} (`mqa explain` says why)")
    refuse_named(names, arch, ops)  # one line, exit 2 or 3, before any table or measurement

    for op in ops:  # which provider serves this machine, and why, before any number
        print(explain(arch, op=op), end="\n\n", flush=True)
    providers = providers_for(names, ops, device, arch)

    name_of_device = report.device_name(device)
    peak = report.fp8_peak(name_of_device)
    common = {"device": str(device), "device_name": name_of_device, "arch": arch,
              "versions": report.versions(list({p.name: p for p in providers.values()}.values())),
              "commit": report.git_commit(), "date": report.now()}
    _progress(f"mqa bench: {len(work)} workloads x {len(names)} providers ({', '.join(names)}) on "
              f"{name_of_device}; fp8 peak {'unknown' if peak is None else f'{peak:.0f} TFLOP/s'}; "
              f"{warmup} warm-up + {repeat} timed calls each, correctness checked first")
    rows = run_workloads(work, names, providers, device, arch, warmup=warmup, repeat=repeat,
                         seed=args.seed, peak=peak, common=common, graph=graph, timing=args.timing,
                         progress=_progress)
    if host_cost:
        from ..bench.host import host_rows

        hw = wl.host_cost_workload(args.clean, args.scale)
        rows += host_rows(hw, [n for n in names if (n, hw.op) in providers], providers, device, arch,
                          calls=args.host_calls or (200 if gpu else 20), rounds=5 if gpu else 3,
                          seed=args.seed, common=common, progress=_progress)
    method = (f"{repeat} calls" if args.timing == "per-call"
              else f"{repeat} interleaved rounds of >= 1 ms batches of back-to-back calls")
    what = f"the indexer step (top-k {args.topk})" if args.topk else "fp8 MQA logits"
    print(f"{what} on {name_of_device} ({arch}): median of {method} after {warmup} warm-up, "
          f"inputs rotated; TFLOP/s counts 2*H*D per in-window pair"
          + ("; graph = CUDA-graph replay, the device's time alone" if graph else ""))
    report.add_speedups(rows, args.baseline)
    if args.json:
        report.append_jsonl(args.json, rows)
    _render(rows, names, args.baseline, args.plot,
            f"{what} on {name_of_device} ({arch}): TFLOP/s, higher is better")
    if args.json:
        print(f"appended {len(rows)} rows to {args.json}")
    bad = [r for r in rows if r["status"] in ("wrong", "error")]
    if bad:
        print(f"mqa bench: {len(bad)} result(s) wrong or crashed: "
              + "; ".join(f"{r['provider']} on {r['workload']}: {r['reason']}" for r in bad), file=sys.stderr)
    return 1 if bad else 0
