"""The portable Triton kernel against the float64 oracle: interpreter on small ragged cases, GPU at size."""

from __future__ import annotations

import pytest
import torch

from mqa_core.reference import fp8_mqa_logits_ref
from mqa_core.spec import Problem
from mqa_core.testing import calc_diff, make_inputs

triton = pytest.importorskip("triton")

from mqa_provider_gluon.fp8 import e4m3fn_to_e4m3fnuz  # noqa: E402
from mqa_provider_gluon.ops import mqa_logits_triton as op  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_triton import TritonConfig, fp8_mqa_logits_triton  # noqa: E402

SMALL = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2)
pytestmark = pytest.mark.usefixtures("fresh_plans")


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreter for this test only, and an output buffer poisoned with NaN so unwritten cells show."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real = op._new_output
    monkeypatch.setattr(op, "_new_output", lambda *a: real(*a).fill_(float("nan")))


def run(inp, clean: bool = True, config: TritonConfig | None = SMALL) -> torch.Tensor:
    return fp8_mqa_logits_triton(inp.q, inp.k, inp.k_scale, inp.weights, inp.ks, inp.ke, clean,
                                 config=config)


def check(out: torch.Tensor, ref: torch.Tensor, clean: bool) -> None:
    assert out.shape == ref.shape and out.dtype == torch.float32 and out.stride(1) == 1
    inside = torch.isfinite(ref)
    assert not out[inside].isnan().any(), "in-window cells left unwritten"
    assert calc_diff(out[inside], ref[inside]) < 1e-6
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside), "-inf mask differs from the windows"


CASES = [  # (M, N, H, D, window, k_scale 2-D)
    (13, 70, 16, 64, "ragged", False),
    (21, 45, 32, 128, "ragged", True),
    (1, 50, 16, 64, "ragged", False),
    (9, 64, 32, 64, "causal", False),
    (12, 37, 16, 128, "chunk", True),
    (7, 33, 20, 96, "ragged", False),  # H and D not powers of two: padded in the kernel
]


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("m,n,h,d,window,ks2d", CASES)
def test_interpreter_matches_reference(interpret, m, n, h, d, window, ks2d, clean):
    inp = make_inputs(Problem(m, n, h, d), window=window, k_scale_2d=ks2d, seed=m * 1000 + n)
    if window == "ragged":  # make sure the edge cases are in: empty row, ks < 0, ke > N
        inp.ks[0], inp.ke[0] = 5, 5
        inp.ks[-1], inp.ke[-1] = -7, n + 9
    check(run(inp, clean), inp.reference(), clean)


def test_every_row_empty(interpret):
    inp = make_inputs(Problem(6, 40, 16, 64), window="ragged", seed=3)
    inp.ke.copy_(inp.ks.clamp(max=10) - 1)
    out = run(inp)
    assert torch.isneginf(out).all()


def test_key_splits_cover_every_tile(interpret, monkeypatch: pytest.MonkeyPatch):
    """Few query blocks on a big device split the keys; each split fills its own -inf tiles."""
    monkeypatch.setattr(op, "_device_facts", lambda index: ("cpu", 16))
    inp = make_inputs(Problem(3, 150, 16, 64), window="ragged", seed=11)
    inp.ks[1], inp.ke[1] = 70, 80  # a window inside one split: the other splits only fill -inf
    for clean in (True, False):
        check(run(inp, clean), inp.reference(), clean)


def test_tma_key_loads(interpret):
    """The TMA path (NVIDIA): key rows past N and dims past D must arrive as zeros."""
    inp = make_inputs(Problem(7, 45, 16, 96), window="ragged", seed=13)
    cfg = TritonConfig(block_m=2, block_n=32, num_warps=4, num_stages=2, tma=True)
    assert op._k_descriptor(inp.k, cfg, "cpu") is not None
    for clean in (True, False):
        check(run(inp, clean, cfg), inp.reference(), clean)


def test_default_config(interpret):
    inp = make_inputs(Problem(5, 70, 32, 128), window="causal", seed=5)
    check(run(inp, config=None), inp.reference(), True)


