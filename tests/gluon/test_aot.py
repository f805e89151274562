"""The Triton kernel built ahead of time for GPUs this machine lacks: fp8 MMA used, nothing spilled.

On AMD the fp8 flavour matters: gfx942's MFMA reads e4m3fnuz (Triton's fp8e4b8), gfx950's reads OCP
e4m3fn (fp8e4nv), and a dot of any other flavour is upcast to f16/f32 MFMA or FMA. So each (q, k)
dtype pair is checked as launched: the pointer types the launcher hands the kernel for that pair
must build to the fp8 MFMA with the right operand formats.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from aot_targets import skip_unless_buildable  # noqa: E402
from mqa_provider_gluon import aot  # noqa: E402

FN, FNUZ = "float8_e4m3fn", "float8_e4m3fnuz"
PAIRS = [(FNUZ, FNUZ), (FN, FNUZ), (FN, FN), (FNUZ, FN)]


@functools.cache
def build(target: str, h: int = 64, q_dtype: str | None = None, k_dtype: str | None = None):
    skip_unless_buildable(target)
    return aot.compile_for(target, h=h, q_dtype=q_dtype, k_dtype=k_dtype)


def _dot_operands(asm: dict[str, Any]) -> set[str]:
    """The element types of every tt.dot / tt.dot_scaled operand in the TTGIR."""
    operands = re.findall(r"tt\.dot(?:_scaled)? .*: tensor<\d+x\d+x(\w+),.*> \* tensor<\d+x\d+x(\w+),",
                          asm["ttgir"])
    return {t for pair in operands for t in pair}


def _no_spills(asm: dict[str, Any]) -> None:
    facts = aot.amd_facts(asm)
    assert facts.vgpr_spills == 0 and facts.sgpr_spills == 0 and facts.scratch_bytes == 0, facts


# gfx942's fp8 MFMA (CDNA3): fp8 here is the arch's own e4m3fnuz. Triton 3.6 and 3.9 both pick the
# 32x32x16 shape for this kernel's tiles; the 16x16x32 one is the same instruction family.
GFX942_FP8_MFMA = re.compile(r"v_mfma_f32_(32x32x16|16x16x32)_fp8_fp8$")


@pytest.mark.parametrize("h", [32, 64])
def test_gfx942_uses_fp8_mfma_on_fnuz_operands(h):
    asm = build("gfx942", h, FNUZ, FNUZ)
    ops = aot.mfma_ops(asm)
    assert ops and all(GFX942_FP8_MFMA.match(op) for op in ops), ops
    assert _dot_operands(asm) == {"f8E4M3FNUZ"}, _dot_operands(asm)  # both operands, unconverted
    _no_spills(asm)


def test_gfx942_fnuz_is_the_default_build():
    assert build("gfx942")["amdgcn"] == build("gfx942", 64, FNUZ, FNUZ)["amdgcn"]


@pytest.mark.parametrize("q_dtype, k_dtype, upcast", [(FN, FNUZ, "f32"), (FNUZ, FN, "f32"),
                                                      (FN, FN, "f16")])
def test_gfx942_other_flavours_lose_the_fp8_mfma(q_dtype, k_dtype, upcast):
    # Why the launcher converts before launch on gfx942: fed e4m3fn (fp8e4nv) pointers the kernel
    # still compiles, but Triton upcasts the dot (f16 MFMA, or FMA when the flavours differ).
    asm = build("gfx942", 64, q_dtype, k_dtype)
    assert not any(GFX942_FP8_MFMA.match(op) for op in aot.mfma_ops(asm)), aot.mfma_ops(asm)
    assert _dot_operands(asm) == {upcast}, _dot_operands(asm)


@pytest.mark.parametrize("h", [32, 64])
def test_gfx950_uses_f8f6f4_mfma_on_ocp_e4m3_operands(h):
    asm = build("gfx950", h, FN, FN)
    formats = aot.mfma_formats(asm)
    # f8f6f4 MFMAs take each operand's format from cbsz (A) and blgp (B): both fp8 e4m3 (OCP e4m3fn).
    assert formats and set(formats) == {("v_mfma_f32_32x32x64_f8f6f4", "fp8 e4m3", "fp8 e4m3")}, formats
    assert _dot_operands(asm) == {"f8E4M3FN"}, _dot_operands(asm)
    _no_spills(asm)


@pytest.mark.parametrize("q_dtype, k_dtype", [(FNUZ, FNUZ), (FN, FNUZ)])
def test_gfx950_fnuz_loses_the_fp8_mfma(q_dtype, k_dtype):
    # gfx950 has no fnuz MFMA: Triton upcasts fp8e4b8 to f16 there, so fnuz must be converted first.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("warnings.warn", lambda *a, **k: None)  # Triton's own note says the same
        asm = build("gfx950", 64, q_dtype, k_dtype)
    assert set(aot.mfma_ops(asm)) == {"v_mfma_f32_32x32x16_f16"}, aot.mfma_ops(asm)
    assert _dot_operands(asm) == {"f16"}, _dot_operands(asm)


def test_mfma_formats_reads_cbsz_and_blgp():
    asm = {"amdgcn": "  v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], a[0:15] cbsz:1 blgp:4\n"
                     "  v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], 0\n"
                     "  v_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], 0\n"}
    assert aot.mfma_formats(asm) == {("v_mfma_f32_32x32x64_f8f6f4", "bf8 e5m2", "fp4 e2m1"): 1,
                                     ("v_mfma_f32_32x32x64_f8f6f4", "fp8 e4m3", "fp8 e4m3"): 1,
                                     ("v_mfma_f32_32x32x16_fp8_fp8", "fp8", "fp8"): 1}


def _launched(arch: str, q_dtype: str, k_dtype: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the Triton launcher hands its kernel for a (q, k) pair on ``arch``, without running it.

    CPU tensors play ``arch``'s tensors (the launcher's device-to-arch lookup is substituted) and the
    jitted kernel is replaced by a recorder of its tensor arguments.
    """
    from mqa_provider_gluon.ops import mqa_logits_triton as launcher

    seen: dict[str, Any] = {}

    class Recorder:
        def __getitem__(self, grid: Any) -> Any:
            def launch(q, k, *args: Any, **kwargs: Any) -> None:
                seen.update(q=q.dtype, k=k.dtype, k_ptr=k.data_ptr(), q_ptr=q.data_ptr())
            return launch

    assert hasattr(launcher, "_device_facts") and hasattr(launcher, "kernel"), (
        "the Triton launcher's device-to-arch lookup or kernel accessor moved: update _launched()")
    # Plans are cached per device index, not per arch: start and end with none.
    launcher.clear_caches()
    monkeypatch.setattr(launcher, "_device_facts", lambda index: (arch, 1))
    monkeypatch.setattr(launcher, "kernel", lambda interpret=None: Recorder())
    g = torch.Generator().manual_seed(0)
    m, n, h, d = 4, 64, 32, 128
    q = (torch.randn(m, h, d, generator=g)).to(getattr(torch, q_dtype))
    k = (torch.randn(n, d, generator=g)).to(getattr(torch, k_dtype))
    k_scale, weights = torch.rand(n, generator=g) + 0.5, torch.randn(m, h, generator=g)
    ks, ke = torch.zeros(m, dtype=torch.int32), torch.full((m,), n, dtype=torch.int32)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True  # lets CPU tensors through; nothing is interpreted
        try:
            launcher.fp8_mqa_logits_triton(q, k, k_scale, weights, ks, ke)
        finally:
            launcher.clear_caches()
    assert seen, "the launcher returned without launching the kernel"
    seen.update(k_in=k.data_ptr(), q_in=q.data_ptr())
    return seen


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _triton_declares(arch: str, q_dtype: str, k_dtype: str) -> None:
    """Skip unless the ``triton`` provider's spec declares (q, k) on ``arch``: a pair it does not
    declare never reaches its launcher."""
    from mqa_provider_gluon import SPECS

    spec = next(s for s in SPECS if s.name == "triton")
    if (q_dtype, k_dtype) not in spec.pairs_for(arch):
        pytest.skip(f"the triton provider does not declare (q, k) = ({q_dtype}, {k_dtype}) on {arch}")


