"""``mqa providers``: every installed provider, where it comes from, and whether it serves here."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from .. import registry
from ..arch import detect_arch, normalize_arch
from ..discovery import SLOW_IMPORT_S
from .common import add_json, emit


def add_parser(sub: Any) -> None:
    p = sub.add_parser("providers", help="list installed providers and broken plugins",
                       description="List every installed provider: distribution, ops, archs, (q, k) dtype "
                                   "pairs, priority, import time, and whether it is usable on this machine "
                                   "(or why not). Two distributions claiming one name are both listed.")
    p.add_argument("--arch", help="judge usability for this arch instead of this machine's")
    add_json(p)


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.0f} ms"


def collect(arch: str) -> dict[str, Any]:
    s = registry.state()
    decisions = {}
    seconds = s.discovery.import_seconds()
    rows = []
    for spec in sorted(s.discovery.specs, key=lambda sp: (-sp.priority, sp.name, sp.distribution)):
        op = "fp8_mqa_logits" if "fp8_mqa_logits" in spec.ops else sorted(spec.ops)[0]
        if op not in decisions:
            decisions[op] = registry.decision(arch, op, None, None, s=s)
        c = decisions[op].candidate(spec.id)
        rows.append({
            "name": spec.name, "distribution": spec.distribution, "version": spec.version, "id": spec.id,
            "ops": sorted(spec.ops), "archs": sorted(spec.archs), "dtypes": sorted(spec.dtypes),
            "pairs": [list(p) for p in sorted(spec.pairs_for(arch))],
            "pairs_by_arch": {a: [list(p) for p in sorted(v)] for a, v in spec.dtype_pairs.items()},  # type: ignore[union-attr]
            "priority": spec.priority, "import_seconds": seconds.get(spec.id), "usable": c.accepted,
            "why_not": "" if c.accepted else f"[{c.code}] {c.reason}",
            "description": spec.description,
        })
    broken = [{"entry_point": b.entry_point, "distribution": b.distribution, "version": b.version,
               "stage": b.stage, "error": b.error, "import_seconds": b.import_seconds} for b in s.discovery.broken]
    skipped = [p.entry_point for p in s.discovery.plugins if p.status == "skipped"] or list(s.discovery.skipped)
    slow = [{"entry_point": p.entry_point, "distribution": p.distribution, "import_seconds": p.import_seconds}
            for p in s.discovery.plugins if p.import_seconds is not None and p.import_seconds > SLOW_IMPORT_S]
    return {"arch": arch, "providers": rows, "broken": broken, "skipped": skipped, "slow_imports": slow}


def render(data: dict[str, Any]) -> str:
    head = ("provider", "from", "priority", "import", "ops", "archs", f"q/k pairs on {data['arch']}",
            f"usable on {data['arch']}")
    rows = [head] + [(r["name"], f"{r['distribution']}=={r['version']}", str(r["priority"]),
                      _ms(r["import_seconds"]), ",".join(r["ops"]), ",".join(r["archs"]),
                      " ".join(f"{q.removeprefix('float8_e4m3')}/{k.removeprefix('float8_e4m3')}"
                               for q, k in r["pairs"]) or "-",
                      "yes" if r["usable"] else f"no: {r['why_not']}") for r in data["providers"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]
    if not data["providers"] and data["skipped"]:
        lines.append("(no provider loaded: MQA_PLUGINS leaves out every installed plugin: "
                     f"{', '.join(data['skipped'])})")
    elif not data["providers"]:
        lines.append("(no provider installed: from a checkout of mqa-core, pip install ./providers/torch_ref)")
    # One line per description under the table; a name two distributions claim is spelled
    # distribution:name there, so each line says whose it is.
    claims = Counter(r["name"] for r in data["providers"])
    described = [(r["name"] if claims[r["name"]] == 1 else r["id"], r["description"])
                 for r in data["providers"] if r["description"]]
    if described:
        width = max(len(label) for label, _ in described)
        lines += [""] + [f"{label:<{width}}  {text}" for label, text in described]
    for b in data["broken"]:
        took = f" after {_ms(b['import_seconds'])} of import" if b["import_seconds"] is not None else ""
        lines.append(f"BROKEN plugin {b['entry_point']} ({b['distribution']}=={b['version']}) at "
                     f"{b['stage']}{took}: {b['error']}")
    for p in data["slow_imports"]:
        lines.append(f"SLOW plugin {p['entry_point']} ({p['distribution']}): its import took "
                     f"{p['import_seconds']:.1f} s, which every process pays at discovery")
    if data["skipped"]:
        lines.append(f"not loaded (MQA_PLUGINS): {', '.join(data['skipped'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    arch = normalize_arch(args.arch) if args.arch else detect_arch()
    data = collect(arch)
    emit(data, render(data), args.json)
    return 0
