"""The profiling scripts' reports, on the CPU: bench/ncu_stalls.py on a CSV shaped like Nsight Compute's
source page (per-kernel stall shares, the lines with the most samples) and bench/h200_decode_trace.py's
report on trace rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from repo_scripts import load_script

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "# Samples", "stall_barrier", "stall_long_sb",
          "stall_math"]


def _write(path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "kernel_a"])
        w.writerow(HEADER)
        w.writerow(["0x10", "BAR.SYNC 0x1", "30", "30", "30", "", ""])
        w.writerow(["0x20", "FFMA R1, R2, R3, R4", "10", "10", "", "", "10"])
        w.writerow(["0x30", "@!P0 BRA 0x10", "60", "60", "", "45", "15"])
        w.writerow(["Kernel Name", "kernel_b"])
        w.writerow(HEADER)
        w.writerow(["0x10", "EXIT", "4", "4", "", "4", ""])


def test_stall_shares_and_top_lines(tmp_path: Path) -> None:
    stalls = load_script("bench/ncu_stalls.py")
    path = tmp_path / "src.csv"
    _write(path)
    kernels = stalls.read(str(path))
    assert [k.name for k in kernels] == ["kernel_a", "kernel_b"] and len(kernels[0].rows) == 3
    out = stalls.summary(kernels[0], top=2)
    assert out[0] == "== kernel_a: 100 samples over 3 instructions"
    shares = {line.split()[0]: line.split()[1] for line in out[1:4]}
    assert shares == {"stall_long_sb": "45.0%", "stall_barrier": "30.0%", "stall_math": "25.0%"}
    assert "60.0%" in out[4] and "BRA" in out[4] and "'stall_long_sb': 45" in out[4]
    assert "30.0%" in out[5] and "BAR.SYNC" in out[5] and len(out) == 6


def test_a_csv_without_source_counters_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stalls = load_script("bench/ncu_stalls.py")
    path = tmp_path / "empty.csv"
    path.write_text('"ID","Kernel"\n')
    monkeypatch.setattr("sys.argv", ["ncu_stalls.py", str(path)])
    assert stalls.main() == 1
    assert "SourceCounters" in capsys.readouterr().out


def test_trace_report_gives_balance_and_cycles_per_tile(capsys: pytest.CaptureFixture[str]) -> None:
    """bench/h200_decode_trace.py's report on two programs' trace rows (TRACE_EVENTS' columns)."""
    pytest.importorskip("mqa_provider_gluon")
    trace = load_script("bench/h200_decode_trace.py")

    def row(start_ns: int, end_ns: int, sm: int, data: int) -> list[int]:
        r = [0] * 32
        r[0], r[1], r[11] = start_ns, 1000, end_ns  # ns, cycles, ns
        r[6], r[7] = 1500, 1000 + 2 * (end_ns - start_ns)  # wg0's first tile ready, done (cycles, 2 GHz)
        r[12], r[14], r[15] = 40, sm, 400  # tiles, SM, loader's cycles waiting for free slots
        r[16], r[17], r[18], r[19] = data, 2000, 3000, 10  # wg0: data, wgmma, epilogue cycles; its tiles
        return r

    trace.report([row(100, 5100, 3, 1000), row(100, 6100, 3, 3000)], "demo")
    out = capsys.readouterr().out
    assert "demo: clock 2.00 GHz, first start to last end 6000 ns" in out
    assert "max     6000 ns; SMs used 1, shared by 2+ programs 1" in out
    assert "data 200, wgmma 200, epilogue 300; loader waits 10 per tile" in out


def test_power_samples_are_parsed_and_summarised() -> None:
    """bench/h200_power.py's reading of nvidia-smi's CSV: non-sample lines left out, medians per field,
    the throttle reasons seen."""
    power = load_script("bench/h200_power.py")
    out = ("1440, 691.2, 51, 0x0000000000000004\n"
           "WARNING: something nvidia-smi printed\n"
           "1380, 690.0, 52, 0x0000000000000000\n"
           "1455, 693.1, 53, 0x0000000000000004\n"
           "1455, 69")  # the last line, cut when the sampler was stopped
    rows = power.parse(out)
    assert len(rows) == 3
    assert power.medians(rows) == (1440.0, 691.2, 52.0, ["0x0000000000000000", "0x0000000000000004"])
