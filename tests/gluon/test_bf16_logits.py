"""bf16 logits (``logits_dtype=torch.bfloat16``) from the Triton and Gluon kernels: the float32 logits
rounded once to nearest even (the interpreter here, the H200 under ``-m cuda``), -inf exact, rows
64-byte (Triton) / 16-byte (Gluon prefill) aligned; sm_90 builds of all four kernels without spills."""

from __future__ import annotations

import re

import pytest
import torch

from mqa_core.spec import Problem
from mqa_core.testing import make_inputs, make_paged_inputs

triton = pytest.importorskip("triton")

from mqa_provider_gluon import aot  # noqa: E402
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402
from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as gp  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_triton import fp8_mqa_logits_triton  # noqa: E402
from mqa_provider_gluon.ops.paged_mqa_logits_triton import compile_for as paged_compile_for  # noqa: E402
from mqa_provider_gluon.ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton  # noqa: E402

needs_gluon_api = pytest.mark.skipif(g._triton_version_reason() is not None,
                                     reason=f"Gluon kernels are written for triton 3.6: {g._triton_version_reason()}")
BF16 = torch.bfloat16


def rne(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16, round to nearest even, written out in the bits (independent of torch's cast)."""
    bits = x.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(torch.int32).view(torch.float32).to(BF16)  # int64 -> int32 keeps the low 32 bits


def same_cells(f32: torch.Tensor, b16: torch.Tensor, clean: bool, x) -> None:
    """``b16`` holds ``f32`` rounded once to nearest even in every cell the op defines (every cell when
    clean; else those inside the windows), -inf exactly where ``f32`` has -inf."""
    assert b16.dtype == BF16 and b16.shape == f32.shape and b16.stride(-1) == 1
    f32, b16 = f32.cpu(), b16.cpu()
    cells = torch.ones_like(f32, dtype=torch.bool) if clean else torch.isfinite(x.reference()).cpu()
    assert torch.equal(rne(f32)[cells], b16[cells])
    assert torch.equal(torch.isneginf(b16) & cells, torch.isneginf(f32) & cells)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the other interpreter tests (a set knob would stick)


def test_rne_helper_rounds_ties_to_even() -> None:
    x = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8 + 2.0 ** -20), float("-inf"), 3.4e38])
    assert rne(x).tolist() == [1.0, 1.0 + 2.0 ** -6, -(1.0 + 2.0 ** -7), float("-inf"), float("inf")]
    assert torch.equal(rne(x[:4]), x[:4].to(BF16))


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("h,d", [(16, 64), (64, 128)])
def test_triton_prefill_bf16_is_float32_rounded_once(interpret, clean: bool, h: int, d: int) -> None:
    x = make_inputs(Problem(19, 150, h, d), window="ragged", seed=h + d)
    args = (x.q, x.k, x.k_scale, x.weights, x.ks, x.ke, clean)
    f32 = fp8_mqa_logits_triton(*args)
    b16 = fp8_mqa_logits_triton(*args, logits_dtype=BF16)
    same_cells(f32, b16, clean, x)
    assert b16.stride(0) % 32 == 0 and f32.stride(0) % 16 == 0  # 64-byte rows both


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("clean,lens_2d", [(True, False), (True, True), (False, True)])
def test_triton_paged_bf16_is_float32_rounded_once(interpret, next_n: int, clean: bool, lens_2d: bool) -> None:
    x = make_paged_inputs(3, next_n, 32, 128, 200, block_size=64, seed=10 + next_n, lens_2d=lens_2d)
    f32 = fp8_paged_mqa_logits_triton(*x.args(), clean)
    b16 = fp8_paged_mqa_logits_triton(*x.args(), clean, logits_dtype=BF16)
    same_cells(f32, b16, clean, x)
    assert b16.stride(0) % 32 == 0


def _sass_ok(asm: dict) -> tuple[int, int]:
    facts = aot.sass_facts(asm)
    assert facts.qgmma > 0 and facts.hgmma == 0, facts
    assert facts.spill_stores == 0 and facts.spill_loads == 0, facts
    return facts.registers, facts.qgmma


@pytest.mark.parametrize("h", [32, 64])
def test_sm90_triton_prefill_bf16_build(h: int) -> None:
    _, mma = _sass_ok(aot.compile_for("sm_90", h=h, out_dtype="bf16"))
    assert mma == _sass_ok(aot.compile_for("sm_90", h=h))[1]


