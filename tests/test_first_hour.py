"""Issue 36's rough edges of a new user's first hour, one test each (items 1-8, 10, 17; items 9 and 15
are in test_schedule.py, the documentation's items in test_docs.py). Each failed on the old behaviour."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import mqa_core
from mqa_core.cli.main import main
from mqa_core.errors import SettingsError
from mqa_core.testing import calc_diff, make_prefill_inputs, pack_paged_cache


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_1_tune_refuses_an_unwritable_out_before_measuring(capsys, monkeypatch, tmp_path) -> None:
    from mqa_core.cli import tune

    monkeypatch.setattr(tune, "measure", lambda *a, **k: pytest.fail("measured before checking --out"))
    code, out, err = _run(capsys, "tune", "--device", "cpu", "--providers", "torch_ref", "--out",
                          str(tmp_path / "missing" / "t.json"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("mqa: error: --out ") and "does not exist" in err


def test_1_bench_refuses_an_unwritable_json_before_measuring(capsys, tmp_path) -> None:
    code, out, err = _run(capsys, "bench", "--device", "cpu", "--json", str(tmp_path / "missing" / "rows.jsonl"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "--json" in err, err


def test_2_bench_with_an_unknown_provider_prints_one_line_and_no_table(capsys) -> None:
    code, out, err = _run(capsys, "bench", "--device", "cpu", "--providers", "nonexistent")
    assert code == 2 and out == "", out  # no decision table first
    assert err.count("\n") == 1 and err.startswith("mqa: error: provider 'nonexistent' is not installed"), err


def test_3_bench_with_a_provider_that_cannot_serve_gives_its_reason_exit_3(capsys) -> None:
    code, out, err = _run(capsys, "bench", "--device", "cpu", "--providers", "gluon")
    assert code == 3 and out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith("mqa: error: provider gluon (") and "rejected [check]" in err, err
    assert "MQA_PROVIDER" not in err  # the user set none: the preference is not the reason


def test_3_check_and_bench_refuse_alike(capsys) -> None:
    code, _, err = _run(capsys, "check", "--device", "cpu", "--provider", "gluon")
    assert code == 3 and err.count("\n") == 1 and "rejected [check]" in err


def test_4_a_negative_shape_is_judged_not_taken_for_an_option(capsys) -> None:
    code, out, err = _run_exit(capsys, "explain", "--shape", "-1,256,32,128")
    assert code == 2 and err.count("\n") == 1, err
    assert "expected one argument" not in err and "'-1,256,32,128'" in err and "non-negative" in err, err


def _run_exit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_5_shape_errors_name_the_dimensions() -> None:
    x = make_prefill_inputs(29, 83, 32, 128)
    with pytest.raises(ValueError) as err:
        mqa_core.fp8_mqa_logits(x.q[0], (x.k, x.k_scale), x.weights, x.ks, x.ke)
    assert "'?'" not in str(err.value) and "q must have shape [M, H, D] (3 dimensions)" in str(err.value)
    with pytest.raises(ValueError) as err:
        mqa_core.fp8_mqa_logits(x.q, (x.k, x.k_scale), x.weights[:3], x.ks, x.ke)
    assert "weights must have shape [M, H] = [29, 32]; got float32 [3, 32]" in str(err.value)


def test_6_an_allow_list_matching_nothing_is_not_called_an_empty_install(capsys, monkeypatch) -> None:
    monkeypatch.setenv("MQA_PLUGINS", "nonexistent")
    mqa_core.reload()
    code, out, _ = _run(capsys, "providers")
    assert code == 0 and "no provider installed" not in out
    assert "no provider loaded: MQA_PLUGINS leaves out every installed plugin: " in out and "torch_ref" in out


def test_7_unknown_mqa_names_are_warned_with_the_closest_known_one(monkeypatch) -> None:
    monkeypatch.setenv("MQA_MEMORY_MB", "abc")
    mqa_core.reload()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mqa_core.get_provider("cpu")
    text = " ".join(str(w.message) for w in seen)
    assert "MQA_MEMORY_MB is not a setting" in text and "did you mean MQA_TORCH_REF_MEMORY_MB?" in text, text


def test_7_a_provider_setting_is_checked_on_any_machine(monkeypatch) -> None:
    monkeypatch.setenv("MQA_GLUON_PDL", "2")
    mqa_core.reload()
    with pytest.raises(SettingsError, match="MQA_GLUON_PDL='2' is not a boolean"):
        mqa_core.get_provider("cpu")


def test_8_a_requested_arch_is_not_called_this_system(capsys) -> None:
    code, out, _ = _run(capsys, "explain", "--arch", "sm_90")
    assert "this system has" not in out and "declares archs gfx942, gfx950; asked for sm_90" in out, out


def test_10_pack_paged_cache_serves_the_decode_op() -> None:
    """Each sequence's keys packed by the public helper give, through the paged op, what the prefill op
    gives on the same keys (next_n = 1: a row sees its whole context)."""
    g = torch.Generator().manual_seed(3)
    lengths, d, h = [5, 130, 64], 128, 8
    keys = [torch.randn(n, d, generator=g).to(torch.float8_e4m3fn) for n in lengths]
    scales = [torch.rand(n, generator=g) + 0.1 for n in lengths]
    cache = pack_paged_cache(keys, scales, block_size=64)
    assert cache.kv_cache.shape == (1 + 3 + 1, 64, 1, d + 4) and cache.max_context_len == 130
    q = torch.randn(len(lengths), 1, h, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(len(lengths), h, generator=g)
    out = mqa_core.fp8_paged_mqa_logits(q, *cache[:1], w, *cache[1:])
    for b, n in enumerate(lengths):
        ks, ke = torch.zeros(1, dtype=torch.int32), torch.full((1,), n, dtype=torch.int32)
        ref = mqa_core.fp8_mqa_logits(q[b], (keys[b], scales[b]), w[b:b + 1], ks, ke)
        assert calc_diff(out[b:b + 1, :n], ref[:, :n]) < 1e-9 and bool(torch.isinf(out[b, n:]).all())
    with pytest.raises(ValueError, match=r"scales\[1\] must be float32 \[130\]"):
        pack_paged_cache(keys, [scales[0], scales[1][:3], scales[2]])


def test_17_check_without_pytest_names_the_extra(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest", None)  # what a wheel install without the extra has
    code, out, err = _run(capsys, "check", "--device", "cpu")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "pip install 'mqa-core[check]'" in err, err


def test_3_nothing_can_serve_is_one_line_too(capsys, monkeypatch) -> None:
    """A forced provider that cannot serve: exit 3, one line with the verdict and the command that
    prints every provider's reason (the old message was the whole table on stderr)."""
    monkeypatch.setenv("MQA_PROVIDER", "gluon")
    mqa_core.reload()
    code, out, err = _run(capsys, "demo", "--device", "cpu")
    assert code == 3 and out == "" and err.count("\n") == 1, err
    assert "no provider can serve fp8_mqa_logits on cpu" in err and "MQA_PROVIDER=gluon" in err
    assert "mqa explain --arch cpu --op fp8_mqa_logits --shape 256,512,32,128" in err, err


def test_17_the_check_extra_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("pytest") for r in meta["optional-dependencies"]["check"])
