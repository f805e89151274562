"""bench/h200_launch.py's CPU mode (the host-only driver as an sm_90 device): every level of both
tables is timed, so the device script does not break unseen between device rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("paged", [False, True])
def test_launch_script_times_every_level_on_the_cpu(tmp_path: Path, paged: bool) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "h200_launch.py"), "--cpu", "--calls", "3", "--rounds", "1"]
    proc = subprocess.run(cmd + (["--paged"] if paged else []), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if paged:
        table = json.loads((tmp_path / "h200_launch_paged.json").read_text())["host_us"]
        levels = [f"{p} {lv}" for p in ("triton", "gluon") for lv in ("api", "provider", "prepared", "kernel")]
        assert sorted(table) == sorted(f"next_n={n} lens {k}" for n in (1, 2) for k in ("1-D", "2-D"))
        for case, row in table.items():
            assert all(row[name] > 0 for name in levels + ["torch.empty"]), (case, row)
    else:
        rows = json.loads((tmp_path / "h200_launch.json").read_text())["rows"]
        for name in ("gluon api", "gluon provider", "gluon object", "gluon bound", "triton provider", "triton bound",
                     "torch.empty"):
            assert rows[name]["host_us"] > 0, (name, rows.get(name))
