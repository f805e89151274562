"""The Gluon sm_90 fp8 MQA-logits kernel: AOT compile checks on the CPU, correctness on an sm_90 GPU."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "providers", "gluon"))
from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as g  # noqa: E402
from mqa_provider_gluon.ops import persistent_schedule as sched  # noqa: E402

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


def _split_cost(M: int, N: int, bq: int, sms: int, item_cost: float, splits: int) -> tuple[float, int, int]:
    nt = -(-N // 64)
    tps = -(-nt // splits)
    s = -(-nt // tps)
    return -(-(-(-M // bq) * s) // sms) * (tps + item_cost), s, tps


def test_balanced_split_is_the_cheapest_valid_split() -> None:
    rng = random.Random(14)
    for _ in range(200):
        M, N = rng.randint(1, 3000), rng.randint(1, 40000)
        bq, sms, item_cost = rng.choice([2, 4, 8, 16]), rng.choice([1, 7, 132]), rng.choice([0, 1, 2.5])
        splits, tps = g.persistent_split_balanced(M, N, bq, 64, sms, item_cost)
        nt = -(-N // 64)
        assert (splits - 1) * tps < nt <= splits * tps, (M, N, splits, tps)
        brute = min(_split_cost(M, N, bq, sms, item_cost, s) for s in range(1, nt + 1))
        assert (_split_cost(M, N, bq, sms, item_cost, splits), splits) == (brute, brute[1]), (M, N, bq, sms)


def test_balanced_split_on_the_engine_shapes() -> None:
    # 256 x 64k at H=64: one round of 128 items (the "items" rule: 576 items of 114 tiles, 5 rounds)
    assert g.persistent_split_balanced(256, 65536, 4, 64, 132) == (2, 512)
    assert g.persistent_split(256, 65536, 4, 64, 4 * 132) == (9, 114)
    assert g.persistent_split_balanced(1024, 1024, 4, 64, 132) == (1, 16)  # 1k x 1k causal: whole rows
    assert g.persistent_split_balanced(512, 4096, 8, 64, 132) == (2, 32)
    assert g.persistent_split_balanced(1024, 8192, 4, 64, 132) == (1, 128)


def test_shape_rule_keeps_large_calls_on_the_measured_defaults() -> None:
    small = [(128, 2048, 64), (512, 4096, 32), (1024, 8192, 64), (1024, 1024, 64), (256, 65536, 64),
             (1024, 8192, 32), (1, 100, 64)]
    large = [(8192, 8192, 64), (10992, 10992, 32), (3840, 27648, 64), (4096, 32768, 64), (1024, 131072, 32),
             (4096, 16384, 64), (4096, 16384, 32)]
    for M, N, H in small:
        assert g.shape_config(M, N, H, 132) == g.SMALL_CONFIG, (M, N, H)
    for M, N, H in large:
        assert g.shape_config(M, N, H, 132) == g.LARGE_CONFIG, (M, N, H)
    assert g.shape_config(128, 2048, 64, 0) == g.LARGE_CONFIG  # no SM count (a CPU tensor): defaults
    # Large with a partial last round of long items (H200: 14% behind DeepGEMM at 1500 x 40000, H=32).
    for M, N, H in [(1500, 40000, 32), (1792, 57344, 32)]:
        assert g.items_imbalance(M, N, 256 // H, 132) > g.UNEVEN_ITEMS
        assert g.shape_config(M, N, H, 132) == g.LARGE_UNEVEN_CONFIG, (M, N, H)
    assert g.items_imbalance(1500, 40000, 8, 132) == pytest.approx(5 * 132 / 564)  # 564 items, 5 rounds
    for pairs in (g.SMALL_CONFIG, g.LARGE_CONFIG, g.LARGE_UNEVEN_CONFIG):  # valid configs for both H
        for H in (32, 64):
            g.resolve_config(H, dict(pairs))


def test_filler_config() -> None:
    def regs(config: dict, clean: bool = True) -> tuple[int, int, int, int]:
        _, kw = g.kernel_launch_args(g.resolve_config(32, config), 32, clean_logits=clean)
        return kw["FILL"], kw["DYN"], kw["MATH_REGS"], kw["FILL_REGS"]

    # the registers that compile without spills (test_aot_persistent_variants_do_not_spill)
    assert regs({}) == (0, 0, 248, 0)
    assert regs({"filler": True}) == (1, 0, 240, 24)  # 248 would leave the default partition 232
    assert regs({"filler": True, "dynamic": True}) == (1, 1, 232, 32)
    assert regs({"dynamic": True}) == (0, 1, 248, 0)
    assert regs({"filler": True}, clean=False) == (0, 0, 248, 0)  # nothing to fill: the 3-partition kernel
    assert regs({"filler": True, "p_math_regs": 224}) == (1, 0, 224, 24)
    with pytest.raises(ValueError, match="split"):
        g.resolve_config(64, {"split": "even"})
    with pytest.raises(ValueError, match="kernel"):
        g.resolve_config(64, {"kernel": "cuda"})
    for key in ("filler", "dynamic"):
        with pytest.raises(ValueError, match="persistent"):
            g.resolve_config(64, {key: True, "persistent": False})


def _random_windows(M: int, N: int, rng: random.Random) -> tuple[list[int], list[int]]:
    kind = rng.choice(["causal", "packed", "ragged", "sliding"])
    if kind == "causal":
        ks = [0] * M
        ke = [N - M + m + 1 for m in range(M)]
    elif kind == "sliding":
        w = rng.randint(1, N)
        ke = [N - M + m + 1 for m in range(M)]
        ks = [e - w for e in ke]
    elif kind == "packed":
        ks, ke, start = [], [], 0
        while len(ks) < M:
            q = min(M - len(ks), rng.randint(1, max(1, M // 3)))
            keys = rng.randint(q, max(q, N // 3))
            ks += [start] * q
            ke += [start + keys - q + p + 1 for p in range(q)]
            start += keys
    else:
        ks = [rng.randint(-20, N) for _ in range(M)]
        ke = [a + rng.randint(-30, N + 40) for a in ks]
    return ks, ke


def test_every_split_rule_covers_each_tile_once() -> None:
    """The kernel writes a cell only through its item's computed or filled tiles: with either split
    rule and either order (static snake, dynamic draws), every (query block, key tile) belongs to exactly
    one item, and every tile that meets a window of its block is computed."""
    rng = random.Random(9)
    for _ in range(120):
        M, N, bq, sms = rng.randint(1, 300), rng.randint(1, 3000), rng.choice([2, 4, 8]), rng.choice([1, 5, 132])
        ks, ke = _random_windows(M, N, rng)
        ranges = sched.block_ranges(ks, ke, M, N, bq)
        nt = -(-N // 64)
        for splits, tps in (g.persistent_split(M, N, bq, 64, 4 * sms), g.persistent_split_balanced(M, N, bq, 64, sms)):
            for walk in (sched.walk, sched.walk_dynamic):
                _check_cover(ranges, N, nt, splits, tps, walk(ranges, N, 64, splits, tps, sms))


def _check_cover(ranges, N: int, nt: int, splits: int, tps: int, programs) -> None:
    seen: dict[tuple[int, int], int] = {}
    for items in programs:
        for it in items:
            for t in range(it.c0, it.c1):
                seen[(it.mb, t)] = seen.get((it.mb, t), 0) + 1
            lo, hi = ranges[it.mb]
            needed = set(range(max(lo // 64, it.c0), min(-(-hi // 64), it.c1)))
            assert needed <= set(range(it.t0, it.t1)), (N, it)
    assert seen == {(mb, t): 1 for mb in range(len(ranges)) for t in range(nt)}, (N, splits, tps)


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
    (64, True, {"filler": True}),
    (32, True, {"filler": True}),
    (32, True, {"filler": True, "split": "balanced"}),
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


@pytest.mark.skipif(g._triton_version_reason() is not None, reason=str(g._triton_version_reason()))
@pytest.mark.parametrize("H", [32, 64])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("config", [{"filler": True}, {"dynamic": True}, {"filler": True, "dynamic": True},
                                    {"filler": True, "split": "balanced"}])
def test_aot_persistent_variants_do_not_spill(H: int, clean: bool, config: dict) -> None:
    """As Triton builds them on the GPU when N and the row stride are multiples of 16 (the engine
    shapes): no spills with the registers resolve_config/kernel_launch_args give; the dynamic kernel
    draws items with global atomics, the static one has none."""
    sass, res = _sass(g.compile_sm90(H=H, D=D, clean_logits=clean, config=config, divisible=("out_stride", "N")))
    assert not re.search(r"\b(LDL|STL)\b", sass), "register spills"
    assert "LOCAL:0" in res
    assert bool(re.search(r"ATOMG\.E\.ADD", sass)) == bool(config.get("dynamic"))
    assert len(re.findall(r"QGMMA\.64x(\d+)x32", sass)) == 16


@pytest.mark.skipif(g._triton_version_reason() is not None, reason=str(g._triton_version_reason()))
@pytest.mark.parametrize("H", [32, 64])
def test_aot_filler_stores_16_bytes_at_a_time(H: int) -> None:
    """With N and the row stride multiples of 16 (as Triton specialises them), the filler warp's -inf
    stores are 16-byte vectors; the math partitions keep their (fill-free) epilogue."""
    with_filler, _ = _sass(g.compile_sm90(H=H, D=D, config={"filler": True}, divisible=("out_stride", "N")))
    without, _ = _sass(g.compile_sm90(H=H, D=D, config={"filler": False}, divisible=("out_stride", "N")))
    assert re.search(r"STG\.E\.128", with_filler)
    assert not re.search(r"\b(LDL|STL)\b", with_filler)
    assert len(re.findall(r"QGMMA", with_filler)) == len(re.findall(r"QGMMA", without))


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
                                    {"persistent": True, "banks": 1, "items_per_sm": 64},
                                    {"filler": True, "split": "balanced"}, {"dynamic": True},
                                    {"dynamic": True, "filler": True, "items_per_sm": 16}])
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


@pytest.mark.cuda
def test_dynamic_counters_are_left_zero() -> None:
    """The dynamic kernel's last program re-arms the grid-wide counter: launch after launch on one
    stream (and on a second stream, which gets its own counters) gives the right result."""
    reason = g.gluon_supported()
    if reason:
        pytest.skip(reason)
    gen = torch.Generator(device="cuda").manual_seed(3)
    M, N, H = 300, 5000, 64
    q = torch.randn(M, H, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    k = torch.randn(N, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    k_scale = torch.rand(N, device="cuda", generator=gen) + 0.25
    w = torch.randn(M, H, device="cuda", generator=gen) * H**-0.5
    ks, ke = _windows(M, N, gen)
    ref = _reference(q, k, k_scale, w, ks, ke)
    fin = torch.isfinite(ref)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            for _ in range(3):
                out = g.fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, True, config={"dynamic": True, "filler": True})
        torch.cuda.synchronize()
        assert torch.equal(torch.isneginf(out), ~fin)
        assert _calc_diff(out[fin], ref[fin]) < 1e-3
    assert len(g._SCHED) >= 2 and all(int(t.abs().sum()) == 0 for t in g._SCHED.values())
