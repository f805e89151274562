"""The ``aiter`` provider (AITER's Triton/Gluon prefill and paged kernels) against a stand-in AITER on
the CPU: which provider serves gfx942/gfx950 and why (explain), the argument mapping and dtype pairs
(prefill), the paged layout conversion (gathered, preshuffled, relabelled pools; 1-D and 2-D
lengths; next_n up to 4), all checked against the float64 oracle."""

from __future__ import annotations

import pytest
import torch
from mqa_provider_flydsl import AITER_SPEC, aiter_kernel, aiter_probe

import mqa_core
from mqa_core import Problem
from mqa_core.cli.main import main
from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache
from mqa_core.testing import make_inputs, make_paged_inputs
from mqa_core.testing.checks import Case
from mqa_core.testing.runner import check_paged, check_prefill

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def _calls() -> list:
    import importlib

    return importlib.import_module("aiter.ops.triton.attention.pa_mqa_logits").CALLS + \
        importlib.import_module("aiter.ops.triton.attention.fp8_mqa_logits").CALLS


def _last(op: str) -> dict:
    return [c for c in _calls() if c["op"] == op][-1]


def _kernel(arch: str) -> aiter_kernel.AiterKernel:
    return aiter_kernel.AiterKernel(arch_of_device=lambda device: arch)


@pytest.fixture
def gfx(monkeypatch):
    def set_arch(arch: str) -> str:
        monkeypatch.setenv("MQA_TEST_AITER_GFX", arch)
        return arch
    return set_arch


# -- which provider, and why --------------------------------------------------------------------------

def test_spec_declares_what_aiter_takes():
    assert AITER_SPEC.priority == 250 and AITER_SPEC.distribution in ("", "mqa-provider-flydsl")
    assert AITER_SPEC.pairs_for("gfx950") == {("float8_e4m3fn", "float8_e4m3fn")}
    assert len(AITER_SPEC.pairs_for("gfx942")) == 4 and not AITER_SPEC.pairs_for("sm_90")
    assert AITER_SPEC.shape_limits(Problem(8, 100, 64, 128)) is None
    assert "H=16" in AITER_SPEC.shape_limits(Problem(8, 100, 16, 128))
    assert "block_size=48" in AITER_SPEC.shape_limits(Problem(8, 100, 64, 128, next_n=1, block_size=48))
    assert "D=64 is not 128" in AITER_SPEC.shape_limits(Problem(8, 100, 64, 64, next_n=1, block_size=64))


def test_without_aiter_it_says_why(capsys):
    assert main(["explain", "--arch", "gfx950"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] in (["aiter"], ["*", "aiter"]))
    assert "250" in row and "rejected [check] AMD AITER not importable: no module named 'aiter'" in row
    assert "chosen: gluon" in out


def test_the_async_aiter_is_named(async_aiter):
    c = mqa_core.explain("gfx942").candidate("aiter")
    assert c.code == "check" and "unrelated async-iterator package" in c.reason


def test_an_aiter_without_the_triton_entries_says_so(amd_aiter):
    amd_aiter(triton=False)
    c = mqa_core.explain("gfx950").candidate("aiter")
    assert c.code == "check" and "has no aiter.ops.triton...fp8_mqa_logits (added in ROCm/aiter#1296)" in c.reason


@pytest.mark.parametrize("op", ["fp8_mqa_logits", "fp8_paged_mqa_logits"])
def test_gfx950_with_a_gfx942_only_flydsl_chooses_aiter(amd_aiter, op):
    """The released FlyDSL entry has no gfx950 path: AITER's Triton/Gluon kernel serves gfx950 (as vLLM's
    ROCm indexer calls it there); the paged op is AITER's on both archs (FlyDSL serves no decode)."""
    amd_aiter(gfx950=False, triton=True)
    d = mqa_core.explain("gfx950", op=op)
    assert d.chosen == "aiter", str(d)
    assert "highest priority (250)" in d.why
    d942 = mqa_core.explain("gfx942", op=op)
    assert d942.chosen == ("flydsl" if op == "fp8_mqa_logits" else "aiter"), str(d942)


