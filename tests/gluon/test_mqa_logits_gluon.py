"""The Gluon sm_90 fp8 MQA-logits kernel: AOT compile checks on the CPU, correctness on an sm_90 GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "providers", "gluon"))
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402

D = 128


def test_import_never_fails_and_gate_gives_a_reason() -> None:
    reason = g.gluon_supported()
    if not torch.cuda.is_available():
        assert isinstance(reason, str) and reason
    assert g.gluon_supported(torch.device("cpu")) is not None


def test_config_validation() -> None:
    assert g.resolve_config(64)["BQ"] == 4
    assert g.resolve_config(32)["BQ"] == 8
    with pytest.raises(ValueError):
        g.resolve_config(64, {"BQ": 8})  # BQ*H = 512 > wgmma N
    with pytest.raises(ValueError):
        g.resolve_config(64, {"nope": 1})
    with pytest.raises(ValueError):
        g.resolve_config(64, {"persistent": True, "STAGES": 5})  # odd ring: unsafe parity waits
    assert g.persistent_split(8192, 8192, 4, 64, 528) == (1, 128)
    splits, tps = g.persistent_split(4096, 16384, 8, 64, 528)
    assert splits * tps >= 256 and (splits - 1) * tps < 256 and 512 * splits >= 528


# ----------------------------------------------------------------------------------- CPU: AOT for sm_90
def _sass(kernel) -> tuple[str, str]:
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", path], capture_output=True,
                             text=True, check=True).stdout
    return sass, res


@pytest.mark.skipif(g._triton_version_reason() is not None, reason=str(g._triton_version_reason()))
@pytest.mark.parametrize("H, clean, config", [
    (64, True, {}),
    (32, False, {}),
    (64, True, {"persistent": False, "relu_abs": True}),
    (32, True, {"persistent": False, "ws": False}),
    (64, True, {"persistent": False}),
    (64, True, {"persistent": True}),
    (32, True, {"persistent": True}),
    (32, False, {"persistent": True, "banks": 1}),
])
def test_aot_sm90_uses_fp8_wgmma_without_spills(H: int, clean: bool, config: dict) -> None:
    kernel = g.compile_sm90(H=H, D=D, clean_logits=clean, config=config)
    sass, res = _sass(kernel)
    qgmma = re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3", sass)
    cfg = g.resolve_config(H, config)
    n_mma = cfg["BQ"] * H // (cfg["banks"] if cfg["persistent"] else 1)
    assert qgmma and all(int(n) == n_mma for n in qgmma), "expected fp8 wgmma m64 n=BQ*H/banks k32"
    assert not re.search(r"\b(LDL|STL)\b", sass), "register spills"
    assert "LOCAL:0" in res
    if config.get("ws", True):
        assert "SETMAXREG" in sass, "expected warp-specialised register reallocation"


# ----------------------------------------------------------------------------------- GPU: correctness
def _reference(q, k, k_scale, weights, ks, ke) -> torch.Tensor:
    M, H, _ = q.shape
    N = k.shape[0]
    s = torch.einsum("mhd,nd->mhn", q.float(), k.float())
    out = (s.relu() * weights[:, :, None]).sum(1) * k_scale.reshape(1, N)
    n = torch.arange(N, device=q.device)
    inwin = (n[None, :] >= ks[:, None].long()) & (n[None, :] < ke[:, None].long())
    return out.masked_fill(~inwin, float("-inf"))


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum().clamp_min(1e-300))


def _windows(M: int, N: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ks = torch.randint(-20, N, (M, ), device="cuda", generator=gen)
    ke = ks + torch.randint(-30, N + 40, (M, ), device="cuda", generator=gen)
    ks[::5] = ke[::5] + 1  # empty rows
    ke[1::7] = N + 13  # past the end
    return ks.to(torch.int32), ke.to(torch.int32)


@pytest.mark.cuda
@pytest.mark.parametrize("M, N, H", [(1, 77, 64), (37, 77, 32), (130, 300, 64), (64, 1100, 32)])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("config", [{}, {"persistent": False, "ws": False},
                                    {"persistent": False, "relu_abs": True, "CHUNK": 2}, {"persistent": False},
                                    {"persistent": True, "banks": 1, "items_per_sm": 64}])
def test_matches_reference(M: int, N: int, H: int, clean: bool, config: dict) -> None:
    reason = g.gluon_supported()
    if reason:
        pytest.skip(reason)
    gen = torch.Generator(device="cuda").manual_seed(M * 1000 + N + H)
    q = torch.randn(M, H, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    k = torch.randn(N, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    k_scale = (torch.rand(N, 1, device="cuda", generator=gen) + 0.25)
    w = torch.randn(M, H, device="cuda", generator=gen) * H**-0.5
    ks, ke = _windows(M, N, gen)
    n_pad = (N + 3) // 4 * 4
    torch.empty(M * n_pad, device="cuda").fill_(float("nan"))  # poison the block the kernel will reuse
    out = g.fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, clean, config=config)
    assert out.shape == (M, N) and out.stride(1) == 1 and (out.stride(0) * 4) % 16 == 0
    ref = _reference(q, k, k_scale, w, ks, ke)
    fin = torch.isfinite(ref)
    if clean:
        assert not torch.isnan(out).any(), "unwritten cells"
        assert torch.equal(torch.isneginf(out), ~fin)
    assert torch.isfinite(out[fin]).all()
    if fin.any():
        assert _calc_diff(out[fin], ref[fin]) < 1e-3