def test_fnuz_inputs_give_the_same_logits(interpret):
    """e4m3fnuz q/k with doubled weights and k_scale (what gfx942 runs) reproduce the e4m3fn result."""
    inp = make_inputs(Problem(11, 50, 16, 64), window="ragged", seed=7)
    q, w = e4m3fn_to_e4m3fnuz(inp.q, inp.weights)
    k, sc = e4m3fn_to_e4m3fnuz(inp.k, inp.k_scale)
    fnuz = fp8_mqa_logits_triton(q, k, sc, w, inp.ks, inp.ke, True, config=SMALL)
    assert torch.equal(fnuz, run(inp))  # powers of two commute with every rounding here
    check(fnuz, inp.reference(), True)


def test_fnuz_conversion_when_the_arch_wants_it(interpret, monkeypatch: pytest.MonkeyPatch):
    """On gfx942 the launcher converts e4m3fn inputs itself."""
    monkeypatch.setattr(op, "_device_facts", lambda index: ("gfx942", 1))
    seen = []
    real = op.e4m3fn_to_e4m3fnuz
    monkeypatch.setattr(op, "e4m3fn_to_e4m3fnuz", lambda x, s: seen.append(x.shape) or real(x, s))
    inp = make_inputs(Problem(4, 40, 16, 64), window="ragged", seed=9)
    check(run(inp), inp.reference(), True)
    assert len(seen) == 2


def test_fnuz_conversion_is_exact_on_every_byte():
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    y, scale = e4m3fn_to_e4m3fnuz(x, torch.tensor(0.75))
    assert y.dtype == torch.float8_e4m3fnuz and float(scale) == 1.5
    want, got = x.double(), y.double() * 2
    same = (want == got) | (want.isnan() & got.isnan())
    assert same.all(), [hex(b) for b in torch.nonzero(~same).flatten().tolist()]
    bits = y.view(torch.uint8)
    assert bits[0x80] == 0x00  # -0 -> +0: 0x80 is fnuz's NaN
    assert bits[0x7F] == 0x80 and bits[0xFF] == 0x80  # NaN -> fnuz NaN, not +-240


def test_interpreter_leaves_triton_as_it_found_it(interpret):
    """Interpreted launches patch triton.language; left behind, no kernel would compile afterwards."""
    import triton.language as tl

    spaces = (tl, tl.core, tl.math, tl.tensor, tl.dtype, tl.core.tensor_descriptor_base)
    before = [dict(vars(ns)) for ns in spaces]
    inp = make_inputs(Problem(3, 20, 16, 64), seed=2)
    run(inp)
    after = [dict(vars(ns)) for ns in spaces]
    for ns, b, a in zip(spaces, before, after):
        changed = {k for k in a.keys() | b.keys() if a.get(k) is not b.get(k)}
        assert not changed, f"{ns.__name__}: {sorted(changed)}"


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    inp = make_inputs(Problem(2, 16, 16, 64), seed=1)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        run(inp)


def test_jit_mode_is_chosen_at_call_time(monkeypatch: pytest.MonkeyPatch):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    assert isinstance(op.kernel(interpret=False), JITFunction)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert isinstance(op.kernel(), InterpretedFunction)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert isinstance(op.kernel(), JITFunction)


def test_config_validation():
    with pytest.raises(ValueError, match="power of two"):
        TritonConfig(block_m=3)
    with pytest.raises(ValueError, match="block_n"):
        TritonConfig(block_n=8)


# ---- real sizes on an NVIDIA GPU ---------------------------------------------------------------

def _gpu_check(m: int, n: int, h: int, d: int, ke_offset: int, clean: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(m + n)
    q = (torch.randn(m, h, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k = (torch.randn(n, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, device="cuda", generator=g) * 0.9 + 0.1
    w = torch.randn(m, h, device="cuda", generator=g) * h**-0.5
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = (torch.arange(m, device="cuda") + ke_offset + 1).to(torch.int32)
    out = fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, clean)
    torch.cuda.synchronize()
    cols = torch.arange(n, device="cuda")[None, :]
    inside = cols < ke.clamp(max=n)[:, None]
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside)
    rows = torch.linspace(0, m - 1, 96, device="cuda").long()  # a sample of rows, float64 oracle
    ref = fp8_mqa_logits_ref(q[rows], k, k_scale, w[rows], ks[rows], ke[rows])
    got = out[rows]
    keep = torch.isfinite(ref)
    assert calc_diff(got[keep], ref[keep]) < 1e-3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("clean", [True, False])
def test_gpu_causal_suffix(clean):
    _gpu_check(4096, 16384, 64, 128, ke_offset=16384 - 4096, clean=clean)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_causal_square():
    _gpu_check(8192, 8192, 64, 128, ke_offset=0, clean=True)
