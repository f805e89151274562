"""``mqa tune`` end to end on the CPU, and ``MQA_TUNING`` driving ``mqa explain`` in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_scripts import ROOT, load_script

from mqa_core import Problem
from mqa_core.cli.main import main
from mqa_core.cli.tune import TuneShape, engine_preset
from mqa_core.tuning import load_tuning


def mqa(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MQA_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "mqa_core.cli.main", *args], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """The done-when command, run once as a user would."""
    where = tmp_path_factory.mktemp("tune")
    r = mqa("tune", "--device", "cpu", "--providers", "torch_ref,example_chunked", "--preset", "quick",
            "--out", "t.json", cwd=where)
    assert r.returncode == 0, r.stderr
    assert "wrote t.json: use it with MQA_TUNING=t.json" in r.stdout
    assert "picks: " in r.stdout and "[########################] 8/8" in r.stderr  # summary, progress
    assert "first by priority (torch_ref, example_chunked) when the fastest leads it by at most the " \
           "table's 5% margin" in r.stdout
    return where / "t.json"


def test_tune_writes_a_stamped_table_with_every_provider_in_every_bucket(tuned):
    data = json.loads(tuned.read_text())
    stamp = data["stamp"]
    assert stamp["arch"] == "cpu" and stamp["device_name"]
    assert set(stamp["versions"]) >= {"torch", "triton", "mqa-core", "mqa-provider-torch-ref",
                                      "mqa-provider-example-chunked"}
    assert stamp["providers"] == {"torch_ref": "mqa-provider-torch-ref",
                                  "example_chunked": "mqa-provider-example-chunked"}
    # the providers of a shape timed in the same rounds; no CUDA graphs on a CPU, so decode too
    assert data["arguments"]["timing"] == {"fp8_mqa_logits": "interleaved", "fp8_paged_mqa_logits": "interleaved"}
    assert data["arguments"]["replay"] == "auto"
    assert data["margin"] == 0.05  # --margin's default, written for selection
    assert len(data["entries"]) == 4
    for e in data["entries"]:
        assert set(e["times_ms"]) == set(e["status"]) == {"torch_ref", "example_chunked"}
        assert e["times_ms"]["torch_ref"] > 0 and e["status"]["torch_ref"] == "ok"
        if e["op"] == "fp8_paged_mqa_logits":
            assert e["times_ms"]["example_chunked"] is None
            assert e["status"]["example_chunked"] == "unsupported: does not declare fp8_paged_mqa_logits"
            assert e["next_n"] in (1, 2)
        else:
            assert e["times_ms"]["example_chunked"] > 0 and e["next_n"] is None
        assert e["winner"] == e["ranking"][0]
    assert load_tuning(str(tuned)).entries  # and it loads


def _explain(shape: str, path: Path, op: str = "fp8_mqa_logits") -> dict:
    r = mqa("explain", "--arch", "cpu", "--op", op, "--shape", shape, "--json", env={"MQA_TUNING": str(path)})
    assert r.returncode == 0, r.stderr
    return {"stderr": r.stderr, **json.loads(r.stdout)}


def test_explain_follows_the_table(tuned, tmp_path):
    data = json.loads(tuned.read_text())
    big = next(e for e in data["entries"] if e["op"] == "fp8_mqa_logits" and e["m"] == [256, 512])
    d = _explain("300,1100,32,128", tuned)
    t = big["times_ms"]  # torch_ref is first by priority: kept unless example_chunked leads by > 5%
    assert d["chosen"] == ("torch_ref" if t["torch_ref"] <= t["example_chunked"] * 1.05 else "example_chunked")
    assert str(tuned) in d["why"] and "ms" in d["why"]
    # The same file with the other provider measured faster: the choice follows the numbers.
    big["times_ms"] = {"torch_ref": 9.0, "example_chunked": 1.0}
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps(data))
    d = _explain("300,1100,32,128", flipped)
    assert d["chosen"] == "example_chunked"
    assert "example_chunked 1 ms, torch_ref 9 ms" in d["why"]
    assert _explain("300,5000,32,128", flipped)["chosen"] == "torch_ref"  # outside the table: priority
    paged = _explain("4,300,32,128", flipped, op="fp8_paged_mqa_logits")
    assert paged["chosen"] == "torch_ref" and str(flipped) in paged["why"]


def test_the_same_file_gives_the_same_choice_in_every_process(tuned, tmp_path):
    data = json.loads(tuned.read_text())
    for e in data["entries"]:  # a tie: within any margin, so priority decides in every process
        e["times_ms"] = {k: (1.0 if v is not None else None) for k, v in e["times_ms"].items()}
    tie = tmp_path / "tie.json"
    tie.write_text(json.dumps(data))
    seen = {(d["chosen"], d["why"]) for d in (_explain("100,300,32,128", tie) for _ in range(3))}
    assert seen == {("torch_ref", f"torch_ref (priority) kept: example_chunked's lead 0.0% is within the table's "
                                  f"5% margin; measured in {tie} for bucket fp8_mqa_logits H=32 D=128 M in "
                                  "[64, 128) N in [256, 512): example_chunked 1 ms, torch_ref 1 ms")}


def test_the_margin_in_the_file_decides_in_a_fresh_process(tuned, tmp_path):
    data = json.loads(tuned.read_text())
    big = next(e for e in data["entries"] if e["op"] == "fp8_mqa_logits" and e["m"] == [256, 512])
    big["times_ms"] = {"torch_ref": 1.1, "example_chunked": 1.0}  # a 10% lead
    for margin, expect in ((0.05, "example_chunked"), (0.2, "torch_ref"), (0, "example_chunked")):
        data["margin"] = margin
        path = tmp_path / f"m{margin}.json"
        path.write_text(json.dumps(data))
        d = _explain("300,1100,32,128", path)
        assert d["chosen"] == expect, d
        assert f"the table's {margin * 100:g}% margin" in d["why"]
    data["margin"] = 1.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = mqa("explain", "--arch", "cpu", "--shape", "300,1100,32,128", env={"MQA_TUNING": str(bad)})
    assert r.returncode != 0 and f"invalid tuning table {bad}: margin must be a number in [0, 1)" in r.stderr


def test_tune_writes_the_margin_and_help_says_why(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["tune", "--device", "cpu", "--providers", "torch_ref,example_chunked", "--shapes",
                 "prefill:32,64,32,128", "--repeat", "1", "--warmup", "0", "--margin", "0.125",
                 "--out", str(out)]) == 0
    assert load_tuning(str(out)).margin == json.loads(out.read_text())["margin"] == 0.125
    assert "table's 12.5% margin (--margin" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--margin FRACTION" in text and "within timing noise must not override the priority order" in text


def test_a_stamp_from_elsewhere_is_ignored_with_one_warning(tuned, tmp_path):
    data = json.loads(tuned.read_text())
    data["stamp"]["versions"]["torch"] = "1.0.0"
    for e in data["entries"]:
        e["times_ms"]["example_chunked"] = 0.001 if e["times_ms"]["example_chunked"] else None
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(data))
    d = _explain("100,300,32,128", stale)
    assert d["chosen"] == "torch_ref" and str(stale) not in d["why"]
    lines = [ln for ln in d["stderr"].splitlines() if "tuning table" in ln]
    assert len(lines) == 1, d["stderr"]
    assert f"tuning table {stale} (MQA_TUNING) does not match this environment (torch " in lines[0]
    assert "here vs 1.0.0 in the table" in lines[0]


@pytest.mark.parametrize("args, says", [
    (["--shapes", "prefill:1,2,3"], "--shapes: cannot read 'prefill:1,2,3'"),
    (["--shapes", "decode:1,2,3,4,5:causal"], "--shapes: cannot read"),
    (["--providers", "nope"], "provider 'nope' is not installed"),
    (["--device", "banana"], "--device 'banana' is not a torch device"),
    (["--repeat", "0"], "--repeat must be >= 1"),
    (["--margin", "1"], "--margin must be a fraction in [0, 1) (0.05 = 5%), got 1"),
    (["--margin", "-0.1"], "--margin must be a fraction in [0, 1)"),
])
def test_user_errors_are_one_line(capsys, tmp_path, args, says):
    assert main(["tune", "--device", "cpu", "--out", str(tmp_path / "x.json"), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_shapes_and_presets():
    s = TuneShape.parse("decode:32,8192,2,64,128")
    assert (s.op, s.problem.m, s.problem.n, s.batch, s.next_n) == ("fp8_paged_mqa_logits", 64, 8192, 32, 2)
    assert s.bucket().next_n == 2 and s.name == "decode B=32 next_n=2 ctx=8192 H=64 D=128"
    assert TuneShape.parse("prefill:4096,16384,64,128:full").kind == "full"
    shapes = engine_preset()
    buckets = [s.bucket() for s in shapes]
    assert len(set(buckets)) == 40 and len(buckets) == 80
    per_bucket = {b: [s for s in shapes if s.bucket() == b] for b in buckets}
    for b, group in per_bucket.items():  # prefill: the bucket's corners, one window kind; decode: one shape
        if b.op == "fp8_mqa_logits":
            assert len({s.kind for s in group}) == 1
            cells = {(s.problem.m >= 1.5 * b.m[0], s.problem.n >= 1.5 * b.n[0]) for s in group}
            lo_n_top_m_fits = group[0].kind == "full" or 1.5 * b.m[0] < b.n[0]
            assert cells == {(False, False), (False, True), (True, True)} | ({(True, False)} if lo_n_top_m_fits
                                                                             else set()), b
            assert all(s.problem.m <= s.problem.n or s.kind == "full" for s in group)
        else:
            assert len(group) == 1


class _Off:
    """A provider kernel 10% off in every in-window cell (real arithmetic, wrong result)."""

    def fp8_mqa_logits(self, *args, **kw):
        from mqa_provider_torch_ref.kernels import KERNELS

        return KERNELS.fp8_mqa_logits(*args, **kw) * 1.1


def test_a_wrong_provider_is_caught_by_the_kit_subset_and_left_out_of_the_table():
    import torch

    from mqa_core import Provider, ProviderSpec
    from mqa_core.cli.tune import Progress, build_table, kit_check, measure
    from mqa_core.testing.providers import provider_named
    from mqa_core.tuning import current_stamp

    spec = ProviderSpec(name="off", ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                        priority=5, load="nowhere.off:KERNEL")
    off = Provider(spec, _Off())
    cpu = torch.device("cpu")
    reason = kit_check(off, "fp8_mqa_logits", 32, 64, cpu, seed=1)
    assert reason is not None and "[off] fp8_mqa_logits window=ragged" in reason, reason
    assert "reproduce with mqa tune --seed 1" in reason and "in-window cells exceed the error bound" in reason, reason
    ref = provider_named("torch_ref", "cpu")
    assert kit_check(ref, "fp8_mqa_logits", 32, 64, cpu, seed=1) is None
    shapes = [TuneShape.prefill(32, 128, 32, 64), TuneShape.decode(2, 128, 1, 32, 64)]
    providers = {("torch_ref", "fp8_mqa_logits"): ref, ("off", "fp8_mqa_logits"): off,
                 ("torch_ref", "fp8_paged_mqa_logits"): provider_named("torch_ref", "cpu", op="fp8_paged_mqa_logits")}
    results = measure(shapes, ["torch_ref", "off"], providers, cpu, "cpu", warmup=0, repeat=1, seed=0,
                      progress=Progress(4))
    assert results[0]["off"].ms is None and results[0]["off"].status.startswith("wrong: kit subset failed: [off]")
    assert results[0]["torch_ref"].ms and results[0]["torch_ref"].status == "ok"
    assert results[1]["off"].status == "unsupported: does not declare fp8_paged_mqa_logits"
    table = build_table(shapes, ["torch_ref", "off"], results, current_stamp(cpu, {}), {})
    assert [e.ranking for e in table.entries] == [("torch_ref",), ("torch_ref",)]


class _LastColumn:
    """A decode kernel that reads only the last column of 2-D lengths (real arithmetic, wrong rows)."""

    def fp8_paged_mqa_logits(self, q, kv_cache, weights, context_lens, *args, **kw):
        from mqa_provider_torch_ref.kernels import KERNELS

        lens = context_lens[:, -1] if context_lens.dim() == 2 else context_lens
        return KERNELS.fp8_paged_mqa_logits(q, kv_cache, weights, lens, *args, **kw)


def test_the_kit_subset_checks_decode_with_arbitrary_2d_lengths():
    import torch

    from mqa_core import Provider, ProviderSpec
    from mqa_core.cli.tune import kit_check
    from mqa_core.testing.providers import provider_named

    op = "fp8_paged_mqa_logits"
    spec = ProviderSpec(name="lastcol", ops={op}, archs={"cpu"}, dtypes={"float8_e4m3fn"}, priority=5,
                        load="nowhere.lastcol:KERNEL")
    cpu = torch.device("cpu")
    reason = kit_check(Provider(spec, _LastColumn()), op, 32, 64, cpu, seed=3)
    assert reason is not None and "[lastcol] fp8_paged_mqa_logits batch=3 next_n=2" in reason, reason
    assert "context_lens=[B, next_n]=" in reason and "reproduce with mqa tune --seed 3" in reason, reason
    assert kit_check(provider_named("torch_ref", "cpu", op=op), op, 32, 64, cpu, seed=3) is None


def test_the_h200_mix_lies_in_the_engine_buckets_but_off_the_tuned_shapes():
    script = load_script("bench/h200_tuned.py")
    tuned = {s.bucket(): s for s in engine_preset()}
    shapes = script.mix()
    inside = [s for s in shapes if s.bucket() in tuned]
    assert len(inside) == len(shapes) - 2  # two shapes outside every bucket, on purpose
    assert not {(s.op, s.problem) for s in shapes} & {(s.op, s.problem) for s in engine_preset()}


def test_the_h200_measuring_path_runs_on_the_cpu(tuned, monkeypatch):
    import torch

    script = load_script("bench/h200_tuned.py")
    configs = {"tuned": {"MQA_TUNING": str(tuned), "MQA_PROVIDER": None},
               "torch_ref-only": {"MQA_PROVIDER": "torch_ref", "MQA_TUNING": None},
               "example_chunked-only": {"MQA_PROVIDER": "example_chunked", "MQA_TUNING": None}}
    switched: list[str | None] = []
    real = script.environment

    def spy(**env):  # which configuration each timed batch (and each check) ran under
        switched.append(env.get("MQA_PROVIDER") or "tuned")
        return real(**env)

    monkeypatch.setattr(script, "environment", spy)
    row = script.measure(TuneShape.prefill(100, 300, 32, 128), configs, torch.device("cpu"), "cpu",
                         warmup=0, rounds=2)
    assert set(row["status"].values()) == {"ok"}, row
    assert row["tuned_pick"] in ("torch_ref", "example_chunked") and row["tuned_vs_best"] > 0
    assert set(row["ms"]) == set(row["calls_per_round"]) == set(configs)
    # three checks, one warm-up/sizing scope per configuration, then the configurations in turn per round
    assert switched == ["tuned", "torch_ref", "example_chunked"] * 4, switched
    paged = script.measure(TuneShape.decode(2, 300, 1, 32, 128), configs, torch.device("cpu"), "cpu",
                           warmup=0, rounds=1)
    assert paged["status"]["example_chunked-only"].startswith("ERROR ProviderUnavailableError")
    assert paged["tuned_pick"] == "torch_ref" and paged["best_single"] == "torch_ref-only"


def test_the_h200_mix_replays_decode_under_each_configuration(tuned, monkeypatch):
    """Decode shapes of the mix are timed by graph replay (CUDA only, so faked here): each
    configuration's calls run under its own settings; one that cannot be captured says why."""
    from mqa_core.bench.timing import Timing

    script = load_script("bench/h200_tuned.py")
    configs = {"tuned": {"MQA_TUNING": str(tuned), "MQA_PROVIDER": None},
               "torch_ref-only": {"MQA_PROVIDER": "torch_ref", "MQA_TUNING": None}}
    captured: list[str] = []

    def fake_graph_time(call, sets, device):  # what graph_time needs: every set once, here eagerly
        for x in sets:
            call(x)
        captured.append(os.environ.get("MQA_PROVIDER") or "tuned")
        if os.environ.get("MQA_PROVIDER") == "torch_ref":
            return None, "not captured in a CUDA graph: it synchronises with the host"
        return Timing((0.02, 0.01, 0.03)), ""

    monkeypatch.setattr(script, "replayed", lambda op, replay, device: op == "fp8_paged_mqa_logits")
    monkeypatch.setattr(script, "graph_time", fake_graph_time)
    row = script.measure(TuneShape.decode(2, 300, 1, 32, 128), configs, torch.device("cpu"), "cpu",
                         warmup=0, rounds=1)
    assert row["timing"] == "graph replay" and captured == ["tuned", "torch_ref"]
    assert row["ms"] == {"tuned": 0.02} and row["status"]["tuned"] == "ok"
    assert row["status"]["torch_ref-only"] == ("not capturable: not captured in a CUDA graph: it synchronises "
                                               "with the host")
    prefill = script.measure(TuneShape.prefill(100, 300, 32, 128), configs, torch.device("cpu"), "cpu",
                             warmup=0, rounds=1)
    assert prefill["timing"] == "interleaved" and captured == ["tuned", "torch_ref"]