@pytest.mark.parametrize("next_n,h", [(1, 64), (2, 64), (3, 32), (4, 32)])
def test_sm90_triton_paged_bf16_build(next_n: int, h: int) -> None:
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    asm = paged_compile_for(target, next_n=next_n, h=h, out_dtype="bf16")
    _sass_ok(asm)


@needs_gluon_api
@pytest.mark.parametrize("H,config", [(64, {}), (32, {"filler": True}), (64, {"persistent": False}),
                                      (32, {"filler": True, "dynamic": True})])
def test_sm90_gluon_prefill_bf16_build(H: int, config: dict) -> None:
    k = g.compile_sm90(H=H, D=128, config=config, out_dtype="bf16", divisible=("out_stride", "N"))
    sass = aot.sass({**k.asm, "metadata": k.metadata})
    assert not re.search(r"\b(LDL|STL)\b", sass), "register spills"
    assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", sass)
    assert re.search(r"F2F\.BF16\.F32|F2FP\.BF16\.F32", sass), "expected a float32 -> bf16 conversion"


@needs_gluon_api
@pytest.mark.parametrize("next_n,h,clean", [(1, 64, True), (2, 64, False), (2, 32, True), (4, 32, True)])
def test_sm90_gluon_paged_bf16_build(next_n: int, h: int, clean: bool) -> None:
    """With the config each class is built with (next_n * H = 128 at next_n = 4: two math warpgroups,
    as at four the loader spills in the float32 build too)."""
    cfg = gp.GluonPagedConfig(math_wgs=2, stages=8) if next_n == 4 else None
    k = gp.compile_sm90(next_n=next_n, h=h, clean_logits=clean, out_dtype="bf16", config=cfg)
    facts = aot.sass_facts({**k.asm, "metadata": k.metadata})
    assert facts.qgmma > 0 and facts.spill_stores == 0 and facts.spill_loads == 0, facts


# -- on an sm_90 GPU --------------------------------------------------------------------------------

def _cuda() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("H,clean", [(64, True), (32, False)])
def test_cuda_gluon_prefill_bf16(H: int, clean: bool) -> None:
    _cuda()
    if g.gluon_supported(torch.device("cuda")):
        pytest.skip(str(g.gluon_supported(torch.device("cuda"))))
    x = make_inputs(Problem(300, 2000, H, 128), window="causal", seed=H, device=torch.device("cuda"))
    args = (x.q, x.k, x.k_scale, x.weights, x.ks, x.ke, clean)
    f32 = g.fp8_mqa_logits_gluon(*args)
    for _ in range(2):  # the first call binds, the second takes the bound launch
        b16 = g.fp8_mqa_logits_gluon(*args, logits_dtype=BF16)
        same_cells(f32, b16, clean, x)
        assert b16.stride(0) % 8 == 0


@pytest.mark.cuda
@pytest.mark.parametrize("next_n,h", [(2, 64), (4, 32), (3, 64)])
def test_cuda_paged_bf16(next_n: int, h: int) -> None:
    """The gluon provider's paged dispatcher (Gluon kernel where it serves, Triton elsewhere) and the
    Triton kernel, bf16 against float32 on the same call."""
    _cuda()
    x = make_paged_inputs(24, next_n, h, 128, 3000, block_size=64, seed=next_n * h, lens_2d=True,
                          device=torch.device("cuda"))
    for fn in (gp.fp8_paged_mqa_logits_sm90, fp8_paged_mqa_logits_triton):
        f32 = fn(*x.args(), True)
        for _ in range(2):
            b16 = fn(*x.args(), True, logits_dtype=BF16)
            same_cells(f32, b16, True, x)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_amd_bf16_builds_keep_the_fp8_mfma(target: str) -> None:
    """The Triton prefill and paged kernels with bf16 output on gfx942/gfx950: fp8 MFMA kept, no spills."""
    from triton.backends.compiler import GPUTarget

    for asm in (aot.compile_for(target, h=64, out_dtype="bf16"),
                paged_compile_for(GPUTarget("hip", target, 64), next_n=4, h=32, out_dtype="bf16")):
        facts = aot.amd_facts(asm)
        assert sum(aot.mfma_ops(asm).values()) > 0 and facts.vgpr_spills == 0 and facts.scratch_bytes == 0, facts
