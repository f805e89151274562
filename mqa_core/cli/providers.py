"""``mqa providers``: every installed provider, where it comes from, and whether it serves here."""

from __future__ import annotations

import argparse
from typing import Any

from .. import registry
from ..arch import detect_arch, normalize_arch
from .common import add_json, emit


def add_parser(sub: Any) -> None:
    p = sub.add_parser("providers", help="list installed providers and broken plugins",
                       description="List every installed provider: distribution, ops, archs, dtypes, "
                                   "priority, and whether it is usable on this machine (or why not).")
    p.add_argument("--arch", help="judge usability for this arch instead of this machine's")
    add_json(p)


def collect(arch: str) -> dict[str, Any]:
    s = registry.state()
    rows = []
    for spec in sorted(s.discovery.specs, key=lambda sp: (-sp.priority, sp.name)):
        op = "fp8_mqa_logits" if "fp8_mqa_logits" in spec.ops else sorted(spec.ops)[0]
        c = registry.decision(arch, op, None, None).candidate(spec.name)
        rows.append({
            "name": spec.name, "distribution": spec.distribution, "version": spec.version,
            "ops": sorted(spec.ops), "archs": sorted(spec.archs), "dtypes": sorted(spec.dtypes),
            "priority": spec.priority, "usable": c.accepted,
            "why_not": "" if c.accepted else f"[{c.code}] {c.reason}",
            "description": spec.description,
        })
    broken = [{"entry_point": b.entry_point, "distribution": b.distribution, "version": b.version,
               "stage": b.stage, "error": b.error} for b in s.discovery.broken]
    return {"arch": arch, "providers": rows, "broken": broken, "skipped": list(s.discovery.skipped)}


def render(data: dict[str, Any]) -> str:
    head = ("provider", "from", "priority", "ops", "archs", "dtypes", f"usable on {data['arch']}")
    rows = [head] + [(r["name"], f"{r['distribution']}=={r['version']}", str(r["priority"]),
                      ",".join(r["ops"]), ",".join(r["archs"]), ",".join(r["dtypes"]),
                      "yes" if r["usable"] else f"no: {r['why_not']}") for r in data["providers"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]
    if not data["providers"]:
        lines.append("(no provider installed: pip install mqa-provider-torch-ref)")
    described = [(r["name"], r["description"]) for r in data["providers"] if r["description"]]
    if described:
        lines += [""] + [f"{name:<{widths[0]}}  {text}" for name, text in described]
    for b in data["broken"]:
        lines.append(f"BROKEN plugin {b['entry_point']} ({b['distribution']}=={b['version']}) at "
                     f"{b['stage']}: {b['error']}")
    if data["skipped"]:
        lines.append(f"not loaded (MQA_PLUGINS): {', '.join(data['skipped'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    arch = normalize_arch(args.arch) if args.arch else detect_arch()
    data = collect(arch)
    emit(data, render(data), args.json)
    return 0
