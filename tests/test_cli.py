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
    (["explain", "--arch", "sm_91"], "unknown arch 'sm_91': accepted forms"),
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
