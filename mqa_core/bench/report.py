"""Results as long-format rows (one per provider x workload), the table, geomeans and the JSON file."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..tuning import cpu_name
from ..versions import installed_version, triton_version

#: Dense fp8 tensor-core peak in TFLOP/s by device-name fragment, from the vendors' spec sheets.
#: Checked in order, so the specific names come before the families they contain.
FP8_PEAK_TFLOPS = (
    ("H100 PCIe", 1513.0), ("H100 NVL", 1671.0), ("H200", 1979.0), ("H100", 1979.0), ("GH200", 1979.0),
    ("B200", 4500.0), ("MI355X", 5000.0), ("MI325X", 2615.0), ("MI300X", 2615.0),
)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def fp8_peak(name: str) -> float | None:
    for fragment, peak in FP8_PEAK_TFLOPS:
        if fragment.lower() in name.lower():
            return peak
    return None


def versions(providers: Sequence[Any]) -> dict[str, Any]:
    """torch, triton (without importing it), mqa-core, and each benchmarked provider's distribution."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
            "triton": triton_version(), "mqa-core": installed_version("mqa-core"),
            "providers": {p.name: f"{p.spec.distribution}=={p.spec.version}" for p in providers}}


def git_commit() -> str | None:
    """The commit of the mqa-core checkout, with ``+dirty`` for local changes; None outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def timed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of timed workloads (not the host-cost rows of :mod:`mqa_core.bench.host`)."""
    return [r for r in rows if r.get("record", "time") == "time"]


def host(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("record") == "host"]


def add_speedups(rows: list[dict[str, Any]], baseline: str | None) -> None:
    if not baseline:
        return
    rows = timed(rows)
    base = {r["workload"]: r["ms_median"] for r in rows if r["provider"] == baseline and r["status"] == "ok"}
    for r in rows:
        b = base.get(r["workload"])
        r["baseline"] = baseline
        r["speedup"] = b / r["ms_median"] if b and r["status"] == "ok" else None


def summary(rows: list[dict[str, Any]], providers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per provider: geomean TFLOP/s and speedup over the workloads it ran correctly."""
    out = {}
    for name in providers:
        mine = [r for r in timed(rows) if r["provider"] == name and r["status"] == "ok"]
        out[name] = {"workloads": len(mine), "tflops_geomean": geomean([r["tflops"] for r in mine]),
                     "speedup_geomean": geomean([r.get("speedup") or 0 for r in mine])}
    return out


def tflops_text(v: float) -> str:
    """Three significant digits without scientific notation: 1072, 96.3, 0.0412."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def table(rows: list[dict[str, Any]], providers: Sequence[str], baseline: str | None) -> str:
    """One line per provider x workload, then a geomean line per provider. Rows timed in CUDA-graph
    replay too (``mqa bench --graph``) add its ms and TFLOP/s: the device's time without the host."""
    rows = timed(rows)
    graph = any("graph_ms" in r for r in rows)
    memory = any(r.get("peak_mib") is not None for r in rows)
    head = ["provider", "workload", "median ms", "p10-p90 ms", "TFLOP/s", "% fp8 peak"]
    if graph:
        head += ["graph ms", "graph TFLOP/s"]
    if memory:
        head.append("peak MiB")
    if baseline:
        head.append(f"vs {baseline}")
    lines = [head]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["provider"], r["workload"], r["status"].upper(), r.get("reason", "")[:60], "", ""]
            cells += ["", ""] if graph else []
            cells += [""] if memory else []
        else:
            cells = [r["provider"], r["workload"], f"{r['ms_median']:.3f}",
                     f"{r['ms_p10']:.3f}-{r['ms_p90']:.3f}", tflops_text(r["tflops"]),
                     _fmt(r["pct_peak"], ".1f", "%")]
            if graph:
                g = r.get("graph_ms")
                cells += ([f"{g:.3f}", tflops_text(r["graph_tflops"])] if g is not None else ["-", "-"])
            if memory:
                cells.append(_fmt(r.get("peak_mib"), ".1f"))
        if baseline:
            cells.append(_fmt(r.get("speedup"), ".2f", "x") if r["status"] == "ok" else "")
        lines.append(cells)
    summ = summary(rows, providers)
    for name in providers:
        s = summ[name]
        cells = [name, f"geomean over {s['workloads']} workload{'s' * (s['workloads'] != 1)}", "", "",
                 tflops_text(s["tflops_geomean"]) if s["tflops_geomean"] is not None else "-", ""]
        if graph:
            mine = [r.get("graph_tflops") or 0 for r in rows if r["provider"] == name and r["status"] == "ok"]
            g = geomean(mine)
            cells += ["", "-" if g is None else tflops_text(g)]
        if memory:
            cells.append("")
        if baseline:
            cells.append(_fmt(s["speedup_geomean"], ".2f", "x"))
        lines.append(cells)
    return _columns(lines, left=2, rule_before=len(lines) - len(providers))


def _columns(lines: list[list[Any]], *, left: int, rule_before: int | None = None) -> str:
    """Aligned text: the first ``left`` columns to the left, the others to the right."""
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(lines[0]))]
    text = []
    for i, row in enumerate(lines):
        if i == rule_before:
            text.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
        text.append("  ".join(str(c).ljust(w) if j < left else str(c).rjust(w)
                              for j, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(text)


#: Host-cost levels a row may hold (``host_us_<level>``), outermost first, with their column titles.
HOST_LEVELS = {"api": "API us", "provider": "Provider us", "kernel": "kernel object us",
               "torch_op": "torch.ops us", "compiled": "compiled us"}


def host_table(rows: list[dict[str, Any]]) -> str:
    """Host microseconds per call at each level, per provider (the rows of mqa_core.bench.host), with
    the device's time per call beside them: where it is lower, the GPU kept up and the host was timed."""
    rows = host(rows)
    if not rows:
        return ""
    first = rows[0]
    levels = [lv for lv in HOST_LEVELS if any(f"host_us_{lv}" in r for r in rows)]
    lines: list[list[Any]] = [["provider", *(HOST_LEVELS[lv] for lv in levels), "device us", "GPU kept up"]]
    for r in rows:
        if r["status"] != "ok":
            lines.append([r["provider"], r["status"].upper(), r.get("reason", "")[:60],
                          *([""] * len(levels))])
            continue
        kept = r.get("gpu_kept_up")
        lines.append([r["provider"], *(_fmt(r.get(f"host_us_{lv}"), ".1f") for lv in levels),
                      _fmt(r.get("device_us"), ".1f"), "-" if kept is None else ("yes" if kept else "NO")])
    where = ("on a CPU the kernel runs on the host, so these include its arithmetic"
             if first.get("device") == "cpu" else "device us: CUDA-graph replay of one call")
    title = (f"host us per call on {first['workload']}: {first['calls']} calls back to back without a sync "
             f"/ {first['calls']}, median of {first['rounds']} interleaved rounds\n"
             f"API = mqa_core.fp8_mqa_logits, Provider = Provider.fp8_mqa_logits, kernel object = "
             f"provider.impl.fp8_mqa_logits; {where}")
    return title + "\n" + _columns(lines, left=1)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows saved by :func:`append_jsonl`; for a (provider, workload, record) run more than once,
    the last."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                key = (row["provider"], row["workload"], row.get("record", "time"))
                latest.pop(key, None)
                latest[key] = row
    return list(latest.values())


def append_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """Append the rows to a JSON Lines file: one result per line, runs accumulate."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True)
    with p.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
