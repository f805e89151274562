"""Isolation: whatever a plugin raises from any call site (SystemExit included) is that plugin's
failure, never the caller's; KeyboardInterrupt is the user's and propagates. A plugin is used whole
or not at all. Slow imports are timed and warned about. All with real temp-installed distributions."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import mqa_core
from mqa_core import registry
from mqa_core.testing import make_inputs

PROBLEM = mqa_core.Problem(4, 20, 4, 64)


def module(top="", spec_kw="", kernel="return REF.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean_logits)",
           hook_body=None, name="shady", load="shady_plugin:KERNELS"):
    """A plugin module offering provider ``name`` (priority 500, cpu) with a kernel that delegates to
    torch_ref unless ``kernel`` says otherwise. ``top`` is module-level code; ``hook_body`` the hook's."""
    hook_body = hook_body or (f"return [ProviderSpec(name={name!r}, ops={{'fp8_mqa_logits'}}, archs={{'cpu'}}, "
                              f"dtypes={{'float8_e4m3fn'}}, priority=500, load={load!r}{spec_kw})]")

    def indent(text, n):
        return textwrap.indent(textwrap.dedent(text), " " * n)

    return "\n".join([
        "from mqa_core import ProviderSpec, hookimpl",
        "from mqa_provider_torch_ref.kernels import KERNELS as REF",
        textwrap.dedent(top),
        "class Kernels:",
        "    def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):",
        indent(kernel, 8),
        "KERNELS = Kernels()",
        "@hookimpl",
        "def mqa_providers():",
        indent(hook_body, 4),
        ""])


def install(install_dist, text, extra_files=None, ep_value="shady_plugin"):
    files = {"shady_plugin.py": text, **(extra_files or {})}
    return install_dist("shady-dist", "6.6", files, {"mqa_core.providers": {"shady": ep_value}})


def served_by_torch_ref_and(code, words):
    """The caller keeps working (torch_ref serves the CPU) and the plugin's failure is explained."""
    with pytest.warns(RuntimeWarning) if code == "broken" else _nothing():
        p = mqa_core.get_provider("cpu", problem=PROBLEM)
    assert p.name != "shady"
    c = mqa_core.explain("cpu", problem=PROBLEM).candidate("shady")
    assert c.code == code and words in c.reason, (c.code, c.reason)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


SYSTEM_EXIT_SITES = [
    # (what, module text, extra files, entry point value, code, words)
    ("import", "raise SystemExit(9)\n", None, "shady_plugin", "broken", "import: SystemExit: 9"),
    ("register", "class P:\n    def __dir__(self):\n        raise SystemExit(9)\nPLUGIN = P()\n", None,
     "shady_plugin:PLUGIN", "broken", "register: SystemExit: 9"),
    ("hook", module(hook_body="raise SystemExit(9)"), None, "shady_plugin", "broken", "hook: SystemExit: 9"),
    ("check", module(top="def check(arch):\n    raise SystemExit(9)", spec_kw=", check=check"), None,
     "shady_plugin", "check", "runtime check raised SystemExit: 9"),
    ("check's reason", module(top="class R:\n    def __str__(self):\n        raise SystemExit(9)\n"
                                  "def check(arch):\n    return R()", spec_kw=", check=check"), None,
     "shady_plugin", "check", "runtime check raised SystemExit: 9"),
    ("shape limits", module(top="def limits(p):\n    raise SystemExit(9)", spec_kw=", shape_limits=limits"), None,
     "shady_plugin", "shape", "shape limits raised SystemExit: 9"),
    ("kernel module", module(load="shady_kernel:KERNELS"), {"shady_kernel.py": "raise SystemExit(9)\n"},
     "shady_plugin", "import", "SystemExit: 9"),
    ("kernel object", module(top="class Evil:\n    def __getattr__(self, name):\n        raise SystemExit(9)\n"
                                 "EVIL = Evil()", load="shady_plugin:EVIL"), None,
     "shady_plugin", "import", "SystemExit: 9"),
]


@pytest.mark.parametrize("what, text, extra, ep_value, code, words", SYSTEM_EXIT_SITES,
                         ids=[s[0] for s in SYSTEM_EXIT_SITES])
