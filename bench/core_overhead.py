"""Core overheads on this machine: warm get_provider, cold import + discovery, torch_ref vs a bare matmul,
and the per-call host cost of the ops' dispatch (issue 14) with a provider whose kernel does no work.

Run: python bench/core_overhead.py [--json FILE] [--hot-only | --first-launch]. Prints a short table last.

The per-call section installs a real provider distribution, ``mqa-bench-noop`` (provider ``noop``, whose
kernels return an output preallocated for the shape), into a temporary site directory (found through
its entry point, as pip would lay it out), forces it with ``MQA_PROVIDER=noop``, and times, interleaved
in one run (median of rounds of back-to-back calls): ``torch.empty`` of the output, the no-op kernel
object alone, ``Provider.<op>``, ``mqa_core.<op>``, ``torch.ops.mqa.<op>`` eager, and the op inside
``torch.compile(fullgraph=True)`` (default backend, inductor), for a prefill (M=128, N=2048, H=64,
D=128) and a paged decode (B=32, next_n=2, H=64, D=128, context 4096, block 64) call. Ratios are to
``torch.empty`` of the output; "own" subtracts the kernel object's time first.

A compiled function also pays the compiled region's own cost (dynamo's guards and frame, AOT's and
inductor's runtime wrappers, per graph output). To tell it from the op's, the same is timed with a
bare op of the same schema, registered the same way, whose body is only ``torch.empty``; and one more
op in a region is timed as (four calls - one call) / 3, eager and compiled, for both ops.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def warm_get_provider() -> dict[str, float]:
    import mqa_core

    mqa_core.get_provider("cpu")
    out = {}
    for label, stmt in (("get_provider('cpu')", "g('cpu')"), ("get_provider('sm90') (alias)", "g('sm90')"),
                        ("get_provider() (detect)", "g()")):
        mqa_core.get_provider("sm90")
        runs = timeit.repeat(stmt, globals={"g": mqa_core.get_provider}, number=20000, repeat=7)
        out[label] = statistics.median(runs) / 20000 * 1e9
    return out


COLD = ("import time, torch; t0 = time.perf_counter(); import mqa_core; mqa_core.get_provider('sm_90');"
        "print((time.perf_counter() - t0) * 1e3)")


def cold_import_ms(runs: int = 7) -> float:
    times = [float(subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True,
                                  check=True).stdout.strip()) for _ in range(runs)]
    return statistics.median(times)


def torch_ref_vs_matmul(m: int = 2048, n: int = 8192, h: int = 64, d: int = 128) -> dict[str, float]:
    """Causal suffix prefill: torch_ref against one fp32 matmul of the same valid FLOPs, same threads."""
    import torch

    import mqa_core
    from mqa_core import Problem
    from mqa_core.testing import make_inputs

    inp = make_inputs(Problem(m, n, h, d), window="causal", seed=0)
    flops = 2 * h * d * inp.valid_pairs
    provider = mqa_core.get_provider("cpu")
    # The bare matmul: [M*H, D] x [D, cols] with cols chosen so M*H*cols equals the valid pairs * H.
    cols = inp.valid_pairs // m
    a = torch.randn(m * h, d)
    b = torch.randn(d, cols)

    def timed(fn, reps=5):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_ref = timed(lambda: provider.fp8_mqa_logits(*inp.args()))
    t_mm = timed(lambda: torch.mm(a, b))
    return {"shape": f"M={m},N={n},H={h},D={d} causal", "torch_ref_ms": t_ref * 1e3, "matmul_ms": t_mm * 1e3,
            "torch_ref_gflops": flops / t_ref / 1e9, "matmul_gflops": flops / t_mm / 1e9,
            "ratio": t_ref / t_mm, "threads": torch.get_num_threads()}


PEAK = """
import json, torch, mqa_core
from mqa_core import Problem
from mqa_core.testing import make_inputs
def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field))
inp = make_inputs(Problem(512, 65536, 64, 128), window="causal", seed=0)
base = kib("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
out = mqa_core.fp8_mqa_logits(*inp.args())
peak = kib("VmHWM:")
print(json.dumps({"growth_mib": (peak - base) / 1024, "output_mib": out.numel() * 4 / 2**20,
                  "materialised_mib": 512 * 64 * 65536 * 4 / 2**20}))
"""


def torch_ref_peak_memory() -> dict[str, float]:
    """Peak RSS growth of one torch_ref call at M=512, N=65536, H=64 with the default 512 MiB bound."""
    res = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


NOOP_PLUGIN = """
\"\"\"mqa-bench-noop: kernels that do no work (bench/core_overhead.py): they return the output the bench
preallocated for the shape it times (``KERNELS.out``).\"\"\"
from mqa_core import ProviderSpec, hookimpl


class NoOp:
    out = None

    def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
        return self.out

    def fp8_paged_mqa_logits(self, q, kv_cache, weights, lens, tables, max_context_len, *, clean_logits=True):
        return self.out


KERNELS = NoOp()


@hookimpl
def mqa_providers():
    return [ProviderSpec(name="noop", ops={"fp8_mqa_logits", "fp8_paged_mqa_logits"}, archs={"any"},
                         dtypes={"float8_e4m3fn"}, priority=-1000, load="mqa_bench_noop:KERNELS",
                         description="kernels that do no work (bench/core_overhead.py)")]
"""


@contextlib.contextmanager
def noop_provider() -> Iterator[None]:
    """Install ``mqa-bench-noop`` into a temporary site directory and force it with MQA_PROVIDER=noop."""
    import mqa_core

    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        (site / "mqa_bench_noop.py").write_text(NOOP_PLUGIN)
        info = site / "mqa_bench_noop-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mqa-bench-noop\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[mqa_core.providers]\nnoop = mqa_bench_noop\n")
        sys.path.insert(0, tmp)
        importlib.invalidate_caches()
        before = os.environ.get("MQA_PROVIDER")
        os.environ["MQA_PROVIDER"] = "noop"
        mqa_core.reload()
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("MQA_PROVIDER", None)
            else:
                os.environ["MQA_PROVIDER"] = before
            sys.path.remove(tmp)
            sys.modules.pop("mqa_bench_noop", None)
            mqa_core.reload()


def interleaved(stmts: dict[str, tuple[str, dict[str, Any]]], number: int, rounds: int) -> dict[str, float]:
    """Median ns per call of each statement; every round times each statement once, in turn, so
    the load of this shared machine lands on all of them alike."""
    timers = {k: timeit.Timer(stmt, globals=g) for k, (stmt, g) in stmts.items()}
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for t in timers.values():
        t.timeit(max(1, number // 10))  # warm: first calls fill the signature tables
    for _ in range(rounds):
        for k, t in timers.items():
            samples[k].append(t.timeit(number) / number * 1e9)
    return {k: statistics.median(v) for k, v in samples.items()}


PREFILL_SHAPE = (128, 2048, 64, 128)
PAGED_SHAPE = (32, 2, 64, 128, 4096, 64)  # B, next_n, H, D, context, block size

LABELS = {
    "empty": "torch.empty of the output",
    "kernel": "the no-op kernel object alone",
    "provider": "Provider.<op>",
    "api": "mqa_core.<op>",
    "torch_op": "torch.ops.mqa.<op>, eager",
    "compiled": "the same in torch.compile(fullgraph=True)",
    "bare_op": "bare op (same schema, body torch.empty), eager",
    "compiled_bare": "bare op in torch.compile(fullgraph=True)",
    "op4": "torch.ops.mqa.<op> x4 (4 distinct calls), eager",
    "compiled4": "the same x4 in one compiled graph",
    "bare_op4": "bare op x4, eager",
    "compiled_bare4": "bare op x4 in one compiled graph",
}
#: Levels whose own cost is reported beyond the kernel's: (level - kernel alone) / torch.empty.
CORE_LEVELS = ("provider", "api", "torch_op", "compiled")


def _bare_ops() -> Any:
    """``mqa_bench::prefill`` and ``mqa_bench::paged``: the mqa ops' schemas, registered the same way,
    whose body is only ``torch.empty`` of the output (fake: contiguous rows). What any op costs to
    dispatch, eager and inside a compiled region, on this machine."""
    import torch

    ns = getattr(torch.ops, "mqa_bench", None)
    if ns is not None and hasattr(ns, "prefill"):
        return ns
    lib = torch.library.Library("mqa_bench", "DEF")
    lib.define("prefill(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seqlen_ks, "
               "Tensor cu_seqlen_ke, *, bool clean_logits=True) -> Tensor")
    lib.define("paged(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_tables, "
               "SymInt max_context_len, *, bool clean_logits=True) -> Tensor")

    def prefill(q, k, k_scale, weights, ks, ke, *, clean_logits=True):  # type: ignore[no-untyped-def]
        return torch.empty((q.shape[0], k.shape[0]), dtype=torch.float32, device=q.device)

    def paged(q, kv_cache, weights, lens, tables, max_context_len, *, clean_logits=True):  # type: ignore[no-untyped-def]
        return torch.empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32, device=q.device)

    torch.library.register_fake("mqa_bench::prefill", prefill, lib=lib)
    torch.library.register_fake("mqa_bench::paged", paged, lib=lib)
    lib.impl("prefill", prefill, "CompositeExplicitAutograd")
    lib.impl("paged", paged, "CompositeExplicitAutograd")
    _bare_ops.lib = lib  # type: ignore[attr-defined]  # the registrations live as long as the Library
    return torch.ops.mqa_bench


def _callers(op: Any, bare: Any, vary: int) -> dict[str, Any]:
    """The functions timed eager and compiled, over the op's flat arguments plus one spare tensor.

    The four calls of one function differ in their clean flag and in argument ``vary`` (the spare, a
    copy of it), so no compiler pass may merge them; with the one-call versions they give the cost
    of one more op in a graph."""
    def four(o):  # type: ignore[no-untyped-def]
        def f(*a):  # type: ignore[no-untyped-def]
            args, spare = a[:-1], a[-1]
            other = args[:vary] + (spare,) + args[vary + 1:]
            return (o(*args, clean_logits=True), o(*args, clean_logits=False),
                    o(*other, clean_logits=True), o(*other, clean_logits=False))
        return f

    return {"compiled": lambda *a: op(*a[:-1], clean_logits=True),
            "compiled_bare": lambda *a: bare(*a[:-1], clean_logits=True),
            "compiled4": four(op), "compiled_bare4": four(bare)}


def guard_cost(compiled: Any, flat: tuple[Any, ...], number: int, rounds: int) -> float:
    """ns per call of dynamo's guard evaluation for ``compiled``: its time with guards evaluated minus
    its time under ``set_stance(skip_guard_eval_unsafe=True)``, rounds alternating."""
    import torch

    t = timeit.Timer("c(*flat)", globals={"c": compiled, "flat": flat})
    on, off = [], []
    for _ in range(rounds):
        on.append(t.timeit(number) / number * 1e9)
        torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        try:
            off.append(t.timeit(number) / number * 1e9)
        finally:
            torch.compiler.set_stance("default")
    return statistics.median(on) - statistics.median(off)


def _measure(op_name: str, p: Any, args: tuple[Any, ...], vary: int, op: Any, bare: Any,
             number: int, rounds: int) -> dict[str, Any]:
    import torch

    import mqa_core

    m, n = p.impl.out.shape
    flat = args + (args[vary].clone(),)
    callers = _callers(op, bare, vary)
    g: dict[str, Any] = {"torch": torch, "f32": torch.float32, "dev": flat[0].device, "mqa_core": mqa_core,
                         "p": p, "impl": p.impl, "op": op, "bare_op": bare, "flat": flat, **callers}
    for name in list(callers):
        c = torch.compile(callers[name], fullgraph=True)
        for _ in range(3):
            c(*flat)  # compiles, then runs the compiled code
        g[name] = c
        g[name.replace("compiled", "eager")] = callers[name]
    # The public call's arguments: prefill passes kv as a (k, k_scale) tuple.
    g["a"] = (args[0], (args[1], args[2]), *args[3:]) if op_name == "fp8_mqa_logits" else args
    g["o"] = args
    extra = {}
    if op_name == "fp8_paged_mqa_logits":  # the same call with a decode step's schedule (a hint)
        g["sched"] = mqa_core.paged_schedule(args[3], 132)  # an H200's SMs; the no-op kernel never reads it
        extra["api_schedule"] = ("mqa_core.fp8_paged_mqa_logits(*a, clean_logits=True, schedule=sched)", g)
    r = interleaved({
        **extra,
        "empty": (f"torch.empty(({m}, {n}), dtype=f32, device=dev)", g),
        "kernel": (f"impl.{op_name}(*a, clean_logits=True)", g),
        "provider": (f"p.{op_name}(*a, clean_logits=True)", g),
        "api": (f"mqa_core.{op_name}(*a, clean_logits=True)", g),
        "torch_op": ("op(*o, clean_logits=True)", g),
        "compiled": ("compiled(*flat)", g),
        "bare_op": ("bare_op(*o, clean_logits=True)", g),
        "compiled_bare": ("compiled_bare(*flat)", g),
        "op4": ("eager4(*flat)", g),
        "compiled4": ("compiled4(*flat)", g),
        "bare_op4": ("eager_bare4(*flat)", g),
        "compiled_bare4": ("compiled_bare4(*flat)", g),
    }, number, rounds)
    r["guards"] = guard_cost(g["compiled"], flat, number, rounds)
    r["ratios"] = {k: r[k] / r["empty"] for k in LABELS if k != "empty"}
    r["core_ratios"] = {k: (r[k] - r["kernel"]) / r["empty"] for k in CORE_LEVELS}
    # One more op in a region, and what the mqa op costs beyond an op that only allocates: eager
    # and inside a compiled graph. The compiled path costs no more than eager when these agree.
    r["per_op"] = {"eager": (r["op4"] - r["torch_op"]) / 3, "compiled": (r["compiled4"] - r["compiled"]) / 3,
                   "bare_eager": (r["bare_op4"] - r["bare_op"]) / 3,
                   "bare_compiled": (r["compiled_bare4"] - r["compiled_bare"]) / 3}
    r["per_op"]["beyond_bare_eager"] = r["per_op"]["eager"] - r["per_op"]["bare_eager"]
    r["per_op"]["beyond_bare_compiled"] = r["per_op"]["compiled"] - r["per_op"]["bare_compiled"]
    return r


def hot_path(number: int = 1000, rounds: int = 15) -> dict[str, Any]:
    """Per-call host cost of each dispatch level with the no-op provider, in ns, and ratios to torch.empty."""
    import torch

    import mqa_core
    import mqa_core.torch_ops  # noqa: F401  (registers torch.ops.mqa.*)
    from mqa_core import Problem
    from mqa_core.testing import make_inputs, make_paged_inputs

    bare = _bare_ops()
    res: dict[str, Any] = {}
    with noop_provider():
        torch._dynamo.reset()
        m, n, h, d = PREFILL_SHAPE
        x = make_inputs(Problem(m, n, h, d), seed=0)
        p = mqa_core.get_provider(op="fp8_mqa_logits", dtype=x.q.dtype)
        assert p.name == "noop", p
        p.impl.out = torch.empty((m, n), dtype=torch.float32)
        res["prefill"] = _measure("fp8_mqa_logits", p, (x.q, x.k, x.k_scale, x.weights, x.ks, x.ke), 4,
                                  torch.ops.mqa.fp8_mqa_logits, bare.prefill, number, rounds)
        bs, nn, h, d, ctx, block = PAGED_SHAPE
        y = make_paged_inputs(bs, nn, h, d, ctx, block_size=block, seed=1)
        p = mqa_core.get_provider(op="fp8_paged_mqa_logits", dtype=y.q.dtype)
        p.impl.out = torch.empty((bs * nn, ctx), dtype=torch.float32)
        res["paged"] = _measure("fp8_paged_mqa_logits", p, y.args(), 3, torch.ops.mqa.fp8_paged_mqa_logits,
                                bare.paged, number, rounds)
        torch._dynamo.reset()
    m, n, h, d = PREFILL_SHAPE
    bs, nn, h2, d2, ctx, block = PAGED_SHAPE
    res["shapes"] = {"prefill": f"M={m} N={n} H={h} D={d}",
                     "paged": f"B={bs} next_n={nn} H={h2} D={d2} context={ctx} block={block}"}
    res["number"], res["rounds"] = number, rounds
    return res


def print_hot(res: dict[str, Any]) -> None:
    print("\nper-call host cost, no-op provider (returns a preallocated output) forced with MQA_PROVIDER: "
          "median us; x = per torch.empty of the output; own = (level - kernel alone) / torch.empty")
    print(f"{'level':52} {'prefill':>27} {'paged':>27}")
    for k, label in LABELS.items():
        cells = []
        for shape in ("prefill", "paged"):
            r = res[shape]
            cell = f"{r[k] / 1e3:6.2f}"
            if k != "empty":
                cell += f" {r['ratios'][k]:5.1f}x"
            if k in r["core_ratios"]:
                cell += f" own {r['core_ratios'][k]:4.1f}x"
            cells.append(cell)
        print(f"{label:52} {cells[0]:>27} {cells[1]:>27}")
    print("of a compiled call, dynamo's guard evaluation (time minus time with skip_guard_eval_unsafe): "
          f"prefill {res['prefill']['guards'] / 1e3:.2f} us, paged {res['paged']['guards'] / 1e3:.2f} us")
    print("one more op in a region (us): mqa op eager / compiled; bare op eager / compiled; "
          "mqa op beyond the bare op eager / compiled")
    for shape in ("prefill", "paged"):
        o = {k: v / 1e3 for k, v in res[shape]["per_op"].items()}
        print(f"  {shape}: {o['eager']:.2f} / {o['compiled']:.2f}; {o['bare_eager']:.2f} / {o['bare_compiled']:.2f}; "
              f"{o['beyond_bare_eager']:.2f} / {o['beyond_bare_compiled']:.2f}")
    paged = res["paged"]
    if "api_schedule" in paged:
        print(f"paged with a decode step's schedule (mqa_core.fp8_paged_mqa_logits(..., schedule=)): "
              f"{paged['api_schedule'] / 1e3:.2f} us, {(paged['api_schedule'] - paged['api']) / 1e3:+.2f} us over "
              "mqa_core.<op> without (the no-op kernel names no schedule: the core's cost of the hint)")
    print(f"shapes: prefill {res['shapes']['prefill']}; paged {res['shapes']['paged']}; "
          f"{res['rounds']} rounds x {res['number']} calls, interleaved")


class _FirstLaunch(Exception):
    """Raised by a stubbed kernel: the host got to its first launch."""


def first_launch(shapes: tuple[tuple[int, int], ...] = ((4096, 131072), (1024, 1 << 20)), topk: int = 2048,
                 rounds: int = 50) -> dict[str, dict[str, float]]:
    """Host us from a prefill top-k call to its first kernel launch, the stretch where nothing is
    queued and the GPU waits (an H100 trace put all of the sliced path's idle there): the composed /
    two-stage chunk loop (``mqa_core.composed.chunked_prefill_topk``, its logits call stubbed) and
    the gluon provider's sliced path (``fp8_mqa_topk_triton``, its first kernel, the rows' table,
    stubbed; CPU tensors under the interpreter flag, which no kernel reaches). Suffix windows,
    H = 64, D = 128, the default workspace; median of ``rounds`` calls."""
    import torch
    import triton
    from mqa_provider_gluon.ops import mqa_topk_triton as mt

    from mqa_core.composed import chunked_prefill_topk

    def stop(*_: Any, **__: Any) -> Any:
        raise _FirstLaunch

    class Stub:
        def __getitem__(self, grid: Any) -> Any:
            return stop

    res: dict[str, dict[str, float]] = {}
    table, interpreting = mt.table_kernel, mt._interpreting
    mt.table_kernel = lambda interpret=None: Stub()  # type: ignore[assignment,misc]
    mt._interpreting = contextlib.nullcontext  # the interpreter's context is no part of a GPU call's host path
    try:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            for m, n in shapes:
                q = torch.empty(m, 64, 128, dtype=torch.float8_e4m3fn)
                k = torch.empty(n, 128, dtype=torch.float8_e4m3fn)
                w, scale = torch.empty(m, 64), torch.empty(n)
                ks = torch.zeros(m, dtype=torch.int32)
                ke = torch.arange(n - m + 1, n + 1, dtype=torch.int32)
                calls = {"two-stage": lambda: chunked_prefill_topk(stop, stop, q, (k, scale), w, ks, ke, topk,
                                                                   "relative", False, 256 << 20),
                         "sliced": lambda: mt.fp8_mqa_topk_triton(q, k, scale, w, ks, ke, topk)}
                row = {}
                for name, call in calls.items():
                    times = []
                    for _ in range(rounds):
                        t = time.perf_counter()
                        try:
                            call()
                        except _FirstLaunch:
                            pass
                        times.append(time.perf_counter() - t)
                    row[name] = statistics.median(times) * 1e6
                res[f"{m} x {n}"] = row
    finally:
        mt.table_kernel, mt._interpreting = table, interpreting  # type: ignore[assignment]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--hot-only", action="store_true", help="only the per-call host cost (issue 14)")
    ap.add_argument("--first-launch", action="store_true", help="only the host us from a prefill top-k call "
                    "to its first kernel launch (two-stage and sliced paths, kernels stubbed)")
    args = ap.parse_args()
    if args.first_launch:
        print(f"{'host us to the first launch':28} {'two-stage':>10} {'sliced':>10}   ({_commit()}, "
              f"{os.cpu_count()} cpus)")
        for shape, row in first_launch().items():
            print(f"{'prefill ' + shape:28} {row['two-stage']:10.0f} {row['sliced']:10.0f}")
        return
    import torch

    import mqa_core
    from mqa_core.tuning import cpu_name
    from mqa_core.versions import installed_version

    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()}",
           "cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "mqa_core": installed_version("mqa-core"), "commit": _commit(),
           "providers": [p.name for p in mqa_core.registry.state().discovery.specs]}
    if not args.hot_only:
        res["warm_ns"] = warm_get_provider()
        res["cold_import_and_discovery_ms"] = cold_import_ms()
        res["torch_ref"] = torch_ref_vs_matmul()
        res["torch_ref_peak"] = torch_ref_peak_memory()
    res["hot_path"] = hot_path()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['date']}  {res['cpu']}  {res['cpus']} cpus  python {res['python']}  torch {res['torch']}  "
          f"mqa-core {res['mqa_core']} ({res['commit']})")
    print(f"providers installed: {', '.join(res['providers'])}")
    if not args.hot_only:
        print(f"{'measure':45} {'median':>12}")
        for k, v in res["warm_ns"].items():
            print(f"warm {k:40} {v:9.0f} ns")
        print(f"{'cold import mqa_core + discovery (torch excluded)':45} {res['cold_import_and_discovery_ms']:9.1f} ms")
        r = res["torch_ref"]
        print(f"torch_ref {r['shape']}: {r['torch_ref_ms']:.0f} ms ({r['torch_ref_gflops']:.0f} GFLOP/s), bare fp32 "
              f"matmul of the same valid FLOPs {r['matmul_ms']:.0f} ms ({r['matmul_gflops']:.0f} GFLOP/s): "
              f"ratio {r['ratio']:.2f}x")
        p = res["torch_ref_peak"]
        print(f"torch_ref M=512,N=65536,H=64,D=128 causal: peak RSS growth {p['growth_mib']:.0f} MiB = output "
              f"{p['output_mib']:.0f} MiB + temporaries (bound 512 MiB); an [H, M, N] fp32 product would be "
              f"{p['materialised_mib']:.0f} MiB")
    print_hot(res["hot_path"])


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    main()
