"""Where each profiled kernel's warps stall, from Nsight Compute's source page: the stall reasons'
shares of all warp samples, then the SASS lines with the most samples and their top reasons.

    ncu -i REPORT --page source --print-source sass --csv > src.csv   # a report with SourceCounters
    python bench/ncu_stalls.py src.csv [--top 12]

Runs anywhere (it reads the CSV only). The report of ``bench/h200_decode_profile.py`` holds one block
per profiled launch, each opened by a "Kernel Name" row.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass(frozen=True)
class Kernel:
    """One profiled launch's block of the CSV: its header row and one row per SASS instruction."""

    name: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def read(path: str) -> list[Kernel]:
    """The CSV's blocks, one per profiled launch."""
    kernels: list[Kernel] = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append(Kernel(row[1]))
            elif kernels and row[0] == "Address":
                kernels[-1].header.extend(row)
            elif kernels and kernels[-1].header:
                kernels[-1].rows.append(row)
    return kernels


def summary(kernel: Kernel, top: int) -> list[str]:
    col = {name: i for i, name in enumerate(kernel.header)}
    reasons = [name for name in kernel.header if name.startswith("stall_")]
    totals: collections.Counter[str] = collections.Counter()
    lines = []
    for row in kernel.rows:
        samples = int(row[col[SAMPLES]] or 0)
        by_reason = {r: int(row[col[r]]) for r in reasons if row[col[r]] not in ("", "0")}
        totals.update(by_reason)
        lines.append((samples, row[col["Address"]], row[col["Source"]], by_reason))
    n = max(sum(s for s, *_ in lines), 1)
    out = [f"== {kernel.name[:70]}: {n} samples over {len(lines)} instructions"]
    out += [f"   {reason:30s} {100 * count / n:5.1f}%" for reason, count in totals.most_common(10)]
    for samples, address, source, by_reason in sorted(lines, key=lambda x: -x[0])[:top]:
        head = dict(sorted(by_reason.items(), key=lambda kv: -kv[1])[:3])
        out.append(f"   {100 * samples / n:5.1f}% {address[-5:]} {source.strip()[:58]:58s} {head}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu -i REPORT --page source --print-source sass --csv")
    ap.add_argument("--top", type=int, default=12, help="SASS lines shown per kernel (default 12)")
    args = ap.parse_args()
    kernels = read(args.csv)
    if not kernels:
        print(f"{args.csv}: no 'Kernel Name' block (was the report taken with --section SourceCounters?)")
        return 1
    for kernel in kernels:
        print("\n".join(summary(kernel, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