@pytest.mark.parametrize("q_dtype, k_dtype", PAIRS)
def test_gfx942_every_pair_launches_the_fp8_mfma_on_fnuz(q_dtype, k_dtype, monkeypatch):
    _triton_declares("gfx942", q_dtype, k_dtype)
    seen = _launched("gfx942", q_dtype, k_dtype, monkeypatch)
    assert (_name(seen["q"]), _name(seen["k"])) == (FNUZ, FNUZ), seen
    if k_dtype == FNUZ:  # k, the large operand, reaches the kernel as it came: never copied
        assert seen["k_ptr"] == seen["k_in"], "k was copied"
    if q_dtype == FNUZ:
        assert seen["q_ptr"] == seen["q_in"], "q was converted though the kernel takes it as it is"
    # (q e4m3fn converted to e4m3fnuz before launch, k e4m3fnuz) builds exactly the native kernel.
    assert build("gfx942", 32, _name(seen["q"]), _name(seen["k"]))["amdgcn"] == \
        build("gfx942", 32, FNUZ, FNUZ)["amdgcn"]


@pytest.mark.parametrize("q_dtype, k_dtype", PAIRS)
def test_gfx950_every_pair_launches_the_f8f6f4_mfma_on_e4m3(q_dtype, k_dtype, monkeypatch):
    _triton_declares("gfx950", q_dtype, k_dtype)
    seen = _launched("gfx950", q_dtype, k_dtype, monkeypatch)
    assert (_name(seen["q"]), _name(seen["k"])) == (FN, FN), seen
    if k_dtype == FN:
        assert seen["k_ptr"] == seen["k_in"], "k was copied"
    assert build("gfx950", 32, FN, FN)["amdgcn"] == build("gfx950", 32)["amdgcn"]


def test_paged_kernel_uses_fp8_mfma_on_fnuz_for_gfx942():
    # The paged (decode) kernel, owned by its own module: on gfx942 the cache bytes are relabelled
    # e4m3fnuz inside the kernel, and q is converted on the host, so the dot is fnuz x fnuz.
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import compile_for as paged_compile_for
    from triton.backends.compiler import GPUTarget

    skip_unless_buildable("gfx942")
    asm = paged_compile_for(GPUTarget("hip", "gfx942", 64), next_n=2, h=64, d=128)
    ops = aot.mfma_ops(asm)
    assert ops and all(GFX942_FP8_MFMA.match(op) for op in ops), ops
    assert _dot_operands(asm) == {"f8E4M3FNUZ"}, _dot_operands(asm)
    _no_spills(asm)


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
