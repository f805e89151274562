"""Identity: a provider is (distribution, name). A squatter that claims an installed provider's name,
with real temp-installed distributions: neither claimant wins until the user picks one."""

import sys
import textwrap

import pytest
import torch

import mqa_core
from mqa_core import registry
from mqa_core.testing import calc_diff, make_inputs

GENUINE = "mqa-provider-torch-ref:torch_ref"


def squatter(spec_extra="", priority=999, module="copycat_plugin"):
    """A plugin claiming ``torch_ref`` (any arch, ``priority``; the module ``module``) whose kernel
    returns zeros."""
    return textwrap.dedent(f"""
        import torch
        from mqa_core import ProviderSpec, hookimpl

        class Zeros:
            def fp8_mqa_logits(self, q, kv, weights, ks, ke, *, clean_logits=True):
                return torch.zeros(q.shape[0], kv[0].shape[0])

        KERNELS = Zeros()

        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name="torch_ref", ops={{"fp8_mqa_logits"}}, archs={{"any"}},
                                 dtypes={{"float8_e4m3fn"}}, priority={priority}, load="{module}:KERNELS"{spec_extra})]
        """)


@pytest.fixture
def copycat(install_dist):
    install_dist("copycat", "9.9", {"copycat_plugin.py": squatter()},
                 {"mqa_core.providers": {"torch_ref": "copycat_plugin"}})


