"""`mqa check` and `mqa bench` on the CPU: summaries, exit status, JSON rows, the plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mqa_core import DTYPE_PAIRS
from mqa_core.bench import report
from mqa_core.bench.runner import run_workloads
from mqa_core.bench.timing import Timing
from mqa_core.bench.workloads import PAGED, PRESETS, Workload, input_sets
from mqa_core.cli.main import main
from mqa_core.spec import Problem
from mqa_core.testing.providers import provider_named

WRONG_SCALE = {
    "wrong_scale_provider/__init__.py": """
        from mqa_core import ProviderSpec, hookimpl

        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name="wrong_scale", ops={"fp8_mqa_logits"}, archs={"cpu"},
                                 dtypes={"float8_e4m3fn"}, priority=-100,
                                 load="wrong_scale_provider.kernel:KERNEL")]
    """,
    "wrong_scale_provider/kernel.py": """
        import torch

        class Kernel:  # forgets k_scale
            def fp8_mqa_logits(self, q, kv, w, ks, ke, *, clean_logits=True):
                k = kv[0]
                s = torch.einsum("mhd,nd->mhn", q.float(), k.float()).clamp_min(0)
                out = torch.einsum("mhn,mh->mn", s, w)
                cols = torch.arange(k.shape[0])[None, :]
                inside = (cols >= ks.long()[:, None]) & (cols < ke.long()[:, None])
                return out.masked_fill(~inside, float("-inf"))

        KERNEL = Kernel()
    """,
}


@pytest.fixture
def wrong_scale(install_dist, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = install_dist("wrong-scale-provider", "1.0", WRONG_SCALE,
                        entry_points={"mqa_core.providers": {"wrong_scale": "wrong_scale_provider"}})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))))
    return site


def test_check_summarises_per_provider_and_fails_on_a_wrong_one(wrong_scale: Path) -> None:
    cmd = [sys.executable, "-m", "mqa_core.cli.main", "check", "--provider", "torch_ref",
           "--provider", "wrong_scale", "-k", "spec or selection or (window and causal)", "--json",
           "--mqa-seed", "7"]  # the spelling every failure message suggests works here too
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["seed"] == 7 and data["device"] == "cpu" and not data["passed"]
    ok, bad = data["providers"]["torch_ref"], data["providers"]["wrong_scale"]
    # spec and selection, then two window cases for each of the four (q, k) pairs torch_ref declares
    assert ok["failed"] == 0 and ok["passed"] == 2 + 2 * len(DTYPE_PAIRS), ok
    assert bad["failed"] == 2 and bad["passed"] == 2, bad
    msg = bad["failures"][0]["message"]
    assert "[wrong_scale] fp8_mqa_logits window=causal" in msg and "exceed the error bound" in msg
    assert "reproduce with --mqa-seed 7" in msg


def _mqa(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mqa_core.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_check_unknown_provider_is_one_line_and_exit_2() -> None:
    r = _mqa("check", "--provider", "nope")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("mqa: error: provider 'nope' is not installed; installed: ") and "torch_ref" in r.stderr


def test_check_unusable_provider_is_its_decision_row_and_exit_3() -> None:
    r = _mqa("check", "--provider", "torch_ref", MQA_DISABLE_PROVIDERS="torch_ref")
    assert r.returncode == 3 and r.stdout == "", r
    assert r.stderr.strip() == ("mqa: error: provider torch_ref (mqa-provider-torch-ref==" + _version("torch_ref")
                                + ", priority 0) cannot serve cpu: rejected [blocked] named in MQA_DISABLE_PROVIDERS "
                                  "(torch_ref)")  # the entry that blocks it: a name or distribution:name


def test_check_provider_for_another_arch_is_one_line(install_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first tutorial's mistake: a provider that claims only sm_90, checked on the CPU."""
    site = install_dist("hopper-only", "1.0", {"hopper_only.py": """
        from mqa_core import ProviderSpec, hookimpl

        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name="hopper_only", ops={"fp8_mqa_logits"}, archs={"sm_90"},
                                 dtypes={"float8_e4m3fn"}, priority=-5, load="hopper_only:KERNEL")]
    """}, entry_points={"mqa_core.providers": {"hopper_only": "hopper_only"}})
    r = _mqa("check", "--provider", "hopper_only", PYTHONPATH=str(site))
    assert r.returncode == 3 and r.stdout == "", r
    assert r.stderr.strip() == ("mqa: error: provider hopper_only (hopper-only==1.0, priority -5) cannot serve cpu: "
                                "rejected [arch] declares archs sm_90; asked for cpu")


