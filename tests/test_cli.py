"""The ``mqa`` command as a user runs it: output, JSON, exit codes, errors without tracebacks."""

import json
import subprocess
import sys

import pytest

from mqa_core.cli.main import main


def mqa(*args, env=None):
    import os

    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "mqa_core.cli.main", *args], capture_output=True,
                          text=True, env=e)


def test_providers_lists_torch_ref_usable(capsys):
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert "torch_ref" in out and "mqa-provider-torch-ref==" in out and "yes" in out


def test_providers_json(capsys):
    assert main(["providers", "--json", "--arch", "gfx950"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = {r["name"]: r for r in data["providers"]}["torch_ref"]
    assert data["arch"] == "gfx950" and row["usable"] and row["priority"] == 0


def test_explain_shows_table_and_choice(capsys):
    assert main(["explain", "--arch", "gfx950", "--shape", "4096,16384,64,128"]) == 0
    out = capsys.readouterr().out
    assert "arch=gfx950" in out and "M=4096,N=16384,H=64,D=128" in out and "chosen: " in out


def test_explain_json_round_trips(capsys):
    assert main(["explain", "--arch", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "cpu" and data["chosen"] and data["candidates"]


def test_explain_exit_status_when_nothing_serves():
    r = mqa("explain", "--arch", "sm_90", env={"MQA_PROVIDER": "no_such_provider"})
    assert r.returncode == 3 and "no_such_provider not installed" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["explain", "--arch", "hopper"], "malformed arch 'hopper': accepted forms"),
    (["explain", "--arch", "cpu", "--shape", "1,2"], "M,N,H,D"),
])
def test_user_errors_go_to_stderr_without_traceback(args, words):
    r = mqa(*args)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_help_lists_commands_and_environment():
    r = mqa("--help")
    assert r.returncode == 0
    for word in ("providers", "explain", "MQA_PROVIDER", "MQA_DISABLE_PROVIDERS", "MQA_PLUGINS"):
        assert word in r.stdout


def test_demo_runs_and_checks():
    r = mqa("demo", "--shape", "64,128,8,64")
    assert r.returncode == 0, r.stderr
    assert "chosen: torch_ref" in r.stdout and "PASS" in r.stdout


NO_CUDA = "" if not __import__("torch").cuda.is_available() else "this machine has CUDA"


def run_main(*args, env=None, monkeypatch=None):
    """``mqa ARGS`` in this process: (exit status, stderr lines)."""
    import mqa_core

    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    mqa_core.reload()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code


@pytest.mark.parametrize("command", ["check", "bench", "demo"])
@pytest.mark.parametrize("device, words", [
    pytest.param("cuda", "--device cuda: no CUDA or ROCm device is available here",
                 marks=pytest.mark.skipif(bool(NO_CUDA), reason=NO_CUDA or "")),
    ("banana", "--device 'banana' is not a torch device"),
    ("meta", "mqa runs on cpu and cuda"),
    ("cuda:99", "--device cuda:99"),
])
def test_device_errors_are_one_line_exit_2(capsys, command, device, words):
    assert run_main(command, "--device", device) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_device_error_in_a_real_process_has_no_traceback():
    r = mqa("check", "--device", "banana")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "mqa: error: --device 'banana' is not a torch device: use cpu, cuda or cuda:N"]


@pytest.mark.parametrize("args", [["bench", "--shape", "1,1,0,1"], ["demo", "--shape", "1,1,0,1"],
                                  ["explain", "--shape", "1,1,0,1"], ["explain", "--shape", "1,1,1,0"],
                                  ["check", "--shape", "1,1,0,1"], ["bench", "--shape", "a,b,c,d"],
                                  ["explain", "--dtype", "bfloat16"], ["explain", "--dtype", "fn,fn,fn"],
                                  ["explain", "--op", "matmul"], ["bench", "--repeat", "x"]])
def test_argument_errors_are_one_line_exit_2(capsys, args):
    assert run_main(*args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], lines
    if "--shape" in args and args[0] != "check" and "0" in args[-1]:
        assert "needs H >= 1 and D >= 1" in lines[0]


@pytest.mark.parametrize("var, value", [("MQA_VALIDATE", "bogus"), ("MQA_STRICT_PLUGINS", "maybe"),
                                        ("MQA_PROVIDER", "a b"), ("MQA_PLUGINS", "a/b")])
def test_bad_settings_are_one_line_exit_2(capsys, monkeypatch, var, value):
    assert run_main("providers", env={var: value}, monkeypatch=monkeypatch) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mqa: error: {var}="), lines


def test_explain_takes_a_dtype_pair(capsys):
    # sm_90's MMA takes e4m3fn alone: the mixed pair goes to torch_ref, and gluon says why.
    assert main(["explain", "--arch", "sm_90", "--dtype", "float8_e4m3fn,float8_e4m3fnuz", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dtype"] == ["float8_e4m3fn", "float8_e4m3fnuz"] and data["chosen"] == "torch_ref"
    gluon = next(c for c in data["candidates"] if c["name"] == "gluon")
    assert gluon["code"] == "dtype" and gluon["pairs"] == [["float8_e4m3fn", "float8_e4m3fn"]]
    # gfx942 engines send fnuz, and e4m3fn q with e4m3fnuz k: a Triton kernel serves both (issue 10).
    for dtype in ("fnuz", "float8_e4m3fn,float8_e4m3fnuz"):
        assert main(["explain", "--arch", "gfx942", "--dtype", dtype]) == 0
        out = capsys.readouterr().out
        assert "chosen: gluon" in out, out
    assert "q=float8_e4m3fn k=float8_e4m3fnuz" in out


def test_unknown_names_are_one_line_warnings(capsys, monkeypatch):
    assert run_main("providers", env={"MQA_DISABLE_PROVIDERS": "torch-reff"}, monkeypatch=monkeypatch) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(warn) == 1 and warn[0].startswith("mqa: warning: MQA_DISABLE_PROVIDERS names torch-reff"), warn