def test_flydsl_first_where_its_arch_path_is_present(amd_aiter):
    amd_aiter(gfx950=True, triton=True)
    for arch in ("gfx942", "gfx950"):
        d = mqa_core.explain(arch)
        assert d.chosen == "flydsl" and d.candidate("aiter").accepted, str(d)
    blocked = mqa_core.explain("gfx950")
    assert blocked.candidate("gluon").accepted  # the own kernels stay in the plan, behind both


def test_mqa_provider_and_disable_pick_between_them(amd_aiter, monkeypatch):
    amd_aiter(gfx950=True, triton=True)
    monkeypatch.setenv("MQA_DISABLE_PROVIDERS", "flydsl")
    mqa_core.reload()
    assert mqa_core.explain("gfx950").chosen == "aiter"
    monkeypatch.setenv("MQA_DISABLE_PROVIDERS", "flydsl,aiter")
    mqa_core.reload()
    assert mqa_core.explain("gfx950").chosen == "gluon"


def test_cli_explain_gfx950_names_the_choice(amd_aiter, capsys):
    amd_aiter(gfx950=False, triton=True)
    assert main(["explain", "--arch", "gfx950"]) == 0
    out = capsys.readouterr().out
    assert "chosen: aiter (mqa-provider-flydsl)" in out
    assert "is gfx942-only" in out  # flydsl's reason on gfx950


# -- prefill ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,q_dtype,k_dtype", [("gfx942", FNUZ, FNUZ), ("gfx942", FN, FN), ("gfx942", FN, FNUZ),
                                                  ("gfx942", FNUZ, FN), ("gfx950", FN, FN)])
@pytest.mark.parametrize("clean", [True, False])
def test_prefill_against_the_oracle(amd_aiter, gfx, arch, q_dtype, k_dtype, clean):
    amd_aiter(triton=True)
    gfx(arch)
    x = make_inputs(Problem(21, 300, 64, 128), window="ragged", dtype=q_dtype, k_dtype=k_dtype, seed=7,
                    k_scale_2d=True)
    out = _kernel(arch).fp8_mqa_logits(*x.args(), clean_logits=clean)
    check_prefill(out, x, Case("aiter", "fp8_mqa_logits", arch, Problem(21, 300, 64, 128), 7, 7), clean=clean)
    call = _last("prefill")
    assert (call["q"], call["kv"]) == (q_dtype, k_dtype)  # passed as they came: AITER converts on gfx942
    assert call["kv_scales"] == (300,)


def test_prefill_refuses_fnuz_on_gfx950(amd_aiter, gfx):
    amd_aiter(triton=True)
    gfx("gfx950")
    x = make_inputs(Problem(4, 16, 32, 64), dtype=FNUZ, seed=1)
    with pytest.raises(TypeError, match=r"aiter: AITER's MQA-logits kernels on gfx950 take \(q, k\) dtypes "
                                        r"\(float8_e4m3fn, float8_e4m3fn\); got \(float8_e4m3fnuz"):
        _kernel("gfx950").fp8_mqa_logits(*x.args())


# -- decode -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,dtype", [("gfx942", FNUZ), ("gfx942", FN), ("gfx950", FN)])
@pytest.mark.parametrize("next_n,lens_2d", [(1, False), (2, True), (3, False), (4, True)])
@pytest.mark.parametrize("clean", [True, False])
def test_paged_against_the_oracle(amd_aiter, gfx, arch, dtype, next_n, lens_2d, clean):
    amd_aiter(triton=True)
    gfx(arch)
    x = make_paged_inputs(3, next_n, 64, 128, 333, block_size=64, seed=next_n, dtype=dtype, lens_2d=lens_2d)
    out = _kernel(arch).fp8_paged_mqa_logits(*x.args(), clean_logits=clean)
    check_paged(out, x, Case("aiter", "fp8_paged_mqa_logits", arch, Problem(3 * next_n, 333, 64, 128), 0, 0),
                clean=clean)
    call = _last("paged")
    # the gathered pool in AITER's preshuffled layout, next_n = 1 over the B * next_n rows, 1-D lengths
    assert call["Preshuffle"] and call["KVBlockSize"] == 64 and call["next_n"] == 1 and call["ChunkK"] == 256
    assert call["q"] == (FNUZ if arch == "gfx942" else FN)  # gfx942's e4m3fn relabelled exactly
    assert call["kv_cache"][0] == 3 * 6 and call["kv_indices"].shape == (3 * next_n, 6)