def _version(name: str) -> str:
    from mqa_core.testing.providers import spec_named

    spec = spec_named(name)
    assert spec is not None
    return spec.version


def test_check_dtype_option_picks_one_pair() -> None:
    r = _mqa("check", "--provider", "torch_ref", "--dtype", "e4m3fnuz", "-k", "window and causal", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["dtype"] == "e4m3fnuz" and data["providers"]["torch_ref"]["passed"] == 2
    bad = _mqa("check", "--dtype", "e5m2")
    assert bad.returncode == 2 and "dtype 'e5m2' is not one of" in bad.stderr


def test_check_text_summary_and_unknown_provider(capsys: pytest.CaptureFixture[str]) -> None:
    from mqa_core.cli.check import render

    data = {"device": "cpu", "arch": "cpu", "seed": 3, "keyword": None, "collection_errors": [],
            "passed": False, "providers": {
                "a": {"passed": 5, "failed": 0, "skipped": 1, "seconds": 1.0, "failures": []},
                "b": {"passed": 1, "failed": 1, "skipped": 0, "seconds": 0.5,
                      "failures": [{"case": "test_x[b]", "message": "calc_diff 1e-01 >= 1e-03"}]}}}
    text = render(data)
    assert "a  PASS  5 passed, 0 failed, 1 skipped" in text
    assert "b  FAIL  1 passed, 1 failed" in text and "test_x[b]: calc_diff 1e-01" in text
    assert text.endswith("FAILED")


def test_bench_shape_json_plot_and_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "rows.jsonl", tmp_path / "chart.png"
    code = main(["bench", "--providers", "torch_ref", "--shape", "32,96,8,64", "--shape", "1,40,16,32",
                 "--repeat", "2", "--warmup", "0", "--baseline", "torch_ref", "--json", str(out),
                 "--plot", str(png)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "chosen: torch_ref" in captured.out  # the explain table comes before the numbers
    assert "causal M=32 N=96 H=8 D=64" in captured.out and "vs torch_ref" in captured.out
    assert "geomean over 2 workloads" in captured.out and "1.00x" in captured.out
    assert "[2/2] causal M=1 N=40 H=16 D=32 torch_ref: ok" in captured.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"ok"}
    row = rows[0]
    assert row["valid_pairs"] == sum(range(96 - 32 + 1, 96 + 1))  # causal suffix: row m sees N-M+m+1
    assert row["flops"] == 2 * 8 * 64 * row["valid_pairs"]
    for key in ("ms_median", "ms_p10", "ms_p90", "tflops", "device", "versions", "date", "commit",
                "calc_diff", "verified_against", "input_sets"):
        assert key in row
    assert row["versions"]["torch"] == torch.__version__ and "torch_ref" in row["versions"]["providers"]
    assert row["speedup"] == 1.0 and row["baseline"] == "torch_ref"
    assert row["timing"] == "per-call" and row["calls_per_sample"] == 1  # bench's default method, named
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table and the chart again from the saved rows, as after a run on a machine without matplotlib.
    png.unlink()
    assert main(["bench", "--from-json", str(out), "--plot", str(png)]) == 0
    replay = capsys.readouterr().out
    assert f"from {out}" in replay and "causal M=1 N=40 H=16 D=32" in replay and png.exists()


def test_bench_interleaved_timing_is_named_in_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.jsonl"
    assert main(["bench", "--providers", "torch_ref", "--shape", "16,48,8,64", "--repeat", "2", "--warmup", "0",
                 "--timing", "interleaved", "--json", str(out)]) == 0
    assert "median of 2 interleaved rounds of >= 1 ms batches" in capsys.readouterr().out
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "ok" and row["timing"] == "interleaved" and row["calls_per_sample"] >= 1


def test_bench_flags_a_wrong_provider(wrong_scale: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--providers", "torch_ref,wrong_scale", "--shape", "16,48,4,32",
                 "--repeat", "1", "--warmup", "0"])
    captured = capsys.readouterr()
    assert code == 1
    assert "wrong_scale: WRONG vs float64 oracle: calc_diff" in captured.err
    assert "WRONG" in captured.out  # the table row says so instead of a time


def test_bench_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["bench", "--shape", "4,8,1,32", "--plot", "x.png"]) == 2
    assert "pip install 'mqa-core[plot]'" in capsys.readouterr().err
    # With --json the rows are kept, so the run goes on and says how to draw the plot later.
    rows = tmp_path / "rows.jsonl"
    assert main(["bench", "--providers", "torch_ref", "--shape", "4,8,1,32", "--repeat", "1",
                 "--plot", str(tmp_path / "x.png"), "--json", str(rows)]) == 0
    assert f"mqa bench --from-json {rows} --plot" in capsys.readouterr().err
    assert rows.exists() and not (tmp_path / "x.png").exists()