def test_the_h200_script_cpu_smoke(tmp_path):
    """The whole script (tune, the mix checked then timed interleaved, the table and JSON) on the CPU."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "h200_tuned.py"), "--cpu-smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MQA_")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "h200_tuned.json").read_text())
    assert data["smoke"] and data["tune_exit_status"] == 0 and data["timing"].startswith("prefill interleaved")
    assert len(data["rows"]) == 5 and data["tuned_vs_best_geomean"] > 0
    # the choice alone: the best -only column is the fastest by definition, so a pick is at most as fast
    assert 0 < data["pick_vs_best_worst"] <= data["pick_vs_best_geomean"] <= 1.0
    assert all(r["pick_vs_best"] == 1.0 for r in data["rows"] if r["best_single"] == f"{r['tuned_pick']}-only")
    for r in data["rows"]:
        assert r["status"]["tuned"] == r["status"]["torch_ref-only"] == "ok", r
        assert r["tuned_pick"] in ("torch_ref", "example_chunked") and set(r["ms"]) == set(r["calls_per_round"])
    assert "tuned vs the best single provider per shape" in proc.stdout


def test_a_time_budget_leaves_unmeasured_shapes_out(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["tune", "--device", "cpu", "--providers", "torch_ref", "--shapes", "prefill:32,64,32,128",
                 "decode:2,64,1,32,128", "--budget", "0.000001", "--out", str(out)]) == 0
    assert "time budget (1e-06 s) reached: 2 of 2 shapes not measured" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["entries"] == [] and data["arguments"]["shapes_measured"] == 0


def test_replay_times_decode_by_graph_on_cuda_only() -> None:
    """--replay auto: decode shapes by CUDA-graph replay on CUDA (engines capture decode), prefill
    eagerly; all / none as named; never on a device without CUDA graphs."""
    from mqa_core.cli.tune import replayed

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert replayed("fp8_paged_mqa_logits", "auto", cuda) and not replayed("fp8_mqa_logits", "auto", cuda)
    assert replayed("fp8_mqa_logits", "all", cuda) and not replayed("fp8_paged_mqa_logits", "none", cuda)
    assert not any(replayed(op, r, cpu) for op in ("fp8_mqa_logits", "fp8_paged_mqa_logits")
                   for r in ("auto", "all", "none"))


def test_a_replayed_bucket_takes_graph_times_and_says_why_a_provider_has_none() -> None:
    from mqa_core.cli.tune import result_of

    row = {"status": "ok", "ms_median": 0.030, "graph_ms": 0.012}
    assert result_of(row, graph=True).ms == 0.012 and result_of(row, graph=False).ms == 0.030
    uncapturable = {"status": "ok", "ms_median": 0.030, "graph_ms": None,
                    "graph_note": "not captured in a CUDA graph: it synchronises with the host"}
    r = result_of(uncapturable, graph=True)
    assert r.ms is None and r.status == "not capturable: not captured in a CUDA graph: it synchronises with the host"
    wrong = result_of({"status": "wrong", "reason": "calc_diff 0.04"}, graph=True)
    assert wrong.ms is None and wrong.status == "wrong: calc_diff 0.04"


def test_replay_all_is_refused_without_cuda(tmp_path) -> None:
    r = mqa("tune", "--device", "cpu", "--providers", "torch_ref", "--shapes", "decode:2,256,1,32,128",
            "--replay", "all", "--out", "t.json", cwd=tmp_path)
    assert r.returncode != 0 and "--replay all times CUDA-graph replays, which cpu has none of" in r.stderr


# -- split buckets ---------------------------------------------------------------------------------

def _crossover(shape: TuneShape) -> dict:
    """Times of two providers with a crossover at M = 768 inside the bucket [512, 1024)^2 (as measured on
    an H200: a tie at 512 x 512, triton 15% ahead at 896 x 896, gluon 5% ahead at 700 x 900)."""
    from mqa_core.cli.tune import Result

    m = shape.problem.m
    return {"gluon": Result(1.0 if m < 768 else 1.15, "ok"), "triton": Result(1.06 if m < 768 else 1.0, "ok")}


def test_a_bucket_whose_shapes_pick_different_providers_is_split_and_its_empty_halves_measured():
    from mqa_core.cli.tune import halves_to_measure, split_buckets

    shapes = [TuneShape.prefill(512, 512, 32, 128), TuneShape.prefill(896, 896, 32, 128),
              TuneShape.prefill(2048, 2048, 32, 128), TuneShape.prefill(3584, 3584, 32, 128)]
    results = {i: _crossover(s) for i, s in enumerate(shapes)}
    order = ["gluon", "triton"]
    split = split_buckets(shapes, results, order, 0.05)
    assert split == [shapes[0].bucket()]  # the second bucket's shapes both pick triton
    added = halves_to_measure(split, shapes, results)
    assert [(s.problem.m, s.problem.n, s.kind) for s in added] == [(627, 887, "causal")]  # M > N: no causal shape
    assert split_buckets(shapes, results, order, 0.2) == []  # within a 20% margin gluon is kept on every shape
    full = [TuneShape.prefill(512, 512, 32, 128, "full"), TuneShape.prefill(896, 896, 32, 128, "full")]
    added = halves_to_measure(split_buckets(full, {0: results[0], 1: results[1]}, order, 0.05), full, results)
    assert [(s.problem.m, s.problem.n) for s in added] == [(627, 887), (887, 627)]
    decode = TuneShape.decode(16, 4096, 2, 32, 128)  # M = 32 in [32, 64), N in [4096, 8192)
    assert [(s.batch, s.problem.m, s.problem.n) for s in map(decode.within, decode.bucket().halves())] == \
        [(20, 40, 5017), (20, 40, 7094), (28, 56, 5017), (28, 56, 7094)]


def test_tune_splits_a_crossover_bucket_and_selection_follows_the_halves(tmp_path, monkeypatch, capsys):
    """``mqa tune`` end to end with a timing model standing in for the GPU (the crossover above): the
    split, the second pass over the empty half, the table's entries and the choice ``explain`` makes."""
    import mqa_core.cli.tune as tune

    passes = []

    def measure(shapes, names, *args, kit=None, **kw):
        passes.append([(s.problem.m, s.problem.n) for s in shapes])
        assert kit is not None
        return {i: {n: r for n, r in _crossover(s).items() if n in names} for i, s in enumerate(shapes)}

    monkeypatch.setattr(tune, "measure", measure)
    monkeypatch.setattr(tune, "providers_for", lambda *a, **k: {})
    monkeypatch.setattr(tune, "priority_order", lambda names: ["gluon", "triton"])
    out = tmp_path / "t.json"
    assert main(["tune", "--device", "cpu", "--providers", "gluon,triton", "--shapes", "prefill:512,512,32,128",
                 "prefill:896,896,32,128", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert passes == [[(512, 512), (896, 896)], [(627, 887)]]
    assert "split 1 bucket(s) whose shapes picked different providers" in text
    data = json.loads(out.read_text())
    assert data["split"] == ["fp8_mqa_logits H=32 D=128 M in [512, 1024) N in [512, 1024)"]
    assert [(e["m"], e["n"], e["shapes"]) for e in data["entries"]] == [
        ([512, 1024], [512, 1024], ["causal M=512 N=512 H=32 D=128", "causal M=896 N=896 H=32 D=128",
                                    "causal M=627 N=887 H=32 D=128"]),
        ([512, 768], [512, 768], ["causal M=512 N=512 H=32 D=128"]),
        ([512, 768], [768, 1024], ["causal M=627 N=887 H=32 D=128"]),
        ([768, 1024], [768, 1024], ["causal M=896 N=896 H=32 D=128"])]
    table = load_tuning(str(out))
    priority = ["gluon", "triton"]
    picks = {(m, n): table.lookup("fp8_mqa_logits", Problem(m, n, 32, 128)).pick(priority, table.margin).chosen
             for m, n in ((700, 900), (600, 600), (900, 1000), (1000, 600))}
    # the half each shape falls in decides; (1000, 600) has no half measured: the bucket's geomean
    assert picks == {(700, 900): "gluon", (600, 600): "gluon", (900, 1000): "triton", (1000, 600): "gluon"}
