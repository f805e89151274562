"""``mqa check``: the conformance kit as a command, one summary line per provider.

It runs the very suite ``pytest --mqa-provider NAME`` runs, in this process, with an empty pytest
configuration of its own so that whatever ``pytest.ini`` or ``conftest.py`` surrounds the current
directory cannot change the verdict. A provider that is not installed (exit 2) or cannot serve this
device (exit 3) is reported in one line before anything runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..names import printable
from .common import UserError, add_json, device_or_default, emit, refuse_named


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="certify providers with the conformance kit",
                       description="Run the conformance kit (the suite behind `pytest --mqa-provider NAME`) "
                                   "against installed providers on a device. Exit status 1 when any "
                                   "provider fails a case, 2 for a provider that is not installed, 3 for "
                                   "one that cannot serve the device.")
    p.add_argument("--provider", action="append", default=[], metavar="NAME",
                   help="provider to check, by name or distribution:name (repeatable; default: every provider "
                        "usable on the device)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--seed", "--mqa-seed", dest="seed", type=int, default=None,
                   help="base seed (default: fresh, printed); failures name it as --mqa-seed, also accepted here")
    p.add_argument("--dtype", default=None, metavar="Q[,K]",
                   help="only this (q, k) dtype pair, e.g. e4m3fn or e4m3fn,e4m3fnuz (default: every declared pair)")
    p.add_argument("--accumulation", choices=("fp32", "fp8-mma"), default=None,
                   help="error model of the per-cell bound (default: fp32 on the CPU, fp8-mma on GPUs)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only the cases matching this pytest -k expression")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's output for every case")
    add_json(p)


class _Outcomes:
    """A pytest plugin object: each case's outcome and failure message, keyed by provider."""

    def __init__(self) -> None:
        self.provider_of: dict[str, str | None] = {}
        self.outcome: dict[str, str] = {}
        self.message: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.collect_errors: list[str] = []

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            spec = getattr(item, "callspec", None)
            self.provider_of[item.nodeid] = spec.params.get("provider_name") if spec else None

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append(_message(report))

    def pytest_runtest_logreport(self, report: Any) -> None:
        node = report.nodeid
        self.seconds[node] = self.seconds.get(node, 0.0) + report.duration
        if report.failed:
            if self.outcome.get(node) != "failed":
                self.message[node] = _message(report)
            self.outcome[node] = "failed"
        elif report.skipped and self.outcome.get(node) != "failed":
            self.outcome[node] = "skipped"
            self.message[node] = _message(report)
        elif report.when == "call" and node not in self.outcome:
            self.outcome[node] = "passed"

    def summary(self, names: list[str]) -> dict[str, dict[str, Any]]:
        def empty() -> dict[str, Any]:
            return {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0, "failures": []}

        result = {n: empty() for n in names}
        for node, outcome in self.outcome.items():
            row = result.setdefault(self.provider_of.get(node) or "?", empty())
            row[outcome] += 1
            row["seconds"] += self.seconds.get(node, 0.0)
            if outcome == "failed":
                row["failures"].append({"case": node.rpartition("::")[2], "message": self.message[node]})
        return result


def _message(report: Any) -> str:
    """The one line that says what went wrong: the assertion's, pytest.fail's or the exception's."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or "failed")
    for prefix in ("AssertionError: ", "Failed: "):
        text = text.removeprefix(prefix)
    return text.split("\nassert ")[0].strip() or "failed"


def _plugin_name() -> str:
    """The kit's ``pytest11`` entry-point name: what ``-p`` loads when autoloading is off."""
    import importlib.metadata as md

    for ep in md.entry_points(group="pytest11"):
        if ep.value == "mqa_core.testing.plugin":
            return ep.name
    return "mqa_core.testing.plugin"  # not installed as a distribution: import it by module name


def _suite() -> str:
    found = importlib.util.find_spec("mqa_core.testing.conformance")
    if found is None or not found.origin:
        raise UserError("the conformance suite mqa_core/testing/conformance.py is missing from this install")
    return found.origin


