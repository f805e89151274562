"""The `engine` bench preset, the host-cost measurement and bench/h200_engine.py, on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from repo_scripts import load_script

from mqa_core.bench import report
from mqa_core.bench.host import HostCost, host_costs, host_rows
from mqa_core.bench.workloads import PREFILL, PRESETS, Workload, engine_preset, host_cost_workload, input_sets
from mqa_core.cli.main import main
from mqa_core.reference import fp8_mqa_logits_ref
from mqa_core.spec import Problem
from mqa_core.testing.data import calc_diff
from mqa_core.testing.providers import provider_named

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _packed(*requests: tuple[int, int], h: int = 8, d: int = 32) -> Workload:
    m, n = sum(q for q, _ in requests), sum(k for _, k in requests)
    return Workload(PREFILL, Problem(m, n, h, d), "packed", requests=tuple(requests))


def test_engine_preset_covers_what_engines_send() -> None:
    work = PRESETS["engine"]()
    assert len({w.name for w in work}) == len(work)  # rows are keyed by name
    assert {w.problem.h for w in work} == {32, 64} and {w.problem.d for w in work} == {128}
    shapes = {(w.kind, w.problem.m, w.problem.n, w.problem.h) for w in work}
    assert ("causal", 1024, 1024, 64) in shapes and ("chunk", 256, 65536, 64) in shapes  # issue 14's goals
    assert ("suffix", 128, 2048, 64) in shapes  # the host-cost shape, timed too
    small = [w for w in work if w.kind == "suffix" and w.problem.m <= 1024 and w.problem.n <= 8192]
    assert len(small) >= 3 and {w.problem.m for w in small} >= {128, 1024}
    packed = [w for w in work if w.kind == "packed"]
    assert len(packed) >= 3 and all(len({q for q, _ in w.requests}) > 1 for w in packed)  # unequal lengths
    assert any(q < k for w in packed for q, k in w.requests)  # requests with a cached prefix
    assert any(w.kind == "chunk" and w.problem.n >= 16 * w.problem.m for w in work)  # last chunk: M << N
    assert any(w.problem.m * w.problem.n >= 2**26 for w in work)  # large shapes, for regressions
    for w in (w for w in work if w.kind == "sliding"):
        ks, ke = w.windows()
        assert bool(((ke - ks) == w.window).all()) and int(ks.min()) > 0  # every row exactly W, off key 0


def test_packed_windows_follow_each_request() -> None:
    w = _packed((2, 5), (3, 3), (1, 4))
    ks, ke = w.windows()
    # request 0 holds keys 0..4 and is queried at its last 2 positions; request 1 keys 5..7, all
    # queried; request 2 keys 8..11, its last position queried
    assert ks.tolist() == [0, 0, 5, 5, 5, 8] and ke.tolist() == [4, 5, 6, 7, 8, 12]
    # The packed call equals each request computed alone with its own causal suffix window.
    x = w.setup(CPU, 3)
    got = w.float64_reference(x)
    want = torch.full((6, 12), float("-inf"), dtype=got.dtype)
    row = key = 0
    for q, k in w.requests:
        alone_ks = torch.zeros(q, dtype=torch.int32)
        alone_ke = (torch.arange(q) + (k - q) + 1).to(torch.int32)
        want[row:row + q, key:key + k] = fp8_mqa_logits_ref(
            x.q[row:row + q].double(), x.k[key:key + k].double(), x.k_scale[key:key + k],
            x.weights[row:row + q], alone_ks, alone_ke)
        row, key = row + q, key + k
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)])
    assert x.valid_pairs == (4 + 5) + (1 + 2 + 3) + 4


def test_workloads_reject_inconsistent_shapes() -> None:
    with pytest.raises(ValueError, match="packed requests hold 3 queries and 8 keys; the problem says M=4 N=8"):
        Workload(PREFILL, Problem(4, 8, 8, 32), "packed", requests=((1, 4), (2, 4)))
    with pytest.raises(ValueError, match="1 <= queries <= keys"):
        Workload(PREFILL, Problem(5, 4, 8, 32), "packed", requests=((5, 4),))
    with pytest.raises(ValueError, match="window >= 1"):
        Workload(PREFILL, Problem(4, 8, 8, 32), "sliding")
    with pytest.raises(ValueError, match="window is for kind 'sliding', not 'causal'"):
        Workload(PREFILL, Problem(4, 8, 8, 32), "causal", window=3)
    with pytest.raises(ValueError, match="kind must be one of"):
        Workload(PREFILL, Problem(4, 8, 8, 32), "diagonal")


@pytest.mark.parametrize("factor", [1, 7, 64])
def test_scaled_keeps_the_structure(factor: int) -> None:
    for w in engine_preset():
        s = w.scaled(factor)
        assert (s.kind, s.problem.h, s.problem.d, len(s.requests)) == (w.kind, w.problem.h, w.problem.d,
                                                                      len(w.requests))
        assert s.problem.m == -(-w.problem.m // factor) or w.kind == "packed"
        assert s.problem.m <= s.problem.n and (factor > 1 or s == w)
        ks, ke = s.windows()
        assert bool((ke > ks).all()) and int(ke.max()) <= s.problem.n  # no empty or overhanging row
    with pytest.raises(ValueError, match="scale factor must be >= 1"):
        engine_preset()[0].scaled(0)
    assert host_cost_workload(scale=64).problem == Problem(2, 32, 64, 128)


def test_input_sets_outgrow_l2_for_small_calls() -> None:
    small = host_cost_workload()
    assert input_sets(small, torch.device("cuda")) * small.input_bytes() > 50 * 2**20  # an H200's L2
    assert input_sets(small, CPU) == 4


def test_host_costs_count_calls_and_interleave_rounds() -> None:
    order: list[str] = []
    fns = {"fast": lambda: order.append("fast"), "slow": lambda: (order.append("slow"), time.sleep(0.002))}
    costs = host_costs(fns, lambda: None, calls=4, rounds=3, warmup=2)
    assert order.count("fast") == order.count("slow") == 2 + 4 * 3
    timed = order[4:]  # after the warm-up: rounds alternate the two callables, 4 calls each
    assert timed[:8] == ["fast"] * 4 + ["slow"] * 4 and timed[8:16] == ["fast"] * 4 + ["slow"] * 4
    assert all(isinstance(c, HostCost) and len(c.host_us) == 3 for c in costs.values())
    assert costs["slow"].median >= 2000 > costs["fast"].median  # microseconds per call
    assert costs["slow"].wall_median >= costs["slow"].median
    with pytest.raises(ValueError, match="calls and rounds must be >= 1"):
        host_costs(fns, lambda: None, calls=0, rounds=1)


def test_host_rows_check_every_level_first() -> None:
    w = Workload(PREFILL, Problem(8, 40, 16, 32), "suffix")
    provider = provider_named("torch_ref", "cpu")
    (row,) = host_rows(w, ["torch_ref"], {("torch_ref", PREFILL): provider}, CPU, "cpu", calls=3, rounds=2)
    assert row["status"] == "ok" and row["record"] == "host" and row["verified_against"] == "float64 oracle"
    assert row["calc_diff"] < 1e-9 and row["device_us"] is None and row["gpu_kept_up"] is None
    assert all(row[f"host_us_{lv}"] > 0 for lv in ("api", "provider", "kernel"))


class _WrongKernel:  # forgets k_scale: every level that reaches it is wrong
    def __init__(self) -> None:
        self.ref = provider_named("torch_ref", "cpu").impl

    def fp8_mqa_logits(self, q, kv, w, ks, ke, *, clean_logits=True):  # type: ignore[no-untyped-def]
        k = kv[0]
        return self.ref.fp8_mqa_logits(q, (k, torch.ones(k.shape[0])), w, ks, ke, clean_logits=clean_logits)


def test_host_rows_report_a_wrong_provider_instead_of_timing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    w = Workload(PREFILL, Problem(8, 40, 16, 32), "suffix")
    provider = provider_named("torch_ref", "cpu")
    monkeypatch.setattr(provider, "impl", _WrongKernel())
    (row,) = host_rows(w, ["torch_ref"], {("torch_ref", PREFILL): provider}, CPU, "cpu", calls=3, rounds=1)
    # the api level reaches the real torch_ref through the selection; the provider level is the first wrong
    assert row["status"] == "wrong" and row["reason"].startswith("Provider.fp8_mqa_logits: calc_diff")
    assert "host_us_api" not in row


def test_engine_preset_runs_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine.jsonl"
    code = main(["bench", "--preset", "engine", "--providers", "torch_ref", "--scale", "64", "--repeat", "1",
                 "--warmup", "0", "--host-calls", "2", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "packed x8 M=128 N=128 H=64 D=128" in captured.out and "sliding W=32" in captured.out
    assert "host us per call on suffix M=2 N=32 H=64 D=128" in captured.out
    assert "API us  Provider us  kernel object us" in captured.out
    assert "graph ms" not in captured.out  # no CUDA graphs on a CPU
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    timed, host = report.timed(rows), report.host(rows)
    assert len(timed) == len(engine_preset()) and {r["status"] for r in timed} == {"ok"}
    assert {r["verified_against"] for r in timed} == {"float64 oracle"}
    assert len(host) == 1 and host[0]["status"] == "ok" and host[0]["host_us_kernel"] > 0
    packed = next(r for r in timed if r["kind"] == "packed" and r["requests"] == 8)
    assert packed["valid_pairs"] == sum(n * (n + 1) // 2 for n in (16, 8, 32, 4, 2, 48, 12, 6))
    # Replayed from the file: both tables again; the host row does not shadow the timed row of its shape.
    assert main(["bench", "--from-json", str(out)]) == 0
    replay = capsys.readouterr().out
    assert "suffix M=2 N=32 H=64 D=128" in replay and "kernel object us" in replay
    assert len(report.read_jsonl(str(out))) == len(rows)


def test_deepgemm_stand_in_enforces_deepgemms_argument_checks() -> None:
    dg = load_script("bench/h200_engine.py").StandInDeepGemm()
    w = Workload(PREFILL, Problem(6, 300, 32, 64), "suffix")
    x = w.setup(CPU, 0)
    out = dg.fp8_mqa_logits(x.q, (x.k, x.k_scale), x.weights, x.ks, x.ke, True, 0)
    assert out.shape == (6, 300) and out.stride() == (768, 1)  # DeepGEMM's align(N + 256, 256) rows
    ref = w.float64_reference(x)
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and calc_diff(out, ref) < 1e-9
    with pytest.raises(RuntimeError, match=r"k_scale \[N\] contiguous float32"):
        dg.fp8_mqa_logits(x.q, (x.k, x.k_scale[:, None]), x.weights, x.ks, x.ke, True, 0)
    with pytest.raises(RuntimeError, match=r"ks, ke \[M\] contiguous int32"):
        dg.fp8_mqa_logits(x.q, (x.k, x.k_scale), x.weights, x.ks.long(), x.ke, True, 0)
    h16 = Workload(PREFILL, Problem(6, 300, 16, 64), "suffix").setup(CPU, 0)
    with pytest.raises(RuntimeError, match=r"H in \(32, 64\)"):
        dg.fp8_mqa_logits(h16.q, (h16.k, h16.k_scale), h16.weights, h16.ks, h16.ke, True, 0)


def test_h200_script_cpu_smoke(tmp_path: Path) -> None:
    """The device script's whole path (checks, timing, torch.compile, tables, JSON) on the CPU."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "h200_engine.py"), "--cpu-smoke", "--out",
                           str(tmp_path), "--host-calls", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tail = proc.stdout[proc.stdout.index("engine preset (CPU smoke"):]
    assert "torch_ref/DG" in tail and "packed x32 M=185 N=185 H=32 D=128" in tail
    assert "the same in torch.compile(fullgraph=True)" in tail and "DeepGEMM: its whole call" in tail
    rows = [json.loads(line) for line in (tmp_path / "engine.jsonl").read_text().splitlines()]
    assert {r["provider"] for r in rows} == {"torch_ref", "DeepGEMM"}
    assert {r["status"] for r in rows} == {"ok"} and len(report.timed(rows)) == 2 * len(engine_preset())
    host = {r["provider"]: r for r in report.host(rows)}
    assert all(host["torch_ref"][f"host_us_{lv}"] > 0 for lv in ("api", "provider", "kernel", "torch_op", "compiled"))
    assert host["DeepGEMM"]["host_us_api"] > 0 and "host_us_kernel" not in host["DeepGEMM"]
    assert all(r["versions"]["torch"] == torch.__version__ and r["smoke"] for r in rows)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_engine_preset_on_a_gpu_times_graphs_and_the_host(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine.jsonl"
    code = main(["bench", "--preset", "engine", "--scale", "16", "--providers", "gluon,torch_ref",
                 "--repeat", "3", "--warmup", "1", "--host-calls", "50", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "graph ms" in captured.out and "GPU kept up" in captured.out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    gluon = [r for r in report.timed(rows) if r["provider"] == "gluon"]
    assert len(gluon) == len(engine_preset()) and all(r["status"] == "ok" and r["graph_ms"] > 0 for r in gluon)
    ref = [r for r in report.timed(rows) if r["provider"] == "torch_ref"]
    assert all(r["graph_ms"] is None and "synchronises with the host" in r["graph_note"] for r in ref)
    host = {r["provider"]: r for r in report.host(rows)}
    assert host["gluon"]["status"] == "ok" and host["gluon"]["device_us"] > 0
    assert host["gluon"]["gpu_kept_up"] in (True, False) and host["torch_ref"]["device_us"] is None
