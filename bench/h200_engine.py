"""Issue 14 on one H200, in one process (about 3-4 min): the engine preset and the host's cost per call,
side by side with DeepGEMM.

    PYTHONPATH=.deepgemm:providers/gluon:providers/torch_ref:providers/flydsl:. python bench/h200_engine.py
    python bench/h200_engine.py --cpu-smoke     # the same code path on a CPU: torch_ref, tiny shapes

The user-facing equivalent, with DeepGEMM through its provider (whose adapter adds a few small
launches per call): ``mqa bench --preset engine --providers gluon,triton,deepgemm``.

1. Host cost (issue 14's table) on M=128 N=2048 H=64 D=128, clean_logits=True: host us per call (N
   calls back to back without a sync / N, median of interleaved rounds) for ``mqa_core.fp8_mqa_logits``,
   ``Provider.fp8_mqa_logits``, the kernel object alone (``provider.impl``), ``torch.ops.mqa.
   fp8_mqa_logits`` eager and inside ``torch.compile(fullgraph=True)``; columns gluon, triton and
   DeepGEMM's whole call. Every cell's result is checked first. The device's time per call (CUDA-graph
   replay) is printed beside it: where it is below the host figures, the GPU kept up and the host was
   what got timed.
2. The engine preset (``mqa_core.bench.workloads.engine_preset``): inputs built once per workload (a
   few sets, rotated), each column checked against the oracle (calc_diff < 1e-3 on in-window cells and
   the identical -inf mask; DeepGEMM with clean_logits=True), then the whole call timed with
   ``triton.testing.do_bench`` (median; it flushes L2 before each call) and in CUDA-graph replay
   (``do_bench_cudagraph``, inputs rotated inside the graph). Our providers are called through
   ``mqa_core.fp8_mqa_logits`` under ``MQA_PROVIDER=name``, as an engine calls them.

DeepGEMM is the legacy ``deep_gemm.fp8_mqa_logits(q, (k, k_scale[N]), weights, ks, ke, clean_logits,
max_seqlen_k=0)``; when it does not import, its columns stay empty and the reason is printed.
Two short tables come last; one JSON row per (provider, workload) and per (provider, host level) goes
to ``$OUT/engine.jsonl`` (``mqa bench --from-json`` prints the timed rows again). New workloads stop
being started after ``--budget`` seconds so the tables always come out.

``--cpu-smoke`` runs every step on the CPU with torch_ref at 1/64 of the sizes, perf_counter instead
of CUDA events and no graphs, and a stand-in for DeepGEMM that enforces DeepGEMM's argument checks
and returns its row layout but computes with torch_ref: a typo cannot waste a device run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the checkout

import mqa_core  # noqa: E402
from mqa_core.arch import arch_of_device  # noqa: E402
from mqa_core.bench import report  # noqa: E402
from mqa_core.bench import workloads as wl  # noqa: E402
from mqa_core.bench.host import HostCost, host_costs  # noqa: E402
from mqa_core.bench.runner import reference  # noqa: E402
from mqa_core.bench.timing import host_syncs, rotating  # noqa: E402
from mqa_core.bench.verify import compare  # noqa: E402
from mqa_core.provider import Provider  # noqa: E402
from mqa_core.testing.data import Inputs  # noqa: E402
from mqa_core.testing.providers import environment, installed_names, provider_named  # noqa: E402

DG = "DeepGEMM"
#: Host-cost rows of issue 14's table, in its order.
LEVELS = {"api": "mqa_core.fp8_mqa_logits", "provider": "Provider.fp8_mqa_logits",
          "kernel": "the kernel object alone", "torch_op": "torch.ops.mqa.fp8_mqa_logits, eager",
          "compiled": "the same in torch.compile(fullgraph=True)"}
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# -- DeepGEMM ----------------------------------------------------------------------------------------

def load_deepgemm(smoke: bool) -> tuple[Any, str]:
    """(module or None, a line saying what is used)."""
    if smoke:
        return StandInDeepGemm(), ("DeepGEMM: a CPU stand-in (DeepGEMM's argument checks and row layout, "
                                   "torch_ref's numbers)")
    try:
        import deep_gemm
    except Exception as exc:  # ImportError, or a build that fails to load its extension
        return None, (f"DeepGEMM: not importable ({type(exc).__name__}: {str(exc)[:200]}); its columns stay "
                      f"empty. Build it on the device and put it first on PYTHONPATH (.deepgemm)")
    if not hasattr(deep_gemm, "fp8_mqa_logits"):
        return None, f"DeepGEMM at {deep_gemm.__file__} has no fp8_mqa_logits (built without sm_90 support?)"
    return deep_gemm, f"DeepGEMM: {deep_gemm.__file__} ({getattr(deep_gemm, '__version__', 'no version')})"


class StandInDeepGemm:
    """Only for --cpu-smoke (DeepGEMM needs a CUDA device): the legacy call's signature, the host
    asserts DeepGEMM makes on sm_90 (csrc/apis/attention.hpp), and its output, a [M, N] view of rows
    ``align(N + 256, 256)`` floats long; the numbers come from torch_ref."""

    def __init__(self) -> None:
        self._ref = provider_named("torch_ref", "cpu").impl

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
                       clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
        k, k_scale = kv
        m, h, d = q.shape
        checks = {"H in (32, 64)": h in (32, 64), "D in (32, 64, 128)": d in (32, 64, 128),
                  "q contiguous e4m3fn": q.is_contiguous() and q.dtype == torch.float8_e4m3fn,
                  "k [N, D] contiguous e4m3fn": k.shape[1:] == (d,) and k.is_contiguous()
                  and k.dtype == torch.float8_e4m3fn,
                  "k_scale [N] contiguous float32": tuple(k_scale.shape) == (k.shape[0],)
                  and k_scale.is_contiguous() and k_scale.dtype == torch.float32,
                  "weights [M, H] float32, stride(1) == 1": tuple(weights.shape) == (m, h)
                  and weights.stride(1) == 1 and weights.dtype == torch.float32,
                  "ks, ke [M] contiguous int32": all(t.shape == (m,) and t.is_contiguous() and t.dtype == torch.int32
                                                     for t in (cu_seq_len_k_start, cu_seq_len_k_end)),
                  "max_seqlen_k == 0": max_seqlen_k == 0}
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            raise RuntimeError(f"DeepGEMM would assert: {', '.join(failed)}")
        n = k.shape[0]
        out = torch.empty(m, (n + 256 + 255) // 256 * 256, dtype=torch.float32)[:, :n]
        out.copy_(self._ref.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                           clean_logits=clean_logits))
        return out


def deepgemm_call(dg: Any) -> Callable[[Inputs], torch.Tensor]:
    f = dg.fp8_mqa_logits
    return lambda x: f(x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke, True, 0)


# -- clocks ------------------------------------------------------------------------------------------

class Clock:
    """Whole-call time (do_bench median; L2 flushed before each call) and CUDA-graph replay time."""

    gpu = True

    def whole_call(self, fn: Callable[[], Any]) -> dict[str, float]:
        from triton.testing import do_bench

        p50, p10, p90, lo = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.1, 0.9, 0.0])
        return {"ms_median": p50, "ms_p10": p10, "ms_p90": p90, "ms_min": lo}

    def graph(self, fn: Callable[[], Any]) -> tuple[float | None, str]:
        """(median ms per call replaying a CUDA graph of calls, "") or (None, why not): a failed
        capture costs the graph figure only."""
        from triton.testing import do_bench_cudagraph

        why = host_syncs(fn)
        if why:
            return None, f"not captured: {why}"
        try:
            return float(do_bench_cudagraph(fn, rep=20, return_mode="median")), ""
        except Exception as exc:
            traceback.print_exc()
            return None, f"CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:200]}"

    def wait(self) -> None:
        torch.cuda.synchronize()


class CpuClock(Clock):
    """--cpu-smoke: perf_counter medians, no graphs."""

    gpu = False

    def whole_call(self, fn: Callable[[], Any]) -> dict[str, float]:
        fn()
        samples = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
        return {"ms_median": statistics.median(samples), "ms_p10": min(samples), "ms_p90": max(samples),
                "ms_min": min(samples)}

    def graph(self, fn: Callable[[], Any]) -> tuple[float | None, str]:
        return None, "no CUDA graphs on the CPU"

    def wait(self) -> None:
        pass


# -- the columns -------------------------------------------------------------------------------------

def api_call() -> Callable[[Inputs], torch.Tensor]:
    """``mqa_core.fp8_mqa_logits``: the provider is whatever MQA_PROVIDER makes the selection pick."""
    f = mqa_core.fp8_mqa_logits
    return lambda x: f(*x.args(), clean_logits=True)


def forced(name: str) -> Any:
    """``MQA_PROVIDER=name`` for our providers; nothing to set for DeepGEMM."""
    return nullcontext() if name == DG else environment(MQA_PROVIDER=name)


def chosen_ok(name: str, arch: str, w: wl.Workload) -> None:
    """Under MQA_PROVIDER=name the API must pick name; fail loudly otherwise."""
    got = mqa_core.get_provider(arch, problem=w.problem).name
    if got != name:
        raise RuntimeError(f"mqa_core chose {got} under MQA_PROVIDER={name}")


# -- 1. host cost ------------------------------------------------------------------------------------

def host_table_rows(names: Sequence[str], providers: dict[str, Provider], dg: Any, device: torch.device,
                    arch: str, clock: Clock, scale: int, calls: int, rounds: int,
                    common: dict[str, Any]) -> list[dict[str, Any]]:
    import mqa_core.torch_ops  # noqa: F401  (registers torch.ops.mqa.*)

    w = wl.host_cost_workload(True, scale)
    x = w.setup(device, 1234)
    ref, against = reference(w, x, {}, arch)
    args, op = x.args(), torch.ops.mqa.fp8_mqa_logits
    flat = (x.q, x.k, x.k_scale, x.weights, x.ks, x.ke)  # the op's schema has no tuples

    def eager() -> torch.Tensor:
        return op(*flat, clean_logits=True)

    compiled_op = torch.compile(lambda q, k, s, wt, a, b: op(q, k, s, wt, a, b, clean_logits=True), fullgraph=True)
    rows = []
    for name in [*names, DG]:
        row: dict[str, Any] = {"record": "host", "provider": name, "workload": w.name, "label": w.label,
                               "kind": w.kind, "m": w.problem.m, "n": w.problem.n, "h": w.problem.h,
                               "d": w.problem.d, "clean": True, "calls": calls, "rounds": rounds, **common}
        rows.append(row)
        if name == DG:
            if dg is None:
                row.update(status="skipped", reason="DeepGEMM is not importable")
                continue
            dg_fn = deepgemm_call(dg)
            fns: dict[str, Callable[[], Any]] = {"api": lambda: dg_fn(x)}
        else:
            p = providers[name]
            api_fn, provider_fn, kernel_fn = mqa_core.fp8_mqa_logits, p.fp8_mqa_logits, p.impl.fp8_mqa_logits
            fns = {"api": lambda: api_fn(*args, clean_logits=True),
                   "provider": lambda: provider_fn(*args, clean_logits=True),
                   "kernel": lambda: kernel_fn(*args, clean_logits=True), "torch_op": eager,
                   "compiled": lambda: compiled_op(*flat)}
        try:
            with forced(name):
                if name != DG:
                    chosen_ok(name, arch, w)
                t = time.time()
                for level, fn in fns.items():  # first calls also compile (Triton, DeepGEMM's JIT, dynamo)
                    verdict = compare(fn(), ref, clean=True, against=against) if ref is not None else None
                    if verdict is not None and not verdict.ok:
                        raise AssertionError(f"{LEVELS[level]} is wrong: {verdict.detail}")
                log(f"host cost {name}: {len(fns)} paths checked against the {against} ({time.time() - t:.1f}s "
                    f"with compilation)")
                costs: dict[str, HostCost] = host_costs(fns, clock.wait, calls=calls, rounds=rounds)
                kernel = fns.get("kernel", fns["api"])
                device_ms, note = clock.graph(kernel)
        except Exception as exc:
            row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            log(f"host cost {name}: ERROR {row['reason']}")
            traceback.print_exc()
            continue
        row.update(status="ok", device_us=None if device_ms is None else device_ms * 1e3, device_note=note or None)
        for level, cost in costs.items():
            row.update({f"host_us_{level}": cost.median, f"host_us_{level}_min": min(cost.host_us),
                        f"wall_us_{level}": cost.wall_median})
        row["gpu_kept_up"] = (None if device_ms is None
                              else all(device_ms * 1e3 < c.median for c in costs.values()))
        log(f"host cost {name}: " + ", ".join(f"{lv} {c.median:.1f} us" for lv, c in costs.items())
            + ("" if device_ms is None else f"; device {device_ms * 1e3:.1f} us per call (graph replay)"))
    return rows


# -- 2. the engine preset ----------------------------------------------------------------------------

def preset_rows(names: Sequence[str], dg: Any, device: torch.device, arch: str, clock: Clock, scale: int,
                budget_s: float, common: dict[str, Any]) -> list[dict[str, Any]]:
    work = [w.scaled(scale) for w in wl.engine_preset(True)]
    peak = report.fp8_peak(common["device_name"])
    rows = []
    for i, w in enumerate(work, 1):
        tag = f"[{i}/{len(work)}] {w.name}"
        base = {"record": "time", "workload": w.name, "label": w.label, "op": w.op, "kind": w.kind,
                "m": w.problem.m, "n": w.problem.n, "h": w.problem.h, "d": w.problem.d, "clean": True,
                "requests": len(w.requests) or None, "window": w.window or None, **common}
        if time.time() - T0 > budget_s:
            rows += [{**base, "provider": n, "status": "skipped", "reason": f"time budget ({budget_s:.0f}s) spent"}
                     for n in [*names, DG]]
            log(f"{tag}: skipped, time budget spent")
            continue
        t = time.time()
        sets = [w.setup(device, 100 * i + j) for j in range(wl.input_sets(w, device))]
        ref, against = reference(w, sets[0], {}, arch)
        pairs, flops = w.valid_pairs(sets[0]), w.flops(sets[0])
        log(f"{tag}: {len(sets)} input sets, reference ({against}) in {time.time() - t:.1f}s")
        for name in [*names, DG]:
            row: dict[str, Any] = {**base, "provider": name, "valid_pairs": pairs, "flops": flops,
                                   "input_sets": len(sets)}
            rows.append(row)
            if name == DG and dg is None:
                row.update(status="skipped", reason="DeepGEMM is not importable")
                continue
            call = deepgemm_call(dg) if name == DG else api_call()
            try:
                with forced(name):
                    if name != DG:
                        chosen_ok(name, arch, w)
                    out = call(sets[0])
                    clock.wait()
                    verdict = compare(out, ref, clean=True, against=against) if ref is not None else None
                    del out
                    if verdict is not None and not verdict.ok:
                        row.update(status="wrong", reason=verdict.detail, calc_diff=verdict.calc_diff)
                        log(f"{tag} {name}: WRONG vs {against}: {verdict.detail}")
                        continue
                    timing = clock.whole_call(rotating(call, sets))
                    graph_ms, note = clock.graph(rotating(call, sets))
            except Exception as exc:  # reported; the other columns still run
                row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
                log(f"{tag} {name}: ERROR {row['reason']}")
                traceback.print_exc()
                continue
            tflops = flops / (timing["ms_median"] * 1e-3) / 1e12
            row.update(status="ok", calc_diff=None if verdict is None else verdict.calc_diff,
                       verified_against=against or "none", tflops=tflops, **timing,
                       pct_peak=None if peak is None else 100 * tflops / peak, graph_ms=graph_ms,
                       graph_tflops=None if graph_ms is None else flops / (graph_ms * 1e-3) / 1e12,
                       graph_note=note or None)
            diff = "unchecked" if verdict is None else f"calc_diff {verdict.calc_diff:.1e}"
            log(f"{tag} {name}: ok ({diff}), {timing['ms_median']:.3f} ms, {report.tflops_text(tflops)} TF/s"
                + ("" if graph_ms is None else f"; graph {graph_ms:.3f} ms"))
        del sets, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# -- 3. the tables -----------------------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _num(v: float | None) -> str:
    return "-" if v is None else report.tflops_text(v)


def preset_table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    ok = {(r["provider"], r["workload"]): r for r in rows if r["status"] == "ok"}
    cols = [*names, DG]
    head = ["workload", *(f"{n} TF/s" for n in cols), *(f"{n}/DG" for n in names),
            *(f"{n}/DG graph" for n in names)]
    lines: list[list[str]] = [head]
    for w in dict.fromkeys(r["workload"] for r in rows):
        tf = {n: ok[(n, w)]["tflops"] if (n, w) in ok else None for n in cols}
        gtf = {n: ok[(n, w)].get("graph_tflops") if (n, w) in ok else None for n in cols}
        bad = [f"{r['provider']} {r['status'].upper()}" for r in rows
               if r["workload"] == w and r["status"] in ("wrong", "error")]
        lines.append([w + (f"  ({', '.join(bad)})" if bad else ""), *(_num(tf[n]) for n in cols),
                      *(_ratio(tf[n], tf[DG]) for n in names), *(_ratio(gtf[n], gtf[DG]) for n in names)])
    geo = {n: report.geomean([r["tflops"] for (p, _), r in ok.items() if p == n]) for n in cols}
    lines.append(["geomean", *(_num(geo[n]) for n in cols), *([""] * (2 * len(names)))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(wd) if j == 0 else c.rjust(wd) for j, (c, wd) in enumerate(zip(line, widths)))
                     for line in lines)


def host_cost_table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    by = {r["provider"]: r for r in rows}
    cols = [*names, DG]
    lines = [["path", *cols]]
    for level, title in LEVELS.items():
        cells = []
        for n in cols:
            r = by.get(n, {})
            v = r.get(f"host_us_{level}") if r.get("status") == "ok" else None
            cells.append(f"{v:.1f}" if v is not None else ("" if n == DG and level != "api" else r.get("status", "-")))
        lines.append([title + (" (DeepGEMM: its whole call)" if level == "api" else ""), *cells])
    dev = [f"{n} {by[n]['device_us']:.1f}" for n in cols
           if by.get(n, {}).get("status") == "ok" and by[n].get("device_us") is not None]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    text = "\n".join("  ".join(str(c).ljust(wd) if j == 0 else str(c).rjust(wd)
                               for j, (c, wd) in enumerate(zip(line, widths))) for line in lines)
    dg_api = by.get(DG, {}).get("host_us_api")
    ratios = [f"{n} {by[n]['host_us_api'] / dg_api:.2f}x" for n in names
              if dg_api and by.get(n, {}).get("status") == "ok"]
    kept = [n for n in cols if by.get(n, {}).get("gpu_kept_up") is False]
    text += ("\ndevice us per call (CUDA-graph replay): " + (", ".join(dev) if dev else "not measured here")
             + ("" if not dev else ("; the GPU did NOT keep up for " + ", ".join(kept) if kept
                                    else "; below every host figure: the GPU kept up")))
    if ratios:
        text += "\nAPI call / DeepGEMM's call: " + ", ".join(ratios) + " (issue 14's goal: <= 1.2x)"
    return text


# -- main ----------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--cpu-smoke", action="store_true", help="run every step on the CPU: torch_ref, 1/64 sizes")
    ap.add_argument("--providers", help="our columns (default: gluon,triton; with --cpu-smoke: torch_ref)")
    ap.add_argument("--budget", type=float, default=210.0,
                    help="seconds after which no new preset workload starts (default: 210)")
    ap.add_argument("--host-calls", type=int, default=None, help="calls per host-cost round (default 200; smoke 10)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for engine.jsonl (default: $OUT)")
    ap.add_argument("--commit", help="the commit to record when this copy of the repository has no .git")
    args = ap.parse_args(argv)

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("h200_engine.py: no CUDA device; use --cpu-smoke to check the script on a CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if smoke else "cuda")
    arch = arch_of_device(device)
    clock: Clock = CpuClock() if smoke else Clock()
    scale, calls, rounds = (64, args.host_calls or 10, 2) if smoke else (1, args.host_calls or 200, 5)
    names = [n.strip() for n in (args.providers or ("torch_ref" if smoke else "gluon,triton")).split(",") if n.strip()]
    missing = [n for n in names if n not in installed_names()]
    if missing:
        print(f"h200_engine.py: provider(s) {', '.join(missing)} not discovered (found: "
              f"{', '.join(installed_names()) or 'none'}); entry points need an install: pip install "
              f"--no-deps -e . -e providers/torch_ref -e providers/gluon (bench/h200_run.sh does it)",
              file=sys.stderr)
        return 2
    providers = {n: provider_named(n, arch) for n in names}  # fails loudly, with the trace, if one cannot serve
    dg, dg_line = load_deepgemm(smoke)
    name_of_device = report.device_name(device)
    versions = report.versions(list(providers.values()))
    versions["deep_gemm"] = None if dg is None else getattr(dg, "__version__", "stand-in" if smoke else "unknown")
    common = {"device": str(device), "device_name": name_of_device, "arch": arch, "versions": versions,
              "commit": args.commit or report.git_commit(), "date": report.now(), "script": "bench/h200_engine.py",
              "smoke": smoke}
    log(f"{name_of_device} ({arch}); torch {torch.__version__}, triton {versions['triton']}; "
        f"columns {', '.join(names)}, {DG}; commit {common['commit']}")
    log(dg_line)
    host = host_table_rows(names, providers, dg, device, arch, clock, scale, calls, rounds, common)
    timed = preset_rows(names, dg, device, arch, clock, scale, args.budget, common)

    if args.out:
        path = os.path.join(args.out, "engine.jsonl")
        report.append_jsonl(path, timed + host)
        log(f"wrote {len(timed) + len(host)} rows to {path}")
    print()
    print(f"engine preset{' (CPU smoke, 1/64 sizes)' if smoke else ''} on {name_of_device}: TF/s of the whole "
          f"call ({'do_bench median' if clock.gpu else 'perf_counter median'}; 2*H*D per in-window pair), ours "
          f"through mqa_core.fp8_mqa_logits; X/DG = speed ratio to DeepGEMM, 'graph' from CUDA-graph replay")
    print(preset_table(timed, names))
    print()
    w = host[0]["workload"] if host else "?"
    print(f"host us per call on {w}, clean_logits=True: {calls} calls back to back without a sync / {calls}, "
          f"median of {rounds} interleaved rounds")
    print(host_cost_table(host, names))
    bad = [r for r in timed + host if r["status"] in ("wrong", "error")]
    if bad:
        print(f"\n{len(bad)} wrong or failed: " + "; ".join(f"{r['provider']} on {r['workload']}: {r['reason'][:120]}"
                                                          for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
