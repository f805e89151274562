"""bench/engine_variants.py (the H200 launch-variant sweep) on the CPU: its configs are valid, its
precheck verdicts are read right, and the sweep runs end to end with torch_ref stand-ins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "providers" / "gluon"))
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402


@pytest.fixture(scope="module")
def ev() -> Any:
    return load_script("bench/engine_variants.py")


def test_every_variant_is_a_valid_config_and_every_shape_is_in_the_preset(ev: Any) -> None:
    from mqa_core.bench import workloads as wl

    for config in ev.VARIANTS.values():
        for h in (32, 64):
            g.resolve_config(h, config if config is not None else dict(g.shape_config(1024, 1024, h, 132)))
    assert set(ev.SHAPES) <= {w.name for w in wl.engine_preset(True)}


def test_precheck_verdicts(ev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = ("noise\nPRECHECK ok today 1.0s \nPRECHECK bad dyn 2.0s packed x4: first call: 3 in-window cells are "
           "not finite\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    dropped = ev.run_precheck(["today", "dyn", "fill"], 10, lambda s: None)
    assert dropped == {"dyn": "packed x4: first call: 3 in-window cells are not finite", "fill": "not reached"}

    def hang(*a: Any, **k: Any) -> Any:
        raise subprocess.TimeoutExpired(a[0], 10, output=b"PRECHECK ok today 1.0s \n")

    monkeypatch.setattr(subprocess, "run", hang)
    dropped = ev.run_precheck(["today", "dyn"], 10, lambda s: None)
    assert list(dropped) == ["dyn"] and "ran past 10s" in dropped["dyn"]


def test_sweep_runs_on_the_cpu(ev: Any) -> None:
    rows = ev.sweep(["today", "rule"], None, torch.device("cpu"), "cpu", float("inf"), lambda s: None, {})
    assert len(rows) == 2 * len(ev.SHAPES) and all(r["status"] == "ok" for r in rows), rows
    text = ev.table(rows, ["today", "rule"])
    assert "do_bench median" in text and "fastest by graph replay" in text
    assert all(ev._short(r["workload"]) in text for r in rows)
