"""Bad input is refused before any kernel runs, with a message naming the argument, expected and got."""

import pytest
import torch

import mqa_core
from mqa_core import Problem
from mqa_core.testing import make_inputs, make_paged_inputs


@pytest.fixture
def good():
    return make_inputs(Problem(6, 10, 4, 64), window="ragged")


def call(inp, **override):
    args = dict(q=inp.q, kv=(inp.k, inp.k_scale), weights=inp.weights, ks=inp.ks, ke=inp.ke)
    args.update(override)
    return mqa_core.fp8_mqa_logits(args["q"], args["kv"], args["weights"], args["ks"], args["ke"],
                                   **({"clean_logits": override["clean"]} if "clean" in override else {}))


@pytest.mark.parametrize("make, exc, words", [
    (lambda i: {"q": i.q.float()}, TypeError, r"q must be float8_e4m3fn or float8_e4m3fnuz \[M, H, D\]; got float32"),
    (lambda i: {"q": i.q[0]}, ValueError, r"q must have shape \[M, H, D\]"),
    (lambda i: {"kv": (i.k.view(torch.int8), i.k_scale)}, TypeError,
     r"k \(kv\[0\]\) must be float8_e4m3fn or float8_e4m3fnuz \[N, D\]; got int8"),
    (lambda i: {"kv": (i.k[:, :32], i.k_scale)}, ValueError, r"k \(kv\[0\]\) must have shape \[N, D\] = \[N, 64\]"),
    (lambda i: {"kv": (i.k, i.k_scale.double())}, TypeError, "k_scale .* must be float32"),
    (lambda i: {"kv": (i.k, i.k_scale[:5])}, ValueError, r"k_scale .* \[N\] = \[10\] or \[N, 1\] = \[10, 1\]"),
    (lambda i: {"kv": (i.k, i.k_scale[:, None].expand(10, 2))}, ValueError, r"\[10, 1\]"),
    (lambda i: {"kv": i.k}, TypeError, "kv must be a tuple"),
    (lambda i: {"weights": i.weights.half()}, TypeError, "weights must be float32"),
    (lambda i: {"weights": i.weights.T}, ValueError, r"weights must have shape \[M, H\] = \[6, 4\]"),
    (lambda i: {"ks": i.ks.long()}, TypeError, "cu_seqlen_ks must be int32"),
    (lambda i: {"ke": i.ke[:3]}, ValueError, r"cu_seqlen_ke must have shape \[M\] = \[6\]"),
    (lambda i: {"ke": i.ke.to("meta")}, ValueError, "all tensors must be on one device"),
    (lambda i: {"clean": 1}, TypeError, "clean_logits must be a bool"),
])
def test_bad_arguments_are_named(good, make, exc, words):
    with pytest.raises(exc, match=words):
        call(good, **make(good))


def test_full_validation_checks_values(good, monkeypatch):
    bad = good.k_scale.clone()
    bad[3] = 0
    call(good, kv=(good.k, bad))  # cheap mode does not sync to look at values
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    with pytest.raises(ValueError, match="k_scale must be > 0"):
        call(good, kv=(good.k, bad))


def test_provider_refuses_tensors_of_an_arch_it_does_not_serve(install_dist):
    from mqa_core.provider import Provider
    from mqa_core.spec import ProviderSpec

    spec = ProviderSpec(name="gpu_only", ops={"fp8_mqa_logits"}, archs={"sm_90"},
                        dtypes={"float8_e4m3fn"}, priority=1, load="x:y")
    p = Provider(spec, mqa_core.get_provider("cpu").impl)
    inp = make_inputs(Problem(2, 3, 4, 64))
    with pytest.raises(ValueError, match="provider gpu_only serves sm_90; the tensors are on cpu"):
        p.fp8_mqa_logits(*inp.args())
    with pytest.raises(NotImplementedError, match="does not serve fp8_paged_mqa_logits"):
        p.fp8_paged_mqa_logits(*make_paged_inputs(1, 1, 4, 64, 64).args())


def test_paged_arguments(monkeypatch):
    # lengths fixed past one block: random ones in [2, 200] all fit block_tables[:, :1] once in 180
    # draws, and then the last check below has nothing to refuse (a CI run drew such a pair)
    inp = make_paged_inputs(2, 2, 4, 64, 200, block_size=16, context_lens=torch.tensor([37, 200], dtype=torch.int32))
    args = list(inp.args())
    with pytest.raises(ValueError, match=r"kv_cache must have shape \[num_blocks, block_size, 1, D \+ 4\]"):
        mqa_core.fp8_paged_mqa_logits(args[0], args[1][..., :-1], *args[2:])
    with pytest.raises(ValueError, match=r"weights must have shape \[B \* next_n, H\] = \[4, 4\]"):
        mqa_core.fp8_paged_mqa_logits(args[0], args[1], args[2][:2], *args[3:])
    with pytest.raises(TypeError, match="max_context_len must be a non-negative int"):
        mqa_core.fp8_paged_mqa_logits(*args[:5], 2.5)
    monkeypatch.setenv("MQA_VALIDATE", "full")
    mqa_core.reload()
    tables = inp.block_tables.clone()
    tables[1, 0] = 10**6
    with pytest.raises(ValueError, match="block ids outside"):
        mqa_core.fp8_paged_mqa_logits(*args[:4], tables, args[5])
    with pytest.raises(ValueError, match="exceed what block_tables covers"):
        mqa_core.fp8_paged_mqa_logits(*args[:4], inp.block_tables[:, :1], args[5])


def test_paged_torch_ref_matches_oracle():
    from mqa_core.testing import calc_diff

    for lens_2d in (False, True):
        inp = make_paged_inputs(3, 2, 8, 64, 150, block_size=16, lens_2d=lens_2d)
        out = mqa_core.fp8_paged_mqa_logits(*inp.args())
        ref = inp.reference()
        assert torch.equal(torch.isinf(out), torch.isinf(ref))
        assert calc_diff(out, ref) < 1e-9


@pytest.mark.parametrize("value", [2**70, 2**31, -1])
def test_max_context_len_is_bounded_before_any_kernel(value):
    """Issue 37: 2**70 passed validation, then failed inside torch with a C++ dump."""
    inp = make_paged_inputs(2, 2, 4, 64, 200, block_size=16)
    args = list(inp.args())
    for call in (mqa_core.fp8_paged_mqa_logits,
                 mqa_core.get_provider("cpu", op="fp8_paged_mqa_logits").fp8_paged_mqa_logits):
        with pytest.raises(ValueError, match=rf"max_context_len must be a non-negative int below 2\*\*31; got {value}"):
            call(*args[:5], value)


def test_sizes_typed_on_a_command_line_are_bounded():
    with pytest.raises(ValueError, match="below 2\\*\\*31"):
        Problem.parse(f"1,{2**31},4,64")
    with pytest.raises(TypeError, match="num_sms must be a positive int below 2\\*\\*31"):
        mqa_core.paged_schedule(torch.ones(2, dtype=torch.int32), 2**70)
