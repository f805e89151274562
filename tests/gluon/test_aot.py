"""The Triton kernel built ahead of time for GPUs this machine lacks: fp8 MMA used, nothing spilled."""

from __future__ import annotations

import functools
import re

import pytest

triton = pytest.importorskip("triton")

from mqa_provider_gluon import aot  # noqa: E402


def _backend_missing(target: str) -> str | None:
    backend = aot.TARGETS[target].backend
    if backend == "hip" and "amd" not in triton.backends.backends:
        return "this triton has no AMD backend"
    if backend == "cuda":
        if "nvidia" not in triton.backends.backends:
            return "this triton has no NVIDIA backend"
        try:
            _ = triton.knobs.nvidia.ptxas.path
        except Exception as e:  # the tool lookup raises when ptxas is not shipped or found
            return f"no ptxas: {e}"
    return None


@functools.cache
def build(target: str, h: int = 64):
    reason = _backend_missing(target)
    if reason:
        pytest.skip(f"cannot compile for {target} here: {reason}")
    return aot.compile_for(target, h=h)


def test_gfx942_uses_fp8_mfma_on_fnuz():
    asm = build("gfx942")
    ops = aot.mfma_ops(asm)
    assert ops and all(op.endswith("_fp8_fp8") for op in ops), ops
    assert "f8E4M3FNUZ" in asm["ttgir"]  # gfx942 reads fp8 as e4m3fnuz
    facts = aot.amd_facts(asm)
    assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts


def test_gfx950_uses_fp8_mfma_on_ocp_e4m3():
    asm = build("gfx950")
    ops = aot.mfma_ops(asm)
    assert ops and all("f8f6f4" in op or op.endswith("_fp8_fp8") for op in ops), ops
    # f8f6f4 MFMAs pick the operand formats with cbsz/blgp; absent (0) means fp8 e4m3 for both.
    lines = [line for line in asm["amdgcn"].splitlines() if "v_mfma" in line]
    assert not any(re.search(r"(cbsz|blgp):[1-9]", line) for line in lines), lines[:3]
    facts = aot.amd_facts(asm)
    assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts


@pytest.mark.parametrize("h", [32, 64])
def test_sm90_uses_fp8_wgmma_without_spills(h):
    facts = aot.sass_facts(build("sm_90", h))
    assert facts.qgmma > 0, facts  # fp8 warpgroup MMA, not an upcast to HGMMA/HMMA
    assert facts.hgmma == 0 and facts.mma_other == 0, facts
    assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    assert 0 < facts.registers <= 168, facts  # room for three programs per SM


@pytest.mark.parametrize("h", [32, 64])
def test_sm100_uses_fp8_tcgen05_mma(h):
    # The spec claims sm_100 for the Triton path: the build must use Blackwell's fp8 tensor-core MMA.
    ptx = build("sm_100", h)["ptx"]
    assert "tcgen05.mma.cta_group::1.kind::f8f6f4" in ptx


def test_unknown_target():
    with pytest.raises(ValueError):
        aot.compile_for("gfx1100")