def test_paged_per_token_pages_and_strided_pools(amd_aiter, gfx):
    amd_aiter(triton=True)
    gfx("gfx950")
    x = make_paged_inputs(2, 2, 32, 128, 70, block_size=1, seed=3, pool_pad_bytes=64)
    out = _kernel("gfx950").fp8_paged_mqa_logits(*x.args(), clean_logits=True)
    check_paged(out, x, Case("aiter", "fp8_paged_mqa_logits", "bs1", Problem(4, 70, 32, 128), 0, 0), clean=True)
    call = _last("paged")
    assert not call["Preshuffle"] and call["KVBlockSize"] == 1


def test_paged_block_ids_outside_the_pool_are_never_read_and_give_minus_inf(amd_aiter, gfx):
    amd_aiter(triton=True)
    gfx("gfx942")
    x = make_paged_inputs(2, 1, 64, 128, 256, block_size=64, seed=4, dtype=FNUZ)
    tables = x.block_tables.clone()
    tables[0, 1] = 10_000
    tables[1, 0] = -3
    out = _kernel("gfx942").fp8_paged_mqa_logits(x.q, x.kv_cache, x.weights, x.context_lens, tables, 256)
    ref = fp8_paged_mqa_logits_ref(x.q, x.kv_cache, x.weights, x.context_lens, tables, 256, FNUZ)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    inside = torch.isfinite(ref)
    assert torch.allclose(out[inside].double(), ref[inside], rtol=1e-5, atol=1e-4)


def test_paged_through_the_public_op(amd_aiter, gfx, monkeypatch):
    """Selected by mqa-core for gfx942 tensors (the device's arch substituted), with the kit's checks."""
    amd_aiter(triton=True)
    gfx("gfx942")
    monkeypatch.setattr(aiter_kernel, "_arch_of_device", lambda device: "gfx942")
    monkeypatch.setattr(aiter_kernel.KERNEL, "_arch_of_device", lambda device: "gfx942")
    provider = mqa_core.get_provider("gfx942", op="fp8_paged_mqa_logits")
    assert provider.name == "aiter"
    x = make_paged_inputs(2, 2, 64, 128, 200, block_size=64, seed=5, dtype=FNUZ, lens_2d=True)
    pool = pad_paged_cache(x.kv_cache, 128)
    out = provider.impl.fp8_paged_mqa_logits(x.q, pool, x.weights, x.context_lens, x.block_tables, 200)
    check_paged(out, x, Case("aiter", "fp8_paged_mqa_logits", "public", Problem(4, 200, 64, 128), 0, 0), clean=True)


def test_preshuffle_is_the_tiled_order():
    v = torch.arange(2 * 32 * 128, dtype=torch.int32).view(2, 32, 128)
    s = aiter_kernel.preshuffle(v)
    # token t, byte d of a block sits at (t // 16) * 16 * 128 + (d // 16) * 256 + (t % 16) * 16 + d % 16
    t, d = 21, 77
    flat = s[1].reshape(-1)
    assert int(flat[(t // 16) * 2048 + (d // 16) * 256 + (t % 16) * 16 + d % 16]) == int(v[1, t, d])


def test_probe_reset_forgets(amd_aiter):
    amd_aiter(triton=True)
    assert aiter_probe.check("gfx942") is None
    assert aiter_probe.check("sm_90").startswith("AITER's Triton/Gluon MQA-logits kernels are declared here")
