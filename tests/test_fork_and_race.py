"""One state per request, reload() racing with calls, and fork() while another thread holds the
registry lock (discovering through a slow plugin import, or loading a slow kernel module)."""

import json
import os
import sys
import threading
import time

import pytest

import mqa_core
from mqa_core import registry
from mqa_core.testing import make_inputs

SLOW_PLUGIN = """
import pathlib, time
pathlib.Path({marker!r}).write_text("started")
time.sleep({seconds})
from mqa_core import ProviderSpec, hookimpl

@hookimpl
def mqa_providers():
    return [ProviderSpec(name="slow", ops={{"fp8_mqa_logits"}}, archs={{"cpu"}}, dtypes={{"float8_e4m3fn"}},
                         priority=500, load={load!r})]
"""

SLOW_KERNEL = """
import pathlib, time
pathlib.Path({marker!r}).write_text("started")
time.sleep({seconds})
from mqa_provider_torch_ref.kernels import KERNELS
"""


def wait_for(path, timeout=20.0):
    t0 = time.monotonic()
    while not os.path.exists(path):
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.01)


def fork_and_ask(code_in_child, timeout):
    """Fork now; the child runs ``code_in_child()`` and sends back its JSON. Fails if the child hangs."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(read)
            # GNU OpenMP's thread pool does not survive fork(): once earlier tests have run torch's
            # parallel CPU kernels, a parallel matmul in the child waits forever for the parent's
            # workers (torch's limitation, not the registry's). One thread keeps the child off the pool.
            import torch

            torch.set_num_threads(1)
            result = code_in_child()
            payload = json.dumps({"ok": result})
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        os.write(write, payload.encode())
        os._exit(0)
    os.close(write)
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > timeout:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child hung for {timeout} s")
        time.sleep(0.02)
    with os.fdopen(read) as f:
        answer = json.loads(f.read() or '{"error": "no answer"}')
    assert "error" not in answer, answer["error"]
    return answer["ok"], time.monotonic() - t0


def child_view():
    p = mqa_core.get_provider("cpu")
    d = mqa_core.explain("cpu")
    inp = make_inputs(mqa_core.Problem(3, 9, 2, 64), seed=4)
    out = mqa_core.fp8_mqa_logits(*inp.args())
    reasons = {c.name: f"[{c.code}] {c.reason}" for c in d.candidates if not c.accepted}
    return {"provider": p.name, "chosen": d.chosen, "reasons": reasons, "shape": list(out.shape)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_discovers_gives_a_usable_registry(install_dist, tmp_path):
    marker = tmp_path / "import-started"
    install_dist("slow-dist", "1.0", {"slow_plugin.py": SLOW_PLUGIN.format(
        marker=str(marker), seconds=4, load="mqa_provider_torch_ref.kernels:KERNELS")},
        {"mqa_core.providers": {"slow": "slow_plugin"}})
    got = []
    discovering = threading.Thread(target=lambda: got.append(mqa_core.get_provider("cpu").name), daemon=True)
    with pytest.warns(RuntimeWarning, match="took"):
        discovering.start()
        wait_for(marker)  # the thread holds the registry lock, inside the plugin's import
        view, seconds = fork_and_ask(child_view, timeout=20)
        discovering.join()
    assert seconds < 15, "the child waited for a thread it does not have"
    assert view["provider"] == "torch_ref" and view["shape"] == [3, 9]
    assert "was being imported by another thread when this process forked" in view["reasons"]["slow"]
    assert got == ["slow"]  # the parent's own discovery finished normally


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_loads_a_kernel_module(install_dist, tmp_path):
    marker = tmp_path / "kernel-import-started"
    install_dist("slowk-dist", "1.0", {
        "slow_plugin.py": SLOW_PLUGIN.format(marker=str(tmp_path / "unused"), seconds=0, load="slow_kernel:KERNELS"),
        "slow_kernel.py": SLOW_KERNEL.format(marker=str(marker), seconds=4)},
        {"mqa_core.providers": {"slow": "slow_plugin"}})
    registry.state()  # discovered; the kernel module is not loaded yet
    loading = threading.Thread(target=lambda: mqa_core.get_provider("cpu"), daemon=True)
    loading.start()
    wait_for(marker)
    view, seconds = fork_and_ask(child_view, timeout=20)
    loading.join()
    assert seconds < 15
    assert view["provider"] == "torch_ref"
    assert "[import]" in view["reasons"]["slow"] and "forked" in view["reasons"]["slow"]
    assert mqa_core.get_provider("cpu").name == "slow"  # the parent is unaffected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_with_the_lock_free_keeps_the_state():
    before = registry.state()
    view, _ = fork_and_ask(lambda: {"same": registry.state() is before,
                                    "provider": mqa_core.get_provider("cpu").name}, timeout=20)
    assert view == {"same": True, "provider": "torch_ref"}


def test_multiprocessing_fork_context_child_works_while_parent_discovers(install_dist, tmp_path):
    import multiprocessing as mp

    marker = tmp_path / "import-started"
    install_dist("slow-dist", "1.0", {"slow_plugin.py": SLOW_PLUGIN.format(
        marker=str(marker), seconds=4, load="mqa_provider_torch_ref.kernels:KERNELS")},
        {"mqa_core.providers": {"slow": "slow_plugin"}})
    discovering = threading.Thread(target=lambda: mqa_core.get_provider("cpu"), daemon=True)
    with pytest.warns(RuntimeWarning, match="took"):
        discovering.start()
        wait_for(marker)
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            name = pool.apply_async(_provider_name).get(timeout=20)
        discovering.join()
    assert name == "torch_ref"


def _provider_name():
    return mqa_core.get_provider("cpu").name


def test_reload_racing_with_calls_never_mixes_states(monkeypatch):
    """Reload in a loop while the set of installed providers flips (MQA_PLUGINS), and call from
    threads: every answer must come from one state. The old code raised KeyError in _plan."""
    inp = make_inputs(mqa_core.Problem(4, 16, 2, 64), seed=3)
    stop = threading.Event()
    errors: list[str] = []
    seen: set[str] = set()
    mqa_core.get_provider("sm_90")  # import the Triton kernels once, outside the race

    def flipper():
        flip = False
        while not stop.is_set():
            if flip:
                os.environ["MQA_PLUGINS"] = "mqa-provider-torch-ref"
            else:
                os.environ.pop("MQA_PLUGINS", None)
            flip = not flip
            mqa_core.reload()
            time.sleep(0.0005)

    def caller(i):
        while not stop.is_set():
            try:
                seen.add(mqa_core.get_provider("sm_90").name)
                d = mqa_core.explain("sm_90")
                assert d.chosen in [c.name for c in d.accepted], d
                mqa_core.get_provider("cpu", problem=mqa_core.Problem(4, 16, 2, 64))
                assert mqa_core.fp8_mqa_logits(*inp.args()).shape == (4, 16)
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                errors.append(f"{type(exc).__name__}: {exc}")
                stop.set()

    monkeypatch.setenv("MQA_PLUGINS", "mqa-provider-torch-ref")  # restored after the test
    threads = [threading.Thread(target=flipper)] + [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert seen == {"gluon", "torch_ref"}, seen  # both states were really used


def test_decision_uses_the_state_it_is_given(monkeypatch):
    s = registry.state()
    monkeypatch.setenv("MQA_PLUGINS", "mqa-provider-torch-ref")
    mqa_core.reload()
    old = registry.decision("sm_90", "fp8_mqa_logits", None, None, s=s)
    new = registry.decision("sm_90", "fp8_mqa_logits", None, None)
    assert old.chosen == "gluon" and new.chosen == "torch_ref"
    assert sys.modules["mqa_core.registry"] is registry