def test_bench_unknown_provider(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--providers", "nope", "--shape", "4,8,1,32"]) == 2
    assert "'nope' is not installed" in capsys.readouterr().err


def test_paged_workload_runs_and_verifies() -> None:
    w = Workload(PAGED, Problem(2 * 2, 150, 8, 64), "decode", batch=2, next_n=2)
    provider = provider_named("torch_ref", "cpu", op=PAGED)
    rows = run_workloads([w], ["torch_ref"], {("torch_ref", PAGED): provider}, torch.device("cpu"), "cpu",
                         warmup=0, repeat=1)
    (row,) = rows
    assert row["status"] == "ok" and row["verified_against"] == "float64 oracle", row
    assert row["valid_pairs"] == 2 * (149 + 150) and row["calc_diff"] < 1e-9


def test_peak_memory_is_a_column_where_the_device_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's peak-memory counter around the checked call (faked here: a CPU has none) becomes each
    row's ``peak_mib`` and the table's ``peak MiB`` column; CPU rows hold None and the table omits it."""
    from mqa_core.bench import runner

    w = Workload(PAGED, Problem(2 * 2, 150, 8, 64), "decode", batch=2, next_n=2)
    provider = provider_named("torch_ref", "cpu", op=PAGED)
    args = ([w], ["torch_ref"], {("torch_ref", PAGED): provider}, torch.device("cpu"), "cpu")
    (row,) = run_workloads(*args, warmup=0, repeat=1)
    assert row["peak_mib"] is None and "peak MiB" not in report.table([row], ["torch_ref"], None)
    allocated = iter([3 * 2**20])
    monkeypatch.setattr(runner, "memory_mark", lambda device: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 7 * 2**20)
    (row,) = run_workloads(*args, warmup=0, repeat=1)
    text = report.table([row], ["torch_ref"], None)
    assert row["peak_mib"] == 4.0 and "peak MiB" in text.splitlines()[0] and " 4.0" in text.splitlines()[1], text


class _Doubled:
    """torch_ref's result times two: wrong, so it must be reported and never timed."""

    def fp8_mqa_logits(self, *args, **kw):
        from mqa_provider_torch_ref.kernels import KERNELS

        return KERNELS.fp8_mqa_logits(*args, **kw) * 2


def test_interleaved_timing_times_the_correct_providers_of_a_workload_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mqa_core import Provider, ProviderSpec
    from mqa_core.bench import runner

    seen: list[list[str]] = []
    real = runner.time_interleaved

    def spy(calls, *args, **kw):
        seen.append(list(calls))
        return real(calls, *args, **kw)

    monkeypatch.setattr(runner, "time_interleaved", spy)
    ref = provider_named("torch_ref", "cpu")
    off = Provider(ProviderSpec(name="off", ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                                priority=0, load="nowhere.off:KERNEL"), _Doubled())
    providers = {("torch_ref", "fp8_mqa_logits"): ref, ("twin", "fp8_mqa_logits"): ref,
                 ("off", "fp8_mqa_logits"): off}
    work = [Workload("fp8_mqa_logits", Problem(16, 48, 8, 64), "causal", True),
            Workload("fp8_mqa_logits", Problem(8, 32, 8, 64), "full", True)]
    rows = run_workloads(work, ["torch_ref", "off", "twin"], providers, torch.device("cpu"), "cpu",
                         warmup=1, repeat=3, timing="interleaved")
    assert seen == [["torch_ref", "twin"]] * 2  # one interleaved timing per workload, the wrong one left out
    by = {(r["workload"], r["provider"]): r for r in rows}
    for w in work:
        assert by[(w.name, "off")]["status"] == "wrong" and "ms_median" not in by[(w.name, "off")]
        for name in ("torch_ref", "twin"):
            r = by[(w.name, name)]
            assert r["status"] == "ok" and r["timing"] == "interleaved" and r["repeat"] == 3
            assert 1 <= r["calls_per_sample"] <= 256 and r["ms_p10"] <= r["ms_median"] <= r["ms_p90"]
    with pytest.raises(ValueError, match="timing must be one of per-call, interleaved"):
        run_workloads(work, ["torch_ref"], providers, torch.device("cpu"), "cpu", warmup=0, repeat=1,
                      timing="events")


def test_presets_match_the_issue() -> None:
    prefill = PRESETS["prefill"]()
    assert {(w.problem.m, w.problem.n, w.kind) for w in prefill} == {
        (4096, 16384, "suffix"), (8192, 8192, "causal"), (16384, 49152, "chunk"), (4096, 16384, "full")}
    assert {w.problem.h for w in prefill} == {32, 64} and {w.problem.d for w in prefill} == {128}
    chunk = next(w for w in prefill if w.kind == "chunk")  # too big to build here; its window rule:
    assert chunk.problem.n - chunk.problem.m == 32768  # causal suffix: ke = N - M + m + 1 = 32768 + m + 1
    decode = PRESETS["decode"]()
    assert {w.batch for w in decode} == {1, 32, 128} and {w.problem.n for w in decode} == {1024, 8192, 32768}
    assert {w.next_n for w in decode} == {1, 2}
    assert input_sets(PRESETS["quick"]()[0], torch.device("cpu")) >= 2


def test_report_peaks_speedups_and_table() -> None:
    assert report.fp8_peak("NVIDIA H200") == 1979.0
    assert report.fp8_peak("NVIDIA H100 PCIe") == 1513.0
    assert report.fp8_peak("AMD Instinct MI355X") == 5000.0
    assert report.fp8_peak("AMD Instinct MI300X") == 2615.0
    assert report.fp8_peak("AMD EPYC 7B13, 2 threads") is None
    rows = [{"provider": p, "workload": w, "status": "ok", "ms_median": ms, "ms_p10": ms, "ms_p90": ms,
             "tflops": 100 / ms, "pct_peak": None} for p, w, ms in
            (("a", "w1", 2.0), ("b", "w1", 1.0), ("a", "w2", 4.0), ("b", "w2", 1.0))]
    report.add_speedups(rows, "a")
    assert [r["speedup"] for r in rows] == [1.0, 2.0, 1.0, 4.0]
    s = report.summary(rows, ["a", "b"])
    assert s["b"]["speedup_geomean"] == pytest.approx(8 ** 0.5)
    text = report.table(rows, ["a", "b"], "a")
    assert "2.83x" in text and "geomean over 2 workloads" in text
    assert Timing((1.0, 2.0, 3.0, 4.0)).median == 2.5 and Timing((1.0, 3.0)).percentile(50) == 2.0


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "check" in out and "bench" in out


def test_check_fails_providers_that_alias_mutate_reuse_or_subclass(install_dist, monkeypatch) -> None:
    """Issue 37: four providers whose every logit is exact, each breaking one promise the ops make; the
    kit certified all of them before (258/258). Each now FAILS, saying what it did."""
    from kit_wrong_providers import UNSAFE, UNSAFE_KERNELS, UNSAFE_SPECS

    site = install_dist("unsafe-providers", "1.0", {"unsafe_providers/__init__.py": UNSAFE_SPECS,
                                                    "unsafe_providers/kernels.py": UNSAFE_KERNELS},
                        entry_points={"mqa_core.providers": {"unsafe": "unsafe_providers"}})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH")))))
    args = [a for name in UNSAFE for a in ("--provider", name)]
    r = _mqa("check", *args, "--provider", "torch_ref", "--dtype", "e4m3fn", "--json", "--seed", "5",
             "-k", "fresh or (prefill_window and edges) or paged_layout")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    got = {name: {f["case"].partition("[")[0]: f["message"] for f in row["failures"]}
           for name, row in data["providers"].items()}
    assert data["providers"]["torch_ref"]["failed"] == 0 and data["providers"]["torch_ref"]["passed"] == 6, data
    assert set(got["wrong_reuse"]) == {"test_prefill_fresh_output", "test_paged_fresh_output"}, got["wrong_reuse"]
    assert "hands back a buffer it writes again" in got["wrong_reuse"]["test_prefill_fresh_output"]
    mutate = got["wrong_mutate"]
    assert {"test_prefill_window", "test_paged_layout"} <= set(mutate), mutate
    assert "the provider wrote its input cu_seqlen_ks" in mutate["test_prefill_window"]
    assert "the provider wrote its input block_tables" in mutate["test_paged_layout"]
    for name, words in (("wrong_view", "the output overlaps input"), ("wrong_subclass", "a subclass of it")):
        assert data["providers"][name]["passed"] == 0, (name, data["providers"][name])
        assert all(words in m for m in got[name].values()), (name, got[name])
