"""Settings: every MQA_* variable parsed once and strictly; a bad value raises naming the variable;
names that match nothing installed are warned about (a typo in a block list must not fail open)."""

import pytest

import mqa_core
from mqa_core import SettingsError
from mqa_core.settings import ENV_VARS, Settings
from mqa_core.testing import make_inputs


def reload_with(monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mqa_core.reload()


@pytest.mark.parametrize("text, value", [(t, True) for t in ("1", "true", "TRUE", "yes", "Yes", "on", " ON ")]
                         + [(t, False) for t in ("0", "false", "False", "no", "NO", "off", "")])
def test_booleans(text, value):
    assert Settings.from_env({"MQA_STRICT_PLUGINS": text}).strict is value


def test_strict_on_is_strict(install_dist, monkeypatch):
    install_dist("broken-one", "0.1", {"broken_plugin.py": "raise ImportError('missing libfoo.so')\n"},
                 {"mqa_core.providers": {"broken": "broken_plugin"}})
    reload_with(monkeypatch, MQA_STRICT_PLUGINS="on")
    with pytest.raises(mqa_core.PluginError, match="missing libfoo.so"):
        mqa_core.get_provider("cpu")


@pytest.mark.parametrize("var, text, words", [
    ("MQA_STRICT_PLUGINS", "maybe", "is not a boolean"),
    ("MQA_STRICT_PLUGINS", "2", "is not a boolean"),
    ("MQA_VALIDATE", "bogus", "use one of cheap, full"),
    ("MQA_VALIDATE", "1", "use one of cheap, full"),
    ("MQA_PROVIDER", "torch ref", "'torch ref' is not a provider name or distribution:name"),
    ("MQA_PROVIDER", "a:b:c", "'a:b:c' is not a provider name"),
    ("MQA_PROVIDER", ":torch_ref", "is not a provider name"),
    ("MQA_PROVIDER", "torch_ref,9x", "'9x' is not"),
    ("MQA_DISABLE_PROVIDERS", "gluon;triton", "'gluon;triton' is not a provider name, a distribution name"),
    ("MQA_PLUGINS", "a/b", "'a/b' is not a distribution name or distribution:entry_point"),
    ("MQA_PLUGINS", "a:", "'a:' is not a distribution name or distribution:entry_point"),
])
def test_bad_values_raise_naming_the_variable(monkeypatch, var, text, words):
    reload_with(monkeypatch, **{var: text})
    for call in (lambda: mqa_core.get_provider("cpu"), lambda: mqa_core.explain("cpu"),
                 lambda: mqa_core.fp8_mqa_logits(*make_inputs(mqa_core.Problem(2, 3, 4, 64)).args())):
        with pytest.raises(SettingsError) as err:
            call()
        assert str(err.value).startswith(f"{var}={text!r}") and words in str(err.value)
        assert isinstance(err.value, ValueError)
    monkeypatch.delenv(var)
    mqa_core.reload()
    assert mqa_core.get_provider("cpu")  # nothing bad was cached


@pytest.mark.parametrize("text", ["abc", "0", "-1", "inf", "nan", "1e"])
def test_torch_ref_memory_bound_is_parsed_strictly(monkeypatch, text):
    inp = make_inputs(mqa_core.Problem(3, 10, 4, 64))
    monkeypatch.setenv("MQA_TORCH_REF_MEMORY_MB", text)
    with pytest.raises(SettingsError, match=rf"MQA_TORCH_REF_MEMORY_MB='{text}' must be a positive number"):
        mqa_core.fp8_mqa_logits(*inp.args())


@pytest.mark.parametrize("text, mib", [("", 512), ("0.05", 0.05), (" 8 ", 8)])
def test_torch_ref_memory_bound_values(monkeypatch, text, mib):
    from mqa_provider_torch_ref.kernels import memory_bound_bytes

    monkeypatch.setenv("MQA_TORCH_REF_MEMORY_MB", text)
    assert memory_bound_bytes() == int(mib * 2**20)


def test_env_positive_number_is_generic():
    assert mqa_core.env_positive_number("X_MB", 3.0, {}) == 3.0
    assert mqa_core.env_positive_number("X_MB", 3.0, {"X_MB": "2.5"}) == 2.5
    with pytest.raises(SettingsError, match="X_MB='-2'"):
        mqa_core.env_positive_number("X_MB", 3.0, {"X_MB": "-2"})


@pytest.mark.parametrize("env, expect", [
    ({"MQA_PROVIDER": "a, b,a"}, Settings(preference=("a", "b"))),
    ({"MQA_PROVIDER": "Torch_Ref,MQA_Provider.Gluon:Gluon"},
     Settings(preference=("torch_ref", "mqa-provider-gluon:gluon"))),
    ({"MQA_PLUGINS": ""}, Settings(plugins=frozenset())),
    ({"MQA_PLUGINS": " , "}, Settings(plugins=frozenset())),
    ({"MQA_DISABLE_PROVIDERS": "x,Mqa_Provider_Gluon", "MQA_STRICT_PLUGINS": "1"},
     Settings(disabled=frozenset({"x", "mqa_provider_gluon"}), strict=True)),  # matched as name or dist
    ({"MQA_VALIDATE": "FULL"}, Settings(validate_full=True)),
    ({"MQA_VALIDATE": "cheap"}, Settings()),
])
def test_settings_from_env(env, expect):
    assert Settings.from_env(env) == expect


def test_wrong_case_in_the_block_list_still_blocks(monkeypatch, recwarn):
    reload_with(monkeypatch, MQA_DISABLE_PROVIDERS="Torch_Ref", MQA_PROVIDER="torch_ref")
    with pytest.raises(mqa_core.ProviderUnavailableError, match=r"\[blocked\]"):
        mqa_core.get_provider("cpu")
    assert not [w for w in recwarn if "MQA_DISABLE_PROVIDERS" in str(w.message)]


def test_block_list_by_distribution_blocks_all_its_providers(monkeypatch):
    reload_with(monkeypatch, MQA_DISABLE_PROVIDERS="mqa_provider_gluon")
    d = mqa_core.explain("sm_90")
    assert d.candidate("gluon").code == d.candidate("triton").code == "blocked"


def test_a_typo_in_the_block_list_is_warned_about(monkeypatch):
    reload_with(monkeypatch, MQA_DISABLE_PROVIDERS="torch-reff,gluon")
    with pytest.warns(RuntimeWarning, match=r"MQA_DISABLE_PROVIDERS names torch-reff, which matches no installed "
                                            r"provider or distribution, so it blocks nothing \(installed: .*torch_ref"):
        d = mqa_core.explain("sm_90")
    assert d.candidate("gluon").code == "blocked"


def test_unknown_preference_is_warned_about_and_the_call_fails(monkeypatch):
    reload_with(monkeypatch, MQA_PROVIDER="torch_reff")
    with pytest.warns(RuntimeWarning, match="MQA_PROVIDER names torch_reff, which no installed provider is"):
        with pytest.raises(mqa_core.ProviderUnavailableError, match="torch_reff not installed"):
            mqa_core.get_provider("cpu")


def test_allowlist_naming_nothing_installed_says_what_was_asked_and_what_exists(monkeypatch):
    reload_with(monkeypatch, MQA_PLUGINS="mqa-provider-torch-reff")
    with pytest.warns(RuntimeWarning, match="MQA_PLUGINS names mqa-provider-torch-reff, which matches no installed "
                                            "plugin distribution .*mqa-provider-torch-ref:torch_ref"):
        with pytest.raises(mqa_core.ProviderUnavailableError) as err:
            mqa_core.get_provider("cpu")
    msg = str(err.value)
    assert "no provider is installed" not in msg
    assert "MQA_PLUGINS=mqa-provider-torch-reff loads only" in msg and "torch_ref (mqa-provider-torch-ref)" in msg


def test_settings_are_read_once_per_reload(monkeypatch):
    assert mqa_core.get_provider("cpu").name == "torch_ref"
    monkeypatch.setenv("MQA_PROVIDER", "example_chunked")
    assert mqa_core.get_provider("cpu").name == "torch_ref"  # not re-read per call
    mqa_core.reload()
    assert mqa_core.get_provider("cpu").name == "example_chunked"


def test_help_lists_every_variable():
    from mqa_core.cli.main import parser

    text = parser().format_help()
    for var in ENV_VARS:
        assert var in text


# -- issue 37: every MQA_* variable read once per state; a bad one is exit 2 from the start ---------

def test_provider_variables_are_read_once_per_state(monkeypatch):
    from mqa_provider_torch_ref.kernels import memory_bound_bytes

    reload_with(monkeypatch, MQA_TORCH_REF_MEMORY_MB="8")
    inp = make_inputs(mqa_core.Problem(3, 10, 4, 64))
    mqa_core.fp8_mqa_logits(*inp.args())
    assert memory_bound_bytes() == 8 * 2**20
    monkeypatch.setenv("MQA_TORCH_REF_MEMORY_MB", "abc")  # not read per call
    mqa_core.fp8_mqa_logits(*inp.args())
    assert memory_bound_bytes() == 8 * 2**20
    mqa_core.reload()
    with pytest.raises(SettingsError, match="MQA_TORCH_REF_MEMORY_MB='abc' must be a positive number"):
        mqa_core.get_provider("cpu")


@pytest.mark.parametrize("var, text, words", [
    ("MQA_TORCH_REF_MEMORY_MB", "abc", "must be a positive number"),
    ("MQA_TORCH_REF_MEMORY_MB", "\u0665\u0661\u0662", "must be a positive number"),  # 512 in Arabic-Indic digits
    ("MQA_GLUON_PDL", "sometimes", "is not a boolean"),
])
def test_a_bad_provider_variable_fails_every_command_with_exit_2(monkeypatch, capsys, var, text, words):
    """`mqa providers` exited 0 with MQA_TORCH_REF_MEMORY_MB=abc, which only a call then refused."""
    from mqa_core.cli.main import main

    monkeypatch.setenv(var, text)
    for argv in (["providers", "--arch", "cpu"], ["explain", "--arch", "cpu"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"mqa: error: {var}={text!r} {words}" + (
            ": use one of 1, true, yes, on, 0, false, no, off\n" if "boolean" in words else "\n"), err