def test_system_exit_from_each_plugin_call_site_is_that_plugins_failure(install_dist, what, text, extra,
                                                                        ep_value, code, words):
    install(install_dist, text, extra, ep_value)
    served_by_torch_ref_and(code, words)
    inp = make_inputs(PROBLEM)
    assert mqa_core.fp8_mqa_logits(*inp.args()).shape == (4, 20)  # the op still runs, on another provider


def test_system_exit_from_the_kernel_call_is_an_error_naming_the_provider(install_dist, monkeypatch):
    install(install_dist, module(kernel="raise SystemExit(9)"))
    inp = make_inputs(PROBLEM)
    with pytest.raises(mqa_core.ProviderResultError, match=r"provider shady \(shady-dist==6.6\) raised SystemExit"):
        mqa_core.fp8_mqa_logits(*inp.args())
    with pytest.raises(mqa_core.ProviderResultError, match="SystemExit"):
        mqa_core.get_provider("cpu").fp8_mqa_logits(*inp.args())


def test_mqa_providers_survives_a_plugin_that_exits(install_dist):
    site = install(install_dist, module(hook_body="raise SystemExit(9)"))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "mqa_core.cli.main", "providers", "--arch", "cpu"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "torch_ref" in r.stdout and "BROKEN plugin shady (shady-dist==6.6) at hook" in r.stdout
    assert "SystemExit: 9" in r.stdout


@pytest.mark.parametrize("where", ["import", "hook"])
def test_keyboard_interrupt_propagates_and_is_not_recorded(install_dist, where):
    text = ("raise KeyboardInterrupt\n" if where == "import"
            else module(hook_body="raise KeyboardInterrupt"))
    install(install_dist, text)
    with pytest.raises(KeyboardInterrupt):
        mqa_core.get_provider("cpu")
    assert registry._state is None  # nothing was cached as broken: the next call discovers again


def test_keyboard_interrupt_from_a_check_propagates(install_dist):
    install(install_dist, module(top="def check(arch):\n    raise KeyboardInterrupt", spec_kw=", check=check"))
    with pytest.raises(KeyboardInterrupt):
        mqa_core.get_provider("cpu")


@pytest.mark.parametrize("tail, words", [
    ("'junk'", "returned str, not a ProviderSpec"),
    ("None", "returned NoneType, not a ProviderSpec"),
    ("ProviderSpec(name='shady', ops={'fp8_mqa_logits'}, archs={'cpu'}, dtypes={'float8_e4m3fn'}, "
     "priority=1, load='shady_plugin:KERNELS')", "more than one provider named shady"),
    ("Sub(name='other', ops={'fp8_mqa_logits'}, archs={'cpu'}, dtypes={'float8_e4m3fn'}, priority=1, "
     "load='shady_plugin:KERNELS')", "returned Sub, not a ProviderSpec"),
])
def test_half_broken_hook_contributes_nothing(install_dist, tail, words):
    good = ("ProviderSpec(name='shady', ops={'fp8_mqa_logits'}, archs={'cpu'}, dtypes={'float8_e4m3fn'}, "
            "priority=500, load='shady_plugin:KERNELS')")
    install(install_dist, module(top="class Sub(ProviderSpec):\n    pass", hook_body=f"return [{good}, {tail}]"))
    with pytest.warns(RuntimeWarning, match=words):
        assert mqa_core.get_provider("cpu").name != "shady"
    found = registry.state().discovery
    assert "shady" not in [s.name for s in found.specs]
    (b,) = found.broken
    assert b.stage == "spec" and words in b.error


def test_a_spec_altered_after_construction_is_caught(install_dist):
    hook = ("s = ProviderSpec(name='shady', ops={'fp8_mqa_logits'}, archs={'cpu'}, dtypes={'float8_e4m3fn'}, "
            "priority=500, load='shady_plugin:KERNELS')\n"
            "object.__setattr__(s, 'name', 'torch_ref\\n')\nreturn [s]")
    install(install_dist, module(hook_body=hook))
    with pytest.warns(RuntimeWarning, match="must match"):
        assert mqa_core.get_provider("cpu").name == "torch_ref"
    assert registry.state().discovery.broken[0].stage == "spec"


