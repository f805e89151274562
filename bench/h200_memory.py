"""Where a top-k op's peak memory goes: the live allocations at the peak of one call, by the line that
made them. The kit's memory case (``test_topk_memory``) says whether a provider stays within its
workspace; this says what to change when it does not.

    MQA_PROVIDER=triton python bench/h200_memory.py [--op fp8_mqa_topk] [--workspace-mb 16] [--top 12]

Runs the kit's shapes (prefill M=512 N=131072 causal, paged B=64 next_n=2 ctx 32768; H=16, D=64,
topk 2048 with values) once to compile and warm the caches, then once under
``torch.cuda.memory._record_memory_history`` and replays the trace: the peak of what the call
allocated (inputs and outputs excluded, as the kit counts), and the allocations alive at that
moment, largest first, each with the first frame of this checkout that made it.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from typing import Any

import torch

from mqa_core import get_provider
from mqa_core.spec import Problem
from mqa_core.testing.data import make_inputs, make_paged_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(op: str, device: str) -> tuple[Any, ...]:
    if op == "fp8_mqa_topk":
        return make_inputs(Problem(512, 131072, 16, 64), device=device, window="causal", seed=1).args()
    return make_paged_inputs(64, 2, 16, 64, 32768, device=device, seed=1).args()


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame inside this checkout (not torch's), as ``file:line function``."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith(ROOT) and "/bench/h200_memory.py" not in name:
            return f"{os.path.relpath(name, ROOT)}:{f.get('line')} {f.get('name')}"
    return "(outside this checkout)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="fp8_mqa_topk", choices=["fp8_mqa_topk", "fp8_paged_mqa_topk"])
    ap.add_argument("--workspace-mb", type=float, default=16.0)
    ap.add_argument("--top", type=int, default=12, help="live allocations to list at the peak")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("h200_memory.py measures CUDA allocations: it needs a GPU")
    args = _args(a.op, "cuda")
    provider = get_provider(op=a.op)
    ws = int(a.workspace_mb * 2**20)

    def call() -> Any:
        return getattr(provider, a.op)(*args, 2048, return_values=True, workspace_bytes=ws)

    call()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    idx, vals = call()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    outputs = idx.untyped_storage().nbytes() + vals.untyped_storage().nbytes()
    peak_counter = torch.cuda.max_memory_allocated() - base - outputs

    live: dict[int, tuple[int, str]] = {}
    now = best = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snap["device_traces"]:
        for e in trace:
            if e["action"] == "alloc":
                live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
                now += e["size"]
            elif e["action"] in ("free_requested",) and e["addr"] in live:
                now -= live.pop(e["addr"])[0]
            if now > best:
                best, at_peak = now, dict(live)
    by_line: dict[str, list[int]] = defaultdict(list)
    for size, where in at_peak.values():
        by_line[where].append(size)
    print(f"provider {provider.name} ({provider.spec.distribution} {provider.spec.version}), {a.op}, "
          f"workspace {a.workspace_mb:g} MiB on {torch.cuda.get_device_name()}")
    print(f"peak extra memory (the kit's count): {peak_counter / 2**20:.2f} MiB; "
          f"allocated by the call at its peak: {best / 2**20:.2f} MiB (outputs included)")
    for where, sizes in sorted(by_line.items(), key=lambda kv: -sum(kv[1]))[:a.top]:
        print(f"  {sum(sizes) / 2**20:8.2f} MiB  x{len(sizes):<3d} {where}")


if __name__ == "__main__":
    main()
