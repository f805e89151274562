"""next_n 3 and 4 (MTP decode, DeepGEMM#314) in the paged kernels: the Triton kernel on the CPU
interpreter against the float64 oracle and in sm_90 builds; the Gluon sm_90 kernel (next_n padded to a
power of two inside, rows past next_n never stored) in sm_90 builds here and on the GPU under -m cuda."""

from __future__ import annotations

import pytest
import torch

from mqa_core.reference import fp8_paged_mqa_logits_ref, pad_paged_cache
from mqa_core.testing import calc_diff, make_paged_inputs

triton = pytest.importorskip("triton")

from mqa_provider_gluon import aot  # noqa: E402
from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as gp  # noqa: E402
from mqa_provider_gluon.ops.mqa_logits_gluon_sm90 import _triton_version_reason  # noqa: E402
from mqa_provider_gluon.ops.paged_mqa_logits_triton import compile_for, fp8_paged_mqa_logits_triton  # noqa: E402

needs_gluon_api = pytest.mark.skipif(_triton_version_reason() is not None,
                                     reason=f"Gluon kernels are written for triton 3.6: {_triton_version_reason()}")


def any_lens(batch: int, next_n: int, ctx: int, seed: int) -> torch.Tensor:
    """[B, next_n] lengths of no rule: zero, the whole context, a longer row before a shorter one."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, ctx + 1, (batch, next_n), generator=g)
    lens[0, 0], lens[-1, -1] = ctx, 0
    return lens.to(torch.int32)


def check(out: torch.Tensor, ref: torch.Tensor, clean: bool) -> None:
    inside = torch.isfinite(ref)
    got = out.cpu()
    assert torch.isfinite(got[inside]).all()
    assert calc_diff(got[inside], ref[inside]) < 1e-6
    if clean:
        assert torch.equal(torch.isneginf(got), ~inside)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the other interpreter tests (a set knob would stick)


@pytest.mark.parametrize("next_n", [3, 4])
@pytest.mark.parametrize("h", [32, 64])
@pytest.mark.parametrize("lens_kind", ["1d", "2d", "any"])
@pytest.mark.parametrize("clean", [True, False])
def test_triton_interpreter(interpret, next_n, h, lens_kind, clean):
    x = make_paged_inputs(3, next_n, h, 128, 260, block_size=64, lens_2d=lens_kind == "2d", seed=next_n + h)
    lens = any_lens(3, next_n, 260, seed=h) if lens_kind == "any" else x.context_lens
    pool = pad_paged_cache(x.kv_cache, 128)
    out = fp8_paged_mqa_logits_triton(x.q, pool, x.weights, lens, x.block_tables, 260, clean)
    check(out, fp8_paged_mqa_logits_ref(x.q, x.kv_cache, x.weights, lens, x.block_tables, 260), clean)


@pytest.mark.parametrize("next_n,h", [(3, 32), (4, 32), (3, 64), (4, 64)])
def test_triton_sm90_build(next_n, h):
    from triton.backends.compiler import GPUTarget

    facts = aot.sass_facts(compile_for(GPUTarget("cuda", 90, 32), next_n=next_n, h=h, lens_2d=True))
    assert facts.qgmma > 0 and facts.hgmma == 0 and facts.spill_stores == 0 and facts.spill_loads == 0, facts


def test_gluon_pads_next_n_to_a_power_of_two():
    assert [gp._rows_pad(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    assert gp.default_config_for(3).math_wgs == gp.default_config_for(4).math_wgs == 2
    assert gp.default_config_for(2) == gp.default_config()


@needs_gluon_api
@pytest.mark.parametrize("next_n,h", [(3, 32), (4, 32), (3, 16), (4, 16)])
@pytest.mark.parametrize("clean,lens_2d", [(True, True), (False, False)])
def test_gluon_sm90_build(next_n, h, clean, lens_2d):
    k = gp.compile_sm90(next_n=next_n, h=h, clean_logits=clean, lens_2d=lens_2d, config=gp.default_config_for(next_n))
    facts = aot.sass_facts({**k.asm, "metadata": k.metadata})
    assert facts.qgmma > 0 and facts.hgmma == 0 and facts.spill_stores == 0 and facts.spill_loads == 0, facts


@pytest.mark.cuda
@needs_gluon_api
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("next_n,h,lens_kind,clean", [(3, 32, "any", True), (4, 32, "1d", False),
                                                      (3, 16, "any", False), (4, 32, "any", True)])
def test_gluon_gpu_matches_the_oracle(next_n, h, lens_kind, clean):
    if gp.gluon_supported(torch.device("cuda")):
        pytest.skip(str(gp.gluon_supported(torch.device("cuda"))))
    batch, ctx = 7, 3000
    x = make_paged_inputs(batch, next_n, h, 128, ctx, block_size=64, seed=next_n * h)
    lens = any_lens(batch, next_n, ctx, seed=5) if lens_kind == "any" else x.context_lens.clone()
    tables = x.block_tables.clone()
    tables[3, 5] = -1  # an out-of-range id inside a context
    ref = fp8_paged_mqa_logits_ref(x.q, x.kv_cache, x.weights, lens, tables, ctx)
    pool = pad_paged_cache(x.kv_cache.cuda(), 512)
    args = (x.q.cuda(), pool, x.weights.cuda(), lens.cuda(), tables.cuda(), ctx)
    assert gp.unsupported(*args[:5]) is None
    for _ in range(2):  # the second call takes the bound launch
        check(gp.fp8_paged_mqa_logits_gluon(*args, clean), ref, clean)
    if clean:  # bf16 from the same kernel: the float32 logits rounded once
        b16 = gp.fp8_paged_mqa_logits_gluon(*args, clean, logits_dtype=torch.bfloat16)
        f32 = gp.fp8_paged_mqa_logits_gluon(*args, clean)
        assert torch.equal(b16, f32.to(torch.bfloat16))
