"""Launch variants of the Gluon persistent kernel on the engine preset's weak shapes, beside DeepGEMM
(issue 14, item 4). Run through ``python bench/h200_engine.py --variants [NAMES] --budget S``.

Each variant is a ``config`` for ``fp8_mqa_logits_gluon`` (``mqa_provider_gluon.ops.mqa_logits_gluon_sm90``):
today's measured default, the shape rule the provider now applies (``shape_config``), other key-split
rules, the filler warp, dynamic item scheduling, the Triton kernel. First a subprocess builds every
variant and checks it on odd and ragged shapes against the float64 oracle, twice (Triton's launch,
then the bound direct launch), with a time limit: a variant that fails, or hangs the GPU, is dropped
here and cannot stall the sweep; its compiled kernels stay in Triton's disk cache for the sweep. Then,
per shape, each variant's result is checked against the oracle (output memory poisoned with NaN first,
both launch paths) and timed as the preset times (``do_bench`` median with L2 flushed; CUDA-graph
replay), beside DeepGEMM's whole call. The ratios printed are DeepGEMM's time over the variant's (> 1:
faster than DeepGEMM); without DeepGEMM, over today's.

    python bench/engine_variants.py --precheck [NAMES] [--smoke]   # the subprocess (prints PRECHECK lines)

``smoke`` (``h200_engine.py --cpu-smoke --variants``): the same steps on the CPU at 1/64 of the sizes,
each variant's config resolved as the launcher resolves it but computed by torch_ref, perf_counter
timings, no graphs: a typo cannot waste a device run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the checkout

from mqa_core.bench import workloads as wl  # noqa: E402
from mqa_core.bench.timing import rotating  # noqa: E402
from mqa_core.bench.verify import compare  # noqa: E402
from mqa_core.spec import Problem  # noqa: E402
from mqa_core.testing.data import make_inputs  # noqa: E402

#: name -> config (None: no config, so the shape rule decides). Most informative first.
VARIANTS: dict[str, dict[str, Any] | None] = {
    "today": {"split": "items"},  # the 2026-12-02 default: 4 items/SM, snake order, math warpgroups fill
    "rule": None,  # what the gluon provider does now: shape_config(M, N, H, SMs)
    "bal": {"split": "balanced"},
    "fill": {"filler": True},
    "bal+fill": {"split": "balanced", "filler": True},
    "dyn": {"dynamic": True},
    "dyn+fill": {"dynamic": True, "filler": True},
    "dyn+fill+bal": {"dynamic": True, "filler": True, "split": "balanced"},
    "ips1": {"items_per_sm": 1},
    "ips2": {"items_per_sm": 2},
    "ips8": {"items_per_sm": 8},
    "ips16": {"items_per_sm": 16},
    "r240": {"p_math_regs": 240},  # today's kernel with 240/240 math registers: no spill at H=32
    "triton": {"kernel": "triton"},  # the portable Triton kernel (the triton provider's)
}
#: Issue 14's two targets, the weak shapes of the first engine run (2026-12-02), then two large shapes
#: that must not regress; in this order (a spent time budget skips the last).
SHAPES = ("causal M=1024 N=1024 H=64 D=128", "chunk M=256 N=65536 H=64 D=128", "packed x4 M=3840 N=27648 H=64 D=128",
          "suffix M=512 N=4096 H=32 D=128", "sliding W=512 M=1024 N=8192 H=32 D=128",
          "suffix M=1024 N=8192 H=64 D=128", "causal M=8192 N=8192 H=64 D=128",
          "suffix M=4096 N=16384 H=32 D=128")
DG = "DeepGEMM"


def _launcher() -> Callable[..., torch.Tensor]:
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon

    return fp8_mqa_logits_gluon


def variant_call(config: dict[str, Any] | None, smoke: bool = False) -> Callable[[Any], torch.Tensor]:
    if smoke:
        from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import resolve_config, shape_config

        from mqa_core.testing.providers import provider_named

        ref = provider_named("torch_ref", "cpu").impl

        def stand_in(x: Any) -> torch.Tensor:
            m, h = x.q.shape[:2]
            resolve_config(h, config if config is not None else dict(shape_config(m, x.k.shape[0], h, 132)))
            return ref.fp8_mqa_logits(x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke, clean_logits=True)

        return stand_in
    f = _launcher()
    return lambda x: f(x.q, x.k, x.k_scale, x.weights, x.ks, x.ke, True, config=config)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _poison(m: int, n: int, device: torch.device) -> None:
    """Leave NaN where the caching allocator will place the next [m, n] output: unwritten cells show."""
    torch.empty(m * (-(-n // 16) * 16), device=device).fill_(float("nan"))


def check(call: Callable[[Any], torch.Tensor], x: Any, ref: torch.Tensor, against: str) -> str:
    """"" when two calls (Triton's launch, then the bound one) both match ``ref``, else why not."""
    m, n = x.q.shape[0], x.k.shape[0]
    for attempt in ("first call", "second call"):
        _poison(m, n, x.q.device)
        out = call(x)
        _sync(x.q.device)
        verdict = compare(out, ref, clean=True, against=against)
        del out
        if not verdict.ok:
            return f"{attempt}: {verdict.detail}"
    return ""


# -- the precheck (run in a subprocess) ---------------------------------------------------------------

def _precheck_cases(device: torch.device) -> list[tuple[str, Any, torch.Tensor]]:
    cases = []
    # N % 16 == 0 as in the sweep (one compiled kernel per variant and H, warmed here for it), and one
    # odd N at H=64 for the masks at the end of a row
    for (m, n, h), window, seed in (((1, 77, 64), "ragged", 1), ((37, 1024, 32), "ragged", 2),
                                    ((130, 2048, 64), "ragged", 3), ((300, 4096, 32), "causal", 4)):
        x = make_inputs(Problem(m, n, h, 128), device=device, window=window, seed=seed)
        cases.append((f"{window} M={m} N={n} H={h}", x, _oracle(x)))
    packed = wl.Workload(wl.PREFILL, Problem(297, 4000, 64, 128), "packed",
                         requests=((40, 300), (100, 1000), (7, 2000), (150, 700)))
    x = packed.setup(device, 5)
    cases.append(("packed x4 M=297 N=4000 H=64", x, _oracle(x)))
    return cases


def _oracle(x: Any) -> torch.Tensor:
    """float64 logits on the inputs' device (fp8 converted exactly on the CPU)."""
    from mqa_core.reference import fp8_mqa_logits_ref

    dev = x.q.device
    return fp8_mqa_logits_ref(x.q.cpu().double().to(dev), x.k.cpu().double().to(dev), x.k_scale, x.weights,
                              x.ks, x.ke)


def precheck_main(names: Sequence[str], smoke: bool = False) -> int:
    device = torch.device("cpu" if smoke else "cuda")
    cases = _precheck_cases(device)
    for name in names:
        t = time.time()
        try:
            why = ""
            for label, x, ref in cases:
                why = check(variant_call(VARIANTS[name], smoke), x, ref, "float64 oracle")
                if why:
                    why = f"{label}: {why}"
                    break
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
        print(f"PRECHECK {'ok' if not why else 'bad'} {name} {time.time() - t:.1f}s {why}", flush=True)
    return 0


def run_precheck(names: Sequence[str], timeout_s: float, log: Callable[[str], None],
                 smoke: bool = False) -> dict[str, str]:
    """{variant: why it is dropped} from a subprocess that checks them all, one by one."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--precheck", ",".join(names), *(["--smoke"] * smoke)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        text, note = done.stdout, "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-300:]}"
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        note = f"precheck ran past {timeout_s:.0f}s (a hang, or compiles too slow)"
    verdicts = {}
    for line in text.splitlines():
        if line.startswith("PRECHECK "):
            _, status, name, secs, *why = line.split(" ", 4)
            verdicts[name] = "" if status == "ok" else " ".join(why) or "failed"
            log(f"precheck {name}: {status} ({secs}){' ' + verdicts[name] if verdicts[name] else ''}")
    return {n: verdicts.get(n, note or "not reached") for n in names if verdicts.get(n, "x")}


# -- the sweep ----------------------------------------------------------------------------------------

def _time(fn: Callable[[], Any], smoke: bool = False) -> tuple[float, float | None]:
    """(do_bench median ms, L2 flushed before each call; CUDA-graph replay ms or None)."""
    if smoke:
        samples = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
        return sorted(samples)[1], None
    from triton.testing import do_bench, do_bench_cudagraph

    ms = float(do_bench(fn, warmup=5, rep=30, return_mode="median"))
    try:
        graph = float(do_bench_cudagraph(fn, rep=10, return_mode="median"))
    except Exception:
        traceback.print_exc()
        graph = None
    return ms, graph


def sweep(names: Sequence[str], dg_call: Callable[[Any], torch.Tensor] | None, device: torch.device, arch: str,
          deadline: float, log: Callable[[str], None], common: dict[str, Any]) -> list[dict[str, Any]]:
    from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import _multiprocessors, shape_config

    from mqa_core.bench.runner import reference

    smoke = device.type != "cuda"
    sms = 132 if smoke else _multiprocessors(device.index or 0)
    rows = []
    preset = {w.name: w for w in wl.engine_preset(True)}
    work = [preset[name].scaled(64 if smoke else 1) for name in SHAPES]
    columns = [*names, *([DG] if dg_call else [])]
    for i, w in enumerate(work, 1):
        p = w.problem
        base = {"record": "variant", "workload": w.name, "m": p.m, "n": p.n, "h": p.h, "d": p.d,
                "rule": dict(shape_config(p.m, p.n, p.h, sms)), **common}
        if time.time() > deadline:
            rows += [{**base, "variant": n, "status": "skipped", "reason": "time budget spent"} for n in columns]
            log(f"[{i}/{len(work)}] {w.name}: skipped, time budget spent")
            continue
        sets = [w.setup(device, 700 + 10 * i + j) for j in range(wl.input_sets(w, device))]
        ref, against = reference(w, sets[0], {}, arch)
        flops = w.flops(sets[0])
        for name in columns:
            row: dict[str, Any] = {**base, "variant": name, "config": None if name == DG else VARIANTS[name]}
            rows.append(row)
            call = dg_call if name == DG else variant_call(VARIANTS[name], smoke)
            assert call is not None
            try:
                why = check(call, sets[0], ref, against) if ref is not None else ""
                if why:
                    row.update(status="wrong", reason=why)
                    log(f"[{i}/{len(work)}] {w.name} {name}: WRONG {why}")
                    continue
                ms, graph = _time(rotating(call, sets), smoke)
            except Exception as exc:
                row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
                log(f"[{i}/{len(work)}] {w.name} {name}: ERROR {row['reason']}")
                traceback.print_exc()
                continue
            row.update(status="ok", ms=ms, graph_ms=graph, tflops=flops / ms / 1e9)
        got = {r["variant"]: r for r in rows if r["workload"] == w.name and r["status"] == "ok"}
        log(f"[{i}/{len(work)}] {w.name}: " + ", ".join(
            f"{n} {got[n]['ms'] * 1e3:.1f}/{(got[n]['graph_ms'] or 0) * 1e3:.1f}us" for n in columns if n in got))
        del sets, ref
        if not smoke:
            torch.cuda.empty_cache()
    return rows


def _short(workload: str) -> str:
    return (workload.replace(" D=128", "").replace("M=", "").replace(" N=", "x").replace(" H=", " H")
            .replace("sliding W=", "slide"))


def table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    """Two blocks of ratios (graph replay, then do_bench), one row per shape, then the best per shape."""
    shapes = list(dict.fromkeys(r["workload"] for r in rows))
    by = {(r["workload"], r["variant"]): r for r in rows}
    have_dg = any(r["variant"] == DG and r.get("status") == "ok" for r in rows)
    base_name = DG if have_dg else names[0]
    out = []
    for key, title in (("graph_ms", "CUDA-graph replay"), ("ms", "do_bench median (L2 flushed)")):
        out.append(f"{title}: {base_name} us, then {base_name} time / variant time (> 1: faster than {base_name})")
        head = ["shape", f"{base_name} us", *names]
        lines = [head]
        for s in shapes:
            b = by.get((s, base_name), {})
            b_ms = b.get(key) if b.get("status") == "ok" else None
            cells = [_short(s), "-" if b_ms is None else f"{b_ms * 1e3:.1f}"]
            for n in names:
                r = by.get((s, n), {})
                st = r.get("status", "-")
                v = r.get(key) if st == "ok" else None
                cells.append(f"{b_ms / v:.2f}" if v and b_ms else ("-" if st in ("ok", "-", "skipped") else st.upper()))
            lines.append(cells)
        widths = [max(len(line[c]) for line in lines) for c in range(len(head))]
        out += ["  ".join(c.ljust(wd) if j == 0 else c.rjust(wd) for j, (c, wd) in enumerate(zip(line, widths)))
                for line in lines]
        out.append("")
    out.append("fastest by graph replay (do_bench), and the rule's choice:")
    for s in shapes:
        ok = [(by[(s, n)]["graph_ms"] or by[(s, n)]["ms"], n) for n in names
              if by.get((s, n), {}).get("status") == "ok"]
        ok_db = [(by[(s, n)]["ms"], n) for n in names if by.get((s, n), {}).get("status") == "ok"]
        if ok:
            rule = next((r.get("rule") for r in rows if r["workload"] == s), None)
            rule_text = json.dumps(rule) if rule else "{} (today's config)"
            out.append(f"  {_short(s)}: {min(ok)[1]} ({min(ok_db)[1]}); rule {rule_text}")
    return "\n".join(out)


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 1 and argv[0] == "--precheck":
        names = argv[1].split(",") if len(argv) > 1 and argv[1] != "all" else list(VARIANTS)
        return precheck_main(names, smoke="--smoke" in argv)
    print(__doc__)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
