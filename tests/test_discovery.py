"""Discovery through real entry points of real (temp-installed) distributions, and isolation."""

import logging
import subprocess
import sys
import textwrap
import threading

import pytest

import mqa_core
from mqa_core import registry


def plugin(name, priority, archs=("sm_90",), extra=""):
    return textwrap.dedent(f"""
        from mqa_core import ProviderSpec, hookimpl

        class Kernels:
            def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
                raise AssertionError("selection tests never run kernels")

        KERNELS = Kernels()
        {extra}
        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name={name!r}, ops={{"fp8_mqa_logits"}}, archs={set(archs)!r},
                                 dtypes={{"float8_e4m3fn"}}, priority={priority},
                                 load="{name}_plugin:KERNELS")]
        """)


@pytest.fixture
def three(install_dist):
    install_dist("fast-one", "2.0", {"fast_plugin.py": plugin("fast", 200)},
                 {"mqa_core.providers": {"fast": "fast_plugin"}})
    install_dist("amd-one", "1.1", {"amd_plugin.py": plugin("amd", 300, archs=("gfx950",))},
                 {"mqa_core.providers": {"amd": "amd_plugin"}})
    install_dist("broken-one", "0.1", {"broken_plugin.py": "raise ImportError('missing libfoo.so')\n"},
                 {"mqa_core.providers": {"broken": "broken_plugin"}})


def test_real_entry_points_choose_by_arch_and_priority(three):
    with pytest.warns(RuntimeWarning, match="broken"):
        assert mqa_core.get_provider("sm_90").name == "fast"
    assert mqa_core.get_provider("gfx950").name == "amd"
    assert mqa_core.get_provider("cpu").name == "torch_ref"
    p = mqa_core.get_provider("sm_90")
    assert (p.spec.distribution, p.spec.version) == ("fast-one", "2.0")


def test_broken_plugin_is_isolated_and_explained(three):
    with pytest.warns(RuntimeWarning):
        d = mqa_core.explain("gfx950")
    c = d.candidate("broken")
    assert (c.code, c.distribution) == ("broken", "broken-one")
    assert "import: ImportError: missing libfoo.so" in c.reason
    assert d.chosen == "amd" and "broken" in str(d)


def test_strict_mode_raises(three, monkeypatch):
    monkeypatch.setenv("MQA_STRICT_PLUGINS", "1")
    mqa_core.reload()
    with pytest.raises(mqa_core.PluginError, match="missing libfoo.so"):
        mqa_core.get_provider("sm_90")


def test_allowlist_and_blocklist(three, monkeypatch):
    monkeypatch.setenv("MQA_PLUGINS", "mqa-provider-torch-ref,amd-one")
    mqa_core.reload()
    assert mqa_core.get_provider("sm_90").name == "torch_ref"  # fast not loaded; broken not loaded
    assert registry.state().discovery.broken == ()
    monkeypatch.setenv("MQA_PLUGINS", "")
    mqa_core.reload()
    with pytest.raises(mqa_core.ProviderUnavailableError, match="MQA_PLUGINS=.* loads only") as err:
        mqa_core.get_provider("cpu")
    assert "no provider is installed" not in str(err.value) and "torch_ref (mqa-provider-torch-ref)" in str(err.value)
    monkeypatch.delenv("MQA_PLUGINS")
    monkeypatch.setenv("MQA_DISABLE_PROVIDERS", "fast")
    mqa_core.reload()
    with pytest.warns(RuntimeWarning):
        d = mqa_core.explain("sm_90")
    assert d.chosen not in ("fast", None) and d.candidate("fast").code == "blocked"


def test_forced_provider_that_cannot_serve_fails_with_every_reason(three, monkeypatch):
    monkeypatch.setenv("MQA_PROVIDER", "amd")
    mqa_core.reload()
    with pytest.warns(RuntimeWarning):
        with pytest.raises(mqa_core.ProviderUnavailableError) as err:
            mqa_core.get_provider("sm_90")
    msg = str(err.value)
    assert isinstance(err.value, LookupError)
    assert "declares archs gfx950; asked for sm_90" in msg
    assert "usable, but MQA_PROVIDER=amd names others" in msg  # fast and torch_ref could have served
    assert "missing libfoo.so" in msg
    assert err.value.decision.chosen is None


