"""Core overheads on this machine: warm get_provider, cold import + discovery, torch_ref vs a bare matmul.

Run: python bench/core_overhead.py [--json FILE]. Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
import timeit


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    import torch

    import mqa_core

    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()}",
           "cpus": __import__("os").cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "providers": [p.name for p in mqa_core.registry.state().discovery.specs]}
    res["warm_ns"] = warm_get_provider()
    res["cold_import_and_discovery_ms"] = cold_import_ms()
    res["torch_ref"] = torch_ref_vs_matmul()
    res["torch_ref_peak"] = torch_ref_peak_memory()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(f"\n{res['date']}  {res['machine']}  {res['cpus']} cpus  python {res['python']}  torch {res['torch']}")
    print(f"providers installed: {', '.join(res['providers'])}")
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


if __name__ == "__main__":
    main()