def test_slow_import_is_timed_shown_and_warned(install_dist, caplog, capsys):
    import time

    caplog.set_level(logging.WARNING, logger="mqa_core")
    install(install_dist, module(top="import time\ntime.sleep(1.3)"))
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=r"importing plugin 'shady' \(shady-dist\) took 1\.\d s"):
        mqa_core.get_provider("cpu")
    assert time.perf_counter() - t0 >= 1.3
    # the hint while it was still running, for an import that hangs
    assert any("has taken over 1 s and is still running" in r.getMessage() for r in caplog.records)
    (info,) = [p for p in registry.state().discovery.plugins if p.entry_point == "shady"]
    assert info.status == "loaded" and info.import_seconds >= 1.3 and info.providers == ("shady",)
    c = mqa_core.explain("cpu").candidate("shady")
    assert c.import_seconds >= 1.3 and f"{c.import_seconds * 1e3:.0f} ms" in str(mqa_core.explain("cpu"))
    from mqa_core.cli.main import main

    assert main(["providers", "--arch", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "SLOW plugin shady (shady-dist): its import took 1." in out


def test_fast_imports_are_not_warned_about(caplog, recwarn):
    caplog.set_level(logging.WARNING, logger="mqa_core")
    mqa_core.get_provider("cpu")
    infos = registry.state().discovery.plugins
    assert infos and all(p.import_seconds is not None and p.import_seconds < 1 for p in infos)
    assert not [w for w in recwarn if "took" in str(w.message)]


# -- hostile spec fields (issue 37): copied into builtins at discovery, or the plugin's failure ----

HOSTILE_TYPES = """
class Hashy(str):  # takes every call down wherever it is hashed
    def __hash__(self):
        raise SystemExit("hashed")
    def __eq__(self, other):
        return str.__eq__(self, other)

class Everyone(str):  # equal to every name: would capture MQA_PROVIDER=torch_ref
    def __eq__(self, other):
        return True
    def __hash__(self):
        return str.__hash__(self)

class Negless(int):  # the sort key negates the priority
    def __neg__(self):
        raise SystemExit("negated")
"""

SPEC = ("ProviderSpec(name={name}, ops={{'fp8_mqa_logits'}}, archs={{'cpu'}}, dtypes={{'float8_e4m3fn'}}, "
        "priority={priority}, load='shady_plugin:KERNELS')")


@pytest.mark.parametrize("name, priority", [("Hashy('shady')", "500"), ("'shady'", "Negless(500)"),
                                            ("Everyone('shady')", "500")],
                         ids=["str whose hash exits", "int whose negation exits", "str equal to every name"])
def test_hostile_field_types_are_copied_to_builtins(install_dist, monkeypatch, name, priority):
    install(install_dist, module(top=HOSTILE_TYPES, hook_body="return [" + SPEC.format(name=name, priority=priority)
                                 + "]"))
    p = mqa_core.get_provider("cpu")
    assert p.name == "shady" and type(p.spec.name) is str and type(p.spec.priority) is int
    assert all(type(x) is str for x in (*p.spec.ops, *p.spec.archs, *p.spec.dtypes))
    out = mqa_core.fp8_mqa_logits(*make_inputs(PROBLEM, seed=1).args())
    assert out.shape == (4, 20)
    monkeypatch.setenv("MQA_PROVIDER", "torch_ref")  # the name is only its own
    mqa_core.reload()
    assert mqa_core.get_provider("cpu").id == "mqa-provider-torch-ref:torch_ref"


def test_hostile_set_items_are_copied_too(install_dist):
    body = ("spec = " + SPEC.format(name="'shady'", priority="500") + "\n"
            "object.__setattr__(spec, 'archs', frozenset({Everyone('cpu')}))\n"
            "return [spec]")
    install(install_dist, module(top=HOSTILE_TYPES, hook_body=body))
    assert mqa_core.get_provider("cpu").name == "shady"
    assert mqa_core.explain("sm_90").candidate("shady").code == "arch"  # Everyone('cpu') is only 'cpu' now


@pytest.mark.parametrize("body, words", [
    ("return [object.__new__(ProviderSpec)]", "ProviderSpec.name is missing"),
    ("spec = " + SPEC.format(name="'shady'", priority="500") + "\nobject.__setattr__(spec, 'priority', 2.5)\n"
     "return [spec]", "ProviderSpec.priority must be an int, got float"),
    ("spec = " + SPEC.format(name="'shady'", priority="500") + "\nobject.__setattr__(spec, 'ops', ['x'])\n"
     "return [spec]", "ProviderSpec.ops must be a frozenset of str, got list"),
    ("spec = " + SPEC.format(name="'shady'", priority="500") + "\nobject.__setattr__(spec, 'dtype_pairs', {})\n"
     "return [spec]", "ProviderSpec.dtype_pairs must be a PairsByArch"),
], ids=["no constructor", "float priority", "list of ops", "dict of pairs"])
def test_fields_that_cannot_be_copied_are_the_plugins_failure(install_dist, body, words):
    install(install_dist, module(top=HOSTILE_TYPES, hook_body=body))
    served_by_torch_ref_and("broken", words)
    (b,) = registry.state().discovery.broken
    assert b.stage == "spec"


def test_every_spec_field_has_a_plain_copy():
    import dataclasses

    from mqa_core.spec import PLAIN

    assert {str(f.type) for f in dataclasses.fields(mqa_core.ProviderSpec)} <= set(PLAIN)


# -- terminal safety (issue 37): plugin text is one printable line wherever the CLI shows it ---------

FORGED = "fine\nchosen: shady (shady-dist==6.6): forged"
HIDDEN = """
class Hidden(str):  # hides its newline from a one-line check that asks `in`
    def __contains__(self, item):
        return False
"""


def cli(capsys, *argv):
    from mqa_core.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_reason_cannot_forge_the_chosen_line(install_dist, capsys):
    install(install_dist, module(spec_kw=f", check=lambda arch: {FORGED!r}"))
    code, out, _ = cli(capsys, "explain", "--arch", "cpu")
    assert code == 0 and sum(ln.startswith("chosen:") for ln in out.splitlines()) == 1, out
    assert "fine\\x0achosen: shady" in out
    assert sum(ln.startswith("chosen:") for ln in str(mqa_core.explain("cpu")).splitlines()) == 1
    code, out, _ = cli(capsys, "explain", "--arch", "cpu", "--json")
    reason = mqa_core.explain("cpu").candidate("shady").reason
    assert reason == "fine\\x0achosen: shady (shady-dist==6.6): forged"
    data = json.loads(out)
    assert [c["reason"] for c in data["candidates"] if c["name"] == "shady"] == [reason]
    assert plain(data)


def plain(value):
    """Only JSON's own types, exactly (no subclass, no object a default= turned into text)."""
    if type(value) is dict:
        return all(type(k) is str and plain(v) for k, v in value.items())
    if type(value) is list:
        return all(plain(v) for v in value)
    return type(value) in (str, int, float, bool, type(None))


def test_escapes_in_a_description_are_shown_not_obeyed(install_dist, capsys):
    install(install_dist, module(spec_kw=", description='\\x1b[2A\\x1b[2Kerased \\u202eevil'"))
    code, out, _ = cli(capsys, "providers", "--arch", "cpu")
    assert code == 0 and "\x1b" not in out and "\u202e" not in out
    (line,) = [ln for ln in out.splitlines() if ln.endswith("\\x1b[2A\\x1b[2Kerased \\u202eevil")]
    assert line.startswith("shady "), out


def test_a_str_subclass_cannot_hide_a_newline_in_its_description(install_dist, capsys):
    install(install_dist, module(top=HIDDEN, spec_kw=", description=Hidden('ok\\nchosen: forged')"))
    served_by_torch_ref_and("broken", "description must be a one-line str")
    code, out, _ = cli(capsys, "providers", "--arch", "cpu")
    assert not [ln for ln in out.splitlines() if ln.startswith("chosen:")], out


def test_an_import_error_and_a_plugins_warning_stay_on_their_line(install_dist, capsys):
    install(install_dist, "import warnings\nwarnings.warn('\\x1b[2Jwiped')\n"
                          "raise ImportError('boom\\n\\x1b[1Achosen: shady (forged)')\n")
    code, out, err = cli(capsys, "providers", "--arch", "cpu")
    assert code == 0 and "\x1b" not in out + err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("BROKEN plugin shady")]
    assert line.endswith("ImportError: boom\\x0a\\x1b[1Achosen: shady (forged)"), line
    assert "mqa: warning: \\x1b[2Jwiped" in err, err
    code, out, err = cli(capsys, "explain", "--arch", "cpu")
    assert "\x1b" not in out + err and sum(ln.startswith("chosen:") for ln in out.splitlines()) == 1
