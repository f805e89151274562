"""FP4 (packed e2m1 with UE8M0 scales of 32, DeepGEMM's fp8_fp4 format) in the capability model: the
format's arithmetic against an oracle that decodes the bits by formula, the pair in specs, routing
where it is declared (torch_ref on the CPU; deepgemm on sm_100, tests/deepgemm), and one clear error
naming FP4 and the arch everywhere else."""

from __future__ import annotations

import pytest
import torch

import mqa_core
from mqa_core import fp4
from mqa_core.compat import deep_gemm
from mqa_core.reference import fp4_mqa_logits_ref, fp4_paged_mqa_logits_ref, fp4_values, pad_paged_cache
from mqa_core.spec import FP4, FP4_PAIR, ProviderSpec, dtype_pair, parse_dtypes


def draw(*shape: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return fp4.quantize(torch.randn(*shape, generator=g) * scale)


def prefill(m: int, n: int, h: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 99)
    q, k = draw(m, h, d, seed=seed), draw(n, d, seed=seed + 1, scale=4.0)
    w = torch.randn(m, h, generator=g)
    ks = torch.randint(-3, n // 2, (m,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(0, n, (m,), generator=g, dtype=torch.int32)
    return q, k, w, ks, ke


# -- the format --------------------------------------------------------------------------------------

def test_every_e2m1_code_decodes_as_the_formula():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.int8)[:, None]  # two nibbles per byte
    sf = torch.full((256,), 127, dtype=torch.int32)  # scale 2**0 for group 0
    table = fp4.unpack(codes).double()  # unscaled; the oracle applies 2**(127 - 127)
    assert torch.equal(table, fp4_values(codes, sf))
    mags = sorted({abs(v) for v in table.flatten().tolist()})
    assert mags == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert table[0x9A].tolist() == [-1.0, -0.5]  # low nibble first: 0xA = -1.0, then 0x9 = -0.5


def test_ue8m0_scales_are_exact_powers_of_two_little_endian():
    words = torch.tensor([0x80_7F_7E_00 - 2**32, -1], dtype=torch.int32)  # bytes 00 7E 7F 80 / FF FF FF FF
    s = fp4.scales(words, 4)
    assert s[0].tolist() == [2.0 ** -127, 0.5, 1.0, 2.0]
    assert torch.equal(fp4.scales(words[:1], 2), s[:1, :2])
    with pytest.raises(ValueError, match="1 to 4 UE8M0 scales"):
        fp4.scales(words, 5)


@pytest.mark.parametrize("d", [32, 64, 128])
def test_quantize_roundtrip_is_within_half_a_step(d):
    x = torch.randn(40, d) * torch.logspace(-3, 3, 40)[:, None]
    packed, sf = fp4.quantize(x)
    assert packed.dtype == torch.int8 and packed.shape == (40, d // 2) and sf.shape == (40,)
    y = fp4.dequantize(packed, sf)
    assert torch.equal(y.double(), fp4_values(packed, sf))
    # each value lands on a grid point; the error is at most half the largest gap (2 x scale) of its group
    scale = fp4.scales(sf, d // 32).repeat_interleave(32, dim=1)
    assert bool(((y - x).abs() <= scale + 1e-30).all())
    assert bool((y.abs() <= 6 * scale).all())


def test_dequantized_products_are_exact_in_float32():
    (q, qs), (k, ks) = draw(3, 128, seed=1), draw(5, 128, seed=2, scale=1e3)
    a, b = fp4.dequantize(q, qs), fp4.dequantize(k, ks)
    prods = a[:, None, :] * b[None, :, :]
    assert torch.equal(prods.double(), a.double()[:, None, :] * b.double()[None, :, :])


# -- the capability model -----------------------------------------------------------------------------

def test_the_pair_is_a_declaration_like_any_other():
    assert dtype_pair(FP4) == dtype_pair(FP4_PAIR) == FP4_PAIR
    assert parse_dtypes("fp4") == (FP4,) and parse_dtypes("e2m1,fp4") == (FP4, FP4)
    with pytest.raises(ValueError, match="mixes FP4 with fp8"):
        parse_dtypes("fp4,fn")
    with pytest.raises(ValueError):
        dtype_pair((FP4, "float8_e4m3fn"))
    spec = ProviderSpec(name="mine", ops={"fp8_mqa_logits"}, archs={"sm_100", "sm_90"}, priority=1,
                        load="mine.k:K", dtype_pairs={"sm_90": [("float8_e4m3fn",) * 2],
                                                      "sm_100": [("float8_e4m3fn",) * 2, FP4_PAIR]})
    assert FP4_PAIR in spec.pairs_for("sm_100") and FP4_PAIR not in spec.pairs_for("sm_90")
    assert spec.dtypes == {"float8_e4m3fn"}
    with pytest.raises(ValueError, match="is not a"):
        ProviderSpec(name="mine", ops={"fp8_mqa_logits"}, archs={"any"}, priority=1, load="mine.k:K",
                     dtype_pairs=[(FP4, "float8_e4m3fn")])


def test_torch_ref_declares_fp4_on_the_cpu_only():
    spec = mqa_core.get_provider("cpu").spec
    assert FP4_PAIR in spec.pairs_for("cpu")
    assert all(FP4_PAIR not in spec.pairs_for(a) for a in ("sm_90", "sm_100", "gfx942", "gfx950"))


@pytest.mark.parametrize("arch", ["sm_90", "gfx950", "gfx942"])
def test_explain_rejects_everyone_for_fp4_where_no_one_declares_it(arch):
    d = mqa_core.explain(arch, dtype=FP4)
    assert d.chosen is None
    for c in d.candidates:
        assert not c.accepted
    assert any(c.code == "dtype" and FP4 in c.reason for c in d.candidates)


def test_an_fp4_call_without_a_provider_gets_one_error_naming_fp4_and_the_arch(monkeypatch):
    """On the CPU torch_ref serves FP4; with it blocked the call names FP4, the arch and who serves it."""
    q, k, w, ks, ke = prefill(4, 16, 8, 64)
    monkeypatch.setenv("MQA_DISABLE_PROVIDERS", "torch_ref")
    mqa_core.reload()
    with pytest.raises(mqa_core.ProviderUnavailableError) as err:
        mqa_core.fp8_mqa_logits(q, k, w, ks, ke)
    first = str(err.value).splitlines()[0]
    assert first.startswith("fp8_mqa_logits: FP4 inputs (float4_e2m1fn_x2: packed e2m1 with UE8M0 scales, "
                            "group 32) are served on cpu by no installed provider"), first
    assert "deepgemm provider on sm_100" in first
    assert "[dtype]" in str(err.value)  # then the whole trace


def test_a_bound_provider_that_does_not_serve_fp4_says_so():
    q, k, w, ks, ke = prefill(4, 16, 8, 64)
    p = mqa_core.get_provider("cpu", dtype="float8_e4m3fn")
    from mqa_core.provider import Provider
    from mqa_core.spec import DTYPE_PAIRS

    fp8_only = Provider(ProviderSpec(name="fp8only", ops={"fp8_mqa_logits"}, archs={"cpu"}, priority=0,
                                     load="x.y:z", dtype_pairs=DTYPE_PAIRS), p.impl)
    with pytest.raises(TypeError, match="FP4 inputs .* on cpu, but provider fp8only does not serve FP4 there"):
        fp8_only.fp8_mqa_logits(q, k, w, ks, ke)


# -- the arithmetic, served by torch_ref on the CPU ---------------------------------------------------

@pytest.mark.parametrize("h,d", [(8, 64), (16, 128), (3, 32)])
@pytest.mark.parametrize("clean", [True, False])
def test_prefill_against_the_oracle(h, d, clean):
    q, k, w, ks, ke = prefill(23, 77, h, d, seed=h + d)
    out = mqa_core.fp8_mqa_logits(q, k, w, ks, ke, clean_logits=clean)
    ref = fp4_mqa_logits_ref(*q, *k, w, ks, ke)
    inside = torch.isfinite(ref)
    assert out.shape == (23, 77) and out.dtype == torch.float32
    # exact products; float32 sums over D terms then H: relative to the magnitudes that enter
    mags = fp4_mqa_logits_ref(q[0], q[1], k[0], k[1], w.abs(), ks, ke)  # not a bound: a scale for the check
    err = (out.double() - ref)[inside].abs()
    assert bool((err <= 1e-5 * (mags[inside].abs() + ref[inside].abs() + 1)).all())
    if clean:
        assert torch.equal(torch.isneginf(out), ~inside)
    b16 = mqa_core.fp8_mqa_logits(q, k, w, ks, ke, clean_logits=clean, logits_dtype=torch.bfloat16)
    assert torch.equal(b16[inside], out[inside].to(torch.bfloat16))


def test_prefill_layout_checks_name_fp4_arguments():
    q, k, w, ks, ke = prefill(4, 16, 8, 64)
    with pytest.raises(TypeError, match=r"q_sf \(FP4 scales, q\[1\]\) must be int32"):
        mqa_core.fp8_mqa_logits((q[0], q[1].float()), k, w, ks, ke)
    with pytest.raises(ValueError, match=r"k \(FP4 values, kv\[0\]\) must have shape \[N, D / 2\]"):
        mqa_core.fp8_mqa_logits(q, (k[0][:, :16], k[1]), w, ks, ke)
    with pytest.raises(ValueError, match="D = 2 \\* 80 a positive multiple of 32, at most 128"):
        mqa_core.fp8_mqa_logits((torch.zeros(4, 8, 80, dtype=torch.int8), q[1]), k, w, ks, ke)
    with pytest.raises(TypeError, match=r"q \(FP4 values, q\[0\]\) must be int8 or uint8"):
        mqa_core.fp8_mqa_logits((q[0].view(torch.float8_e4m3fn), q[1]), k, w, ks, ke)


def fp4_paged(batch: int, next_n: int, h: int, d: int, ctx: int, block_size: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    blocks = batch * -(-ctx // block_size) + 3
    values, words = draw(blocks, block_size, d, seed=seed + 1, scale=3.0)
    cache = fp4.paged_cache(values, words)
    table = torch.randperm(blocks, generator=g)[: batch * -(-ctx // block_size)].view(batch, -1).to(torch.int32)
    q = draw(batch, next_n, h, d, seed=seed + 2)
    w = torch.randn(batch * next_n, h, generator=g)
    lens = torch.randint(next_n, ctx + 1, (batch,), generator=g, dtype=torch.int32)
    return q, cache, w, lens, table


@pytest.mark.parametrize("next_n,lens_2d", [(1, False), (2, True), (4, False)])
def test_paged_against_the_oracle(next_n, lens_2d):
    q, cache, w, lens, table = fp4_paged(3, next_n, 8, 128, 150, seed=next_n)
    if lens_2d:
        lens = torch.stack([lens - 5, lens], dim=1).clamp(min=0).to(torch.int32)
    pool = pad_paged_cache(cache, 64)  # strided page pools too
    out = mqa_core.fp8_paged_mqa_logits(q, pool, w, lens, table, 150)
    ref = fp4_paged_mqa_logits_ref(*q, cache, w, lens, table, 150)
    inside = torch.isfinite(ref)
    assert out.shape == (3 * next_n, 150) and torch.equal(torch.isneginf(out), ~inside)
    err = (out.double() - ref)[inside].abs()
    assert bool((err <= 1e-5 * (ref[inside].abs() + 1)).all())


def test_paged_cache_layout_is_checked_for_fp4():
    q, cache, w, lens, table = fp4_paged(2, 1, 8, 64, 80)
    with pytest.raises(ValueError, match=r"kv_cache must have shape \[num_blocks, block_size, 1, D / 2 \+ 4\]"):
        mqa_core.fp8_paged_mqa_logits(q, torch.zeros(4, 64, 1, 68, dtype=torch.uint8), w, lens, table, 80)
    assert mqa_core.fp8_paged_mqa_logits(q, cache, w, lens, table, 80).shape == (2, 80)


def test_compat_takes_q_sf_as_deep_gemm_does():
    """DeepGEMM's current names with (q, q_sf): routed as the core routes FP4 (torch_ref on the CPU)."""
    q, k, w, ks, ke = prefill(12, 40, 8, 128, seed=5)
    out = deep_gemm.fp8_fp4_mqa_logits(q, k, w, ks, ke, clean_logits=True)
    assert torch.equal(out, mqa_core.fp8_mqa_logits(q, k, w, ks, ke))
    width = 20
    comp = deep_gemm.fp8_fp4_mqa_logits(q, k, w, ks, ke, False, width)
    ref = fp4_mqa_logits_ref(*q, *k, w, ks, ke)
    for i in range(12):
        for j in range(width):
            p = int(ks[i].clamp(min=0)) + j if int(ks[i]) >= 0 else int(ks[i]) + j
            if 0 <= p < min(int(ke[i]), 40):
                assert abs(float(comp[i, j]) - float(ref[i, p])) <= 1e-4 * (1 + abs(float(ref[i, p])))
    qq, cache, wp, lens, table = fp4_paged(3, 2, 8, 64, 100, seed=6)
    lens2 = torch.stack([lens - 1, lens], dim=1).to(torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens2, 64, 8)
    got = deep_gemm.fp8_fp4_paged_mqa_logits(qq, cache, wp, lens2, table, meta, 100, True)
    assert torch.equal(got, mqa_core.fp8_paged_mqa_logits(qq, cache, wp, lens2, table, 100))