def reload_with(monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mqa_core.reload()


def test_a_claimed_name_is_ambiguous_and_neither_claimant_is_chosen(copycat):
    d = mqa_core.explain("cpu")
    both = [c for c in d.candidates if c.name == "torch_ref"]
    assert {c.distribution for c in both} == {"copycat", "mqa-provider-torch-ref"}
    assert all(c.code == "ambiguous" for c in both)
    assert d.chosen != "torch_ref"
    genuine = next(c for c in both if c.distribution == "mqa-provider-torch-ref")
    assert "also claimed by copycat==9.9" in genuine.reason and f"MQA_PROVIDER={GENUINE}" in genuine.reason
    with pytest.raises(KeyError, match="pass distribution:name"):
        d.candidate("torch_ref")
    assert d.candidate("copycat:torch_ref").distribution == "copycat"
    text = str(d)
    assert "copycat==9.9" in text and "mqa-provider-torch-ref==" in text


def test_naming_the_squatted_name_fails_with_both_claimants(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_PROVIDER="torch_ref")
    with pytest.raises(mqa_core.ProviderUnavailableError) as err:
        mqa_core.get_provider("cpu")
    msg = str(err.value)
    assert "copycat==9.9" in msg and "[ambiguous]" in msg and f"MQA_PROVIDER={GENUINE}" in msg


def test_distribution_colon_name_picks_the_genuine_one_and_it_computes(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_PROVIDER="MQA_Provider.Torch_Ref:torch_ref")  # PEP 503: same distribution
    p = mqa_core.get_provider("cpu")
    assert p.spec.distribution == "mqa-provider-torch-ref" and p.id == GENUINE
    inp = make_inputs(mqa_core.Problem(5, 33, 4, 64), window="ragged", seed=1)
    assert calc_diff(mqa_core.fp8_mqa_logits(*inp.args()), inp.reference()) < 1e-9
    d = mqa_core.explain("cpu")
    assert d.chosen == "torch_ref" and d.chosen_distribution == "mqa-provider-torch-ref"
    assert d.candidate("copycat:torch_ref").code == "ambiguous"
    assert "MQA_PROVIDER picks" in d.candidate("copycat:torch_ref").reason


def test_the_user_may_pick_the_other_claimant_explicitly(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_PROVIDER="copycat:torch_ref")
    assert mqa_core.get_provider("cpu").spec.distribution == "copycat"


def test_a_bare_entry_point_name_allows_nothing(copycat, monkeypatch):
    """MQA_PLUGINS names distributions: ``torch_ref`` (both entry points' name) imports neither."""
    with pytest.warns(RuntimeWarning, match="MQA_PLUGINS names torch-ref, which matches no installed"):
        reload_with(monkeypatch, MQA_PLUGINS="torch_ref")
        registry.state()
    assert registry.state().discovery.specs == () and "copycat_plugin" not in sys.modules


def test_an_entry_point_named_like_a_distribution_allows_nothing(install_dist, monkeypatch):
    """Issue 37: ``mqa-hostile-epsquat`` declares an entry point named ``mqa-provider-torch-ref``; under
    MQA_PLUGINS=mqa-provider-torch-ref it is never imported, and the genuine provider serves."""
    install_dist("mqa-hostile-epsquat", "6.6", {"epsquat_plugin.py": "raise SystemExit('imported')\n"},
                 {"mqa_core.providers": {"mqa-provider-torch-ref": "epsquat_plugin"}})
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref")
    assert mqa_core.get_provider("cpu").id == GENUINE
    found = registry.state().discovery
    assert found.broken == () and "epsquat_plugin" not in sys.modules
    assert {p.distribution: p.status for p in found.plugins}["mqa-hostile-epsquat"] == "skipped"


def test_distribution_colon_entry_point_allows_that_entry_point(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_PLUGINS="Copycat:torch_ref")
    assert [s.id for s in registry.state().discovery.specs] == ["copycat:torch_ref"]
    reload_with(monkeypatch, MQA_PLUGINS="copycat:other")
    with pytest.warns(RuntimeWarning, match="MQA_PLUGINS names copycat:other, which matches no installed"):
        registry.state()


def test_allowlist_by_distribution_loads_that_one_alone(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref")
    p = mqa_core.get_provider("cpu")
    assert p.id == GENUINE
    assert [s.id for s in registry.state().discovery.specs] == [GENUINE]
    assert "copycat_plugin" not in sys.modules


def test_blocking_the_squatters_distribution_resolves_the_name(copycat, monkeypatch):
    reload_with(monkeypatch, MQA_DISABLE_PROVIDERS="copycat", MQA_PROVIDER="torch_ref")
    assert mqa_core.get_provider("cpu").id == GENUINE
    assert mqa_core.explain("cpu").candidate("copycat:torch_ref").code == "blocked"


def test_providers_command_shows_every_claimant(copycat, capsys):
    from mqa_core.cli.main import main

    assert main(["providers", "--arch", "cpu"]) == 0
    table, _, descriptions = capsys.readouterr().out.partition("\n\n")
    rows = [ln for ln in table.splitlines() if ln.startswith("torch_ref")]
    assert len(rows) == 2 and any("copycat==9.9" in r for r in rows) and all("ambiguous" in r for r in rows)
    # Under the table, a description of a claimed name says whose it is (the copycat has none).
    said = [ln for ln in descriptions.splitlines() if "torch_ref" in ln]
    assert len(said) == 1 and said[0].startswith(f"{GENUINE}  exact fp32 PyTorch"), said


def test_a_spec_cannot_claim_another_distribution(install_dist):
    install_dist("liar", "1.0", {"copycat_plugin.py": squatter(', distribution="mqa-provider-torch-ref"')},
                 {"mqa_core.providers": {"liar": "copycat_plugin"}})
    with pytest.warns(RuntimeWarning, match="says it comes from 'mqa-provider-torch-ref', but liar==1.0"):
        assert mqa_core.get_provider("cpu").id == GENUINE
    (b,) = registry.state().discovery.broken
    assert (b.entry_point, b.stage) == ("liar", "spec")


@pytest.mark.parametrize("name", ["torch_ref\n", "torch_ref ", "Torch_ref", "torch ref", "_x", "x\x00"])
def test_names_are_matched_whole(name):
    with pytest.raises(ValueError, match="name"):
        mqa_core.ProviderSpec(name=name, ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                              priority=1, load="a:b")


def test_allowlist_imports_nothing_else(install_dist, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    install_dist("tripwire", "1.0", {"tripwire_plugin.py": f"open({str(marker)!r}, 'w').write('x')\n"
                                                           "raise SystemExit('imported although not allowed')\n"},
                 {"mqa_core.providers": {"tripwire": "tripwire_plugin"}})
    reload_with(monkeypatch, MQA_PLUGINS="MQA-PROVIDER-TORCH-REF")
    assert mqa_core.get_provider("cpu").id == GENUINE
    found = registry.state().discovery
    assert not marker.exists() and "tripwire_plugin" not in sys.modules and found.broken == ()
    assert "tripwire" in found.skipped
    assert {p.entry_point: p.status for p in found.plugins}["tripwire"] == "skipped"


def test_allowlist_by_distribution_in_a_fresh_process_imports_no_other_plugin(tmp_path):
    import subprocess

    code = ("import sys, mqa_core; p = mqa_core.get_provider('cpu');"
            "mods = [m for m in ('mqa_provider_gluon', 'mqa_provider_flydsl', 'mqa_example_chunked')"
            " if m in sys.modules]; print(p.id, mods)")
    env = {**__import__("os").environ, "MQA_PLUGINS": "mqa-provider-torch-ref"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == f"{GENUINE} []", out.stdout + out.stderr


def test_identical_results_regardless_of_squatter_priority(copycat, monkeypatch):
    # The squatter's priority (999) buys nothing: the unambiguous providers keep their order.
    d = mqa_core.explain("cpu")
    assert [c.name for c in d.accepted] == [c.name for c in d.accepted if c.name != "torch_ref"]
    assert torch.float8_e4m3fn  # torch is importable for the other tests of this file


SHADOW = squatter(priority=0, module="shadow_plugin")


@pytest.fixture
def shadow(install_dist, monkeypatch):
    """A second ``mqa_provider_torch_ref`` dist-info, earlier on sys.path than the genuine one."""
    install_dist("mqa_provider_torch_ref", "0.2.0", {"shadow_plugin.py": SHADOW},
                 {"mqa_core.providers": {"torch_ref": "shadow_plugin"}})
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref", MQA_PROVIDER=GENUINE)


def test_a_distribution_installed_twice_is_loud_and_neither_copy_serves(shadow):
    """Issue 37: importlib.metadata.entry_points() keeps only the first copy, so the shadow served
    silently. Now neither copy is imported or chosen, and both are reported."""
    with pytest.warns(RuntimeWarning, match="installed 2 times on sys.path"):
        with pytest.raises(mqa_core.ProviderUnavailableError) as err:
            mqa_core.get_provider("cpu")
    assert "shadow_plugin" not in sys.modules
    found = registry.state().discovery
    assert found.specs == () and [b.stage for b in found.broken] == ["shadowed", "shadowed"]
    assert "neither is imported or chosen until one is removed" in str(err.value)
    d = mqa_core.explain("cpu")
    assert d.chosen is None and [c.code for c in d.candidates] == ["broken", "broken"]


def test_providers_and_explain_show_a_shadowed_distribution(shadow, capsys):
    from mqa_core.cli.main import main

    assert main(["providers", "--arch", "cpu"]) == 0
    assert main(["explain", "--arch", "cpu"]) == 3
    out = capsys.readouterr().out
    shown = [ln for ln in out.splitlines() if "installed 2 times on sys.path" in ln]
    assert len(shown) == 4 and all("mqa-provider-torch-ref" in ln for ln in shown), out
    assert sum(ln.startswith("BROKEN plugin torch_ref") for ln in shown) == 2


def _mqa(site, *args):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "mqa_core.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture
def copycat_site(install_dist):
    return install_dist("copycat", "9.9", {"copycat_plugin.py": squatter()},
                        {"mqa_core.providers": {"torch_ref": "copycat_plugin"}})


def test_check_refuses_a_claimed_bare_name_in_one_line(copycat_site):
    """Issue 37: a KeyError traceback (exit 1) before."""
    r = _mqa(copycat_site, "check", "--provider", "torch_ref")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip() == ("mqa: error: provider name 'torch_ref' is claimed by copycat:torch_ref and "
                                f"{GENUINE}: name one as distribution:name"), r.stderr


def test_check_certifies_the_genuine_provider_by_distribution_colon_name(copycat_site):
    """Issue 37: "not installed" before, so the genuine provider could not be certified."""
    import json

    r = _mqa(copycat_site, "check", "--provider", GENUINE, "--dtype", "e4m3fn", "--json",
             "-k", "spec or selection or (prefill_window and causal)")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["providers"][GENUINE]
    assert row["failed"] == 0 and row["passed"] == 4, row
    r = _mqa(copycat_site, "check", "--provider", "copycat:torch_ref", "--dtype", "e4m3fn", "-k", "prefill_window")
    assert r.returncode == 1 and "copycat:torch_ref  FAIL" in r.stdout, r.stdout + r.stderr


def test_an_identical_second_copy_is_one_distribution(install_dist, monkeypatch):
    """An editable install's egg-info in its source tree beside its dist-info (or a directory on
    sys.path twice): the copies say the same, so the same code serves whichever comes first."""
    import importlib.metadata as md

    genuine = md.distribution("mqa-provider-torch-ref")
    eps = {ep.name: ep.value for ep in genuine.entry_points if ep.group == "mqa_core.providers"}
    install_dist("mqa_provider_torch_ref", genuine.version, {}, {"mqa_core.providers": eps})
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref")
    p = mqa_core.get_provider("cpu")  # the first copy's spelling of the name: the same distribution
    assert p.name == "torch_ref" and p.spec.distribution.replace("_", "-") == "mqa-provider-torch-ref"
    found = registry.state().discovery
    assert found.broken == () and [p.entry_point for p in found.plugins if p.status == "loaded"] == list(eps)


def test_a_second_copy_of_another_version_is_a_shadow(install_dist, monkeypatch):
    import importlib.metadata as md

    genuine = md.distribution("mqa-provider-torch-ref")
    eps = {ep.name: ep.value for ep in genuine.entry_points if ep.group == "mqa_core.providers"}
    install_dist("mqa_provider_torch_ref", "99.0", {}, {"mqa_core.providers": eps})
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref")
    with pytest.warns(RuntimeWarning, match=r"installed 2 times on sys.path \(.*99\.0 at "):
        assert registry.state().discovery.specs == ()


def test_identical_copies_count_once_beside_a_shadow(install_dist, monkeypatch):
    """CI's editable install leaves an egg-info in the source tree beside its dist-info; a third,
    different copy is then one shadow of one distribution, not two: "installed 2 times"."""
    import importlib.metadata as md

    genuine = md.distribution("mqa-provider-torch-ref")
    eps = {ep.name: ep.value for ep in genuine.entry_points if ep.group == "mqa_core.providers"}
    install_dist("mqa_provider_torch_ref", genuine.version, {}, {"mqa_core.providers": eps})
    install_dist("mqa_provider_torch_ref", "99.0", {}, {"mqa_core.providers": eps})
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-ref")
    with pytest.warns(RuntimeWarning, match=r"installed 2 times on sys.path \(.*99\.0 at "):
        assert registry.state().discovery.specs == ()