@pytest.mark.parametrize("body, stage, words", [
    ("from mqa_core import hookimpl\n@hookimpl\ndef mqa_providers():\n    raise RuntimeError('kaput')\n",
     "hook", "RuntimeError: kaput"),
    ("from mqa_core import hookimpl\n@hookimpl\ndef mqa_providers():\n    return ['not a spec']\n",
     "spec", "not a ProviderSpec"),
    ("from mqa_core import hookimpl\n@hookimpl\ndef mqa_providers():\n    return None\n",
     "hook", "expected a list"),
    ("X = 1\n", "hook", "defines no @mqa_core.hookimpl"),
    ("from mqa_core import hookimpl\n@hookimpl\ndef mqa_providers(bogus):\n    return []\n",
     "register", "bogus"),
    ("from mqa_core import ProviderSpec, hookimpl\n@hookimpl\ndef mqa_providers():\n"
     "    return [ProviderSpec(name='BAD NAME', ops={'fp8_mqa_logits'}, archs={'cpu'},"
     " dtypes={'float8_e4m3fn'}, priority=1, load='x:y')]\n", "hook", "invalid ProviderSpec"),
])
def test_each_kind_of_broken_plugin_is_isolated(install_dist, body, stage, words):
    install_dist("weird", "0.0.1", {"weird_plugin.py": body}, {"mqa_core.providers": {"weird": "weird_plugin"}})
    with pytest.warns(RuntimeWarning, match=words):
        assert mqa_core.get_provider("cpu").name == "torch_ref"
    (b,) = registry.state().discovery.broken
    assert (b.entry_point, b.stage) == ("weird", stage) and words in b.error


def test_same_distribution_registering_a_name_twice_is_broken(install_dist):
    twice = plugin("dup", 5, archs=("cpu",))
    install_dist("dup-dist", "1.0", {"dup_plugin.py": twice, "dup_again.py": twice.replace(
        'load="dup_plugin', 'load="dup_again')},
        {"mqa_core.providers": {"dup": "dup_plugin", "dup2": "dup_again"}})
    with pytest.warns(RuntimeWarning, match="already registered provider 'dup'"):
        specs = registry.state().discovery.specs
    assert [s.id for s in specs if s.name == "dup"] == ["dup-dist:dup"]


def test_kernel_import_failure_falls_back_and_is_explained(install_dist):
    install_dist("bad-kernel", "1.0", {"bk_plugin.py": plugin("bk", 50, archs=("cpu",)).replace(
        'load="bk_plugin:KERNELS"', 'load="bk_missing_module:KERNELS"')},
        {"mqa_core.providers": {"bk": "bk_plugin"}})
    assert mqa_core.get_provider("cpu").name == "torch_ref"
    c = mqa_core.explain("cpu").candidate("bk")
    assert c.code == "import" and "bk_missing_module" in c.reason


def test_choice_is_logged_once_per_request(three, caplog):
    caplog.set_level(logging.INFO, logger="mqa_core")
    with pytest.warns(RuntimeWarning):
        for _ in range(3):
            mqa_core.get_provider("sm_90")
            mqa_core.get_provider("sm90")
    chosen = [r for r in caplog.records if "-> fast" in r.getMessage()]
    assert len(chosen) == 1 and "arch=sm_90" in chosen[0].getMessage()


def test_cold_registry_under_32_threads_discovers_once(monkeypatch):
    import mqa_core.registry as reg

    calls = []
    real = reg.discover
    monkeypatch.setattr(reg, "discover", lambda s, **kw: calls.append(1) or real(s, **kw))
    mqa_core.reload()
    barrier, answers = threading.Barrier(32), []

    def worker():
        barrier.wait()
        answers.append(mqa_core.get_provider("cpu"))

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(answers) == 32 and len({id(a) for a in answers}) == 1


def test_import_is_light_and_selection_is_deterministic_across_processes():
    code = ("import sys, mqa_core; heavy = [m for m in ('torch', 'triton', 'aiter') if m in sys.modules];"
            "assert not heavy, heavy; d = mqa_core.explain('gfx950');"
            "assert 'triton' not in sys.modules and 'aiter' not in sys.modules, 'selection imported kernels';"
            "print(d.chosen, [c.name for c in d.candidates])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(outs) == 1