def run_kit(names: list[str], device: str, seed: int, keyword: str | None, verbose: bool,
            quiet: bool, dtype: str | None = None, accumulation: str | None = None) -> tuple[int, _Outcomes]:
    """Run the kit in this process with a configuration of its own; returns pytest's exit code."""
    need_pytest()
    import pytest

    outcomes = _Outcomes()
    with tempfile.TemporaryDirectory(prefix="mqa-check-") as tmp:
        ini = Path(tmp, "pytest.ini")
        ini.write_text("[pytest]\n")
        # Quiet: progress dots, then the summary below says what failed (pytest's own failure report,
        # one block per case, is for -v).
        argv = [_suite(), "-c", str(ini), "--rootdir", tmp, "--noconftest", "-p", "no:cacheprovider",
                "--mqa-device", device, "--mqa-seed", str(seed), "--no-header",
                *(["-v", "--tb=short", "-rfE"] if verbose else ["-q", "--tb=no", "-rN"])]
        argv += [a for n in names for a in ("--mqa-provider", n)]
        if keyword:
            argv += ["-k", keyword]
        if dtype:
            argv += ["--mqa-dtype", dtype]
        if accumulation:
            argv += ["--mqa-accumulation", accumulation]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            argv += ["-p", _plugin_name()]
        sink = io.StringIO() if quiet else sys.stdout
        with contextlib.redirect_stdout(sink):
            code = pytest.main(argv, plugins=[outcomes])
    return int(code), outcomes


#: What ``mqa check`` needs beyond the core: the kit runs under pytest (``mqa-core[check]``).
CHECK_EXTRA = "pip install 'mqa-core[check]'"


def need_pytest() -> None:
    """UserError (exit 2) before anything runs when pytest, which the kit runs under, is missing."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise UserError(f"mqa check runs the conformance kit with pytest, which is not installed: {CHECK_EXTRA} "
                        "(or pip install pytest)") from None


def _clip(text: str, limit: int) -> str:
    one = printable(" ".join(text.split()))  # a failure message may quote a kernel's exception
    return one if len(one) <= limit else one[: limit - 3] + "..."


def render(data: dict[str, Any]) -> str:
    lines = [f"conformance kit on {data['device']} ({data['arch']}), base seed {data['seed']} "
             f"(reproduce with --seed {data['seed']}):"]
    width = max(len(n) for n in data["providers"])
    for name, r in data["providers"].items():
        ran = r["passed"] + r["failed"]
        verdict = "PASS" if r["failed"] == 0 and ran else "FAIL"
        extra = f", {r['skipped']} skipped" if r["skipped"] else ""
        lines.append(f"  {name:<{width}}  {verdict}  {r['passed']} passed, {r['failed']} failed{extra}  "
                     f"({r['seconds']:.1f} s)")
        for f in r["failures"][:3]:
            lines.append(f"      {f['case']}: {_clip(f['message'], 600)}")
        if len(r["failures"]) > 3:
            lines.append(f"      ... and {len(r['failures']) - 3} more failed cases")
        if not ran:
            lines.append("      no case ran" + (f" (-k {data['keyword']!r} matched none?)" if data["keyword"] else ""))
    for err in data["collection_errors"]:
        lines.append(f"  collection error: {err}")
    lines.append("all providers pass" if data["passed"] else "FAILED")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..arch import arch_of_device
    from ..testing.cases import parse_pair
    from ..testing.providers import usable_providers

    need_pytest()
    device = device_or_default(args.device)
    arch = arch_of_device(device)
    if args.dtype:
        parse_pair(args.dtype)  # a ValueError here is a usage error (exit 2), before anything runs
    names = list(dict.fromkeys(args.provider)) or usable_providers(arch)
    if not names:
        raise UserError(f"no installed provider is usable on {device} ({arch}); `mqa explain` says why")
    refuse_named(names, arch)
    seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    t0 = time.perf_counter()
    code, outcomes = run_kit(names, str(device), seed, args.keyword, args.verbose, quiet=args.json, dtype=args.dtype,
                             accumulation=args.accumulation)
    providers = outcomes.summary(names)
    passed = code == 0 and all(r["failed"] == 0 and r["passed"] > 0 for r in providers.values())
    data = {"device": str(device), "arch": arch, "seed": seed, "keyword": args.keyword, "dtype": args.dtype,
            "providers": providers, "collection_errors": outcomes.collect_errors,
            "pytest_exit_code": code, "seconds": round(time.perf_counter() - t0, 2), "passed": passed}
    if not args.json:
        print()
    emit(data, render(data), args.json)
    return 0 if passed else 1
