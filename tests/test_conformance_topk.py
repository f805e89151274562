"""Kit v3, the top-k cases: torch_ref, composed (and triton, in Triton's interpreter, on a subset) pass
them; four near-miss top-k providers fail them, each where it is wrong."""

from __future__ import annotations

import os

import pytest
import torch
from kit_wrong_providers import TOPK_KERNELS, TOPK_SPECS, TOPK_WRONG
from test_conformance_kit import failed_ids, install_wrong_providers, outcomes, run_kit

from mqa_core.spec import Problem
from mqa_core.testing import topk
from mqa_core.testing.checks import Windows
from mqa_core.testing.runner import Draw

pytest_plugins = ("pytester",)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


TOPK_CASES = "topk"


def test_kit_topk_passes_torch_ref_and_composed_fails_wrong(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One kit run: torch_ref and composed pass every top-k case on the CPU; each near miss fails."""
    install_wrong_providers(pytester.path, monkeypatch, package="wrong_topk_providers", specs=TOPK_SPECS,
                            kernels=TOPK_KERNELS)
    names = ["torch_ref", "composed", *TOPK_WRONG]
    result, per = run_kit(pytester, names, "--mqa-device", "cpu", "-k", TOPK_CASES)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for name in ("torch_ref", "composed"):
        counts = outcomes(per[name])
        assert counts["failed"] == 0 and counts["passed"] >= 35, (name, counts, result.stdout.str()[-3000:])
    # composed serves the fused ops: topk_per_row and the logits claims skip, saying so.
    assert outcomes(per["composed"], "test_topk_per_row") == {"skipped": 12}
    assert outcomes(per["torch_ref"], "test_topk_claims_batch_invariant") == {"passed": 5}
    assert outcomes(per["torch_ref"], "test_topk_memory") == {"skipped": 3}  # CUDA only

    # Ties to the larger position: right on random inputs (no ties there), wrong wherever exact inputs tie.
    ties = per["wrong_ties"]
    assert outcomes(ties, "test_topk_prefill")["failed"] == 0
    assert set(failed_ids(ties, "test_topk_prefill_exact")) >= {
        f"wrong_ties-e4m3fn-{w}-ties-{m}" for w in ("causal", "edges") for m in ("relative", "absolute-values")}
    assert {"wrong_ties-e4m3fn-ties-relative", "wrong_ties-e4m3fn-infnan-relative"} <= set(
        failed_ids(ties, "test_topk_per_row"))
    assert outcomes(ties, "test_topk_per_row_sizes")["failed"] >= 3  # topk 512, 2048, 4096 (topk 1 may not tie)
    assert "wrong_ties-e4m3fn-B3-next2-lens2d-exact" in failed_ids(ties, "test_topk_paged")
    msg = next(m for i, o, m in ties["test_topk_prefill_exact"] if o == "failed")
    assert "[wrong_ties] fp8_mqa_topk" in msg and "a tie: ties go to the smaller position" in msg, msg
    assert outcomes(ties, "test_topk_claims_deterministic") == {"passed": 3}

    # The last key never selected: every window shorter than topk shows it, random and exact inputs alike.
    last = per["wrong_lastkey"]
    for test in ("test_topk_prefill", "test_topk_prefill_exact", "test_topk_per_row", "test_topk_per_row_sizes",
                 "test_topk_paged", "test_topk_prefill_sizes"):
        assert outcomes(last, test)["failed"] >= 2, (test, outcomes(last, test))
    assert "wrong_lastkey-e4m3fn-short-relative" in failed_ids(last, "test_topk_prefill")
    msg = next(m for i, o, m in last["test_topk_prefill"] if i.endswith("short-relative"))
    assert "(-1 before the window is used up)" in msg, msg

    # Selection on bf16-rounded logits: exact inputs with distinct, close logits show it.
    bf16 = per["wrong_bf16select"]
    assert set(failed_ids(bf16, "test_topk_prefill_exact")) >= {
        f"wrong_bf16select-e4m3fn-{w}-distinct-{m}" for w in ("causal", "edges")
        for m in ("relative", "absolute-values")}
    assert {f"wrong_bf16select-e4m3fn-close-{m}" for m in ("relative", "absolute-values")} <= set(
        failed_ids(bf16, "test_topk_per_row"))
    assert not [i for i in failed_ids(bf16, "test_topk_per_row") if "-bf16-" in i or "-ties-" in i]  # bf16-exact

    # Batch-dependent: every selection acceptable, every exact case equal; only its claim is false.
    batch = per["wrong_batch"]
    claim = "test_topk_claims_batch_invariant"
    assert sorted(failed_ids(batch, claim)) == [f"wrong_batch-e4m3fn-{op}" for op in ("fp8_mqa_topk",
                                                                                     "fp8_paged_mqa_topk")]
    assert outcomes({t: c for t, c in batch.items() if t != claim})["failed"] == 0, batch
    msg = next(m for i, o, m in batch[claim] if o == "failed")
    assert "claim batch_invariant" in msg and "values differ in their bits" in msg, msg
    # Providers that do not claim batch_invariant are not held to it.
    assert outcomes(ties, claim) == {"skipped": 5}


def test_kit_topk_passes_triton_interpreted(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The triton provider (its fused top-k, paged two-stage path and radix select) in Triton's
    interpreter, on a subset of the top-k cases that stays small."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result, per = run_kit(pytester, ["triton"], "--mqa-device", "cpu", "-k",
                          "topk and (exact and causal and relative or per_row and ties or paged and B3 "
                          "or chunked and causal or claims and not logits)")
    counts = outcomes(per["triton"])
    assert result.ret == 0 and counts["failed"] == 0 and counts["passed"] >= 10, (counts, result.stdout.str()[-3000:])


# -- the checks themselves, without a provider ------------------------------------------------------------

def _draw() -> Draw:
    return Draw.on(torch.device("cpu"), seed=3)


def test_oracle_tie_rule_and_specials() -> None:
    inf, nan = float("inf"), float("nan")
    row = torch.tensor([1.0, 3.0, 3.0, -0.0, 0.0, -inf, nan, 3.0], dtype=torch.float64)
    assert topk.oracle_select(row, 3).tolist() == [1, 2, 7]
    assert topk.oracle_select(row, 5).tolist() == [0, 1, 2, 3, 7]  # -0.0 == 0.0: the smaller position
    assert topk.oracle_select(row, 7).tolist() == [0, 1, 2, 3, 4, 5, 7]  # -inf before NaN
    assert topk.oracle_select(row, 9).tolist() == list(range(8))


def test_check_topk_messages() -> None:
    case = _draw().case("mine", "topk_per_row", "hand-made", Problem(1, 6, 1, 1))
    want = torch.tensor([[1.0, 2.0, 2.0, 0.0, 5.0, 2.0]], dtype=torch.float64)
    wins = Windows.prefill(torch.tensor([0]), torch.tensor([6]), 6)
    ok = torch.tensor([[1, 2, 4]], dtype=torch.int32)
    topk.check_topk(ok, None, want, None, wins, 3, "relative", case)
    with pytest.raises(AssertionError, match="a tie: ties go to the smaller position"):
        topk.check_topk(torch.tensor([[1, 4, 5]], dtype=torch.int32), None, want, None, wins, 3, "relative", case)
    with pytest.raises(AssertionError, match="strictly ascend"):
        topk.check_topk(torch.tensor([[4, 1, 2]], dtype=torch.int32), None, want, None, wins, 3, "relative", case)
    with pytest.raises(AssertionError, match=r"slots 6\.\. must be -1"):
        topk.check_topk(torch.tensor([[0, 1, 2, 3, 4, 5, 0]], dtype=torch.int32), None, want, None, wins, 7,
                        "relative", case)
    # Accepted within bounds: key 5 (2.0) over key 0 (1.0) is wrong unless the bounds overlap.
    bound = torch.full_like(want, 0.1)
    topk.check_topk(torch.tensor([[1, 4, 5]], dtype=torch.int32), None, want, bound, wins, 3, "relative", case)
    with pytest.raises(AssertionError, match="selects key 0"):
        topk.check_topk(torch.tensor([[0, 4]], dtype=torch.int32), None, want, bound, wins, 2, "relative", case)
    topk.check_topk(torch.tensor([[0, 4]], dtype=torch.int32), None, want, torch.full_like(want, 0.6), wins, 2,
                    "relative", case)
    vals = torch.tensor([[2.0, 5.0, 2.0]])
    topk.check_topk(torch.tensor([[1, 4, 5]], dtype=torch.int32), vals, want, bound, wins, 3, "relative", case)
    with pytest.raises(AssertionError, match="beyond its bound"):
        topk.check_topk(torch.tensor([[1, 4, 5]], dtype=torch.int32), vals + 0.5, want, bound, wins, 3, "relative",
                        case)


def test_exact_inputs_are_exact_in_float32() -> None:
    """The premise of the exact cases: float32 logits (any summation order) equal the float64 oracle."""
    from mqa_core.testing.runner import expected

    for ties in (True, False):
        x = topk.exact_prefill(_draw(), Problem(7, 300, 16, 128), window="full", ties=ties)
        want, _ = expected(x)
        s = torch.einsum("mhd,nd->mhn", x.q.float(), x.k.float()).relu()
        got = torch.einsum("mhn,mh->mn", s, x.weights) * x.k_scale[None, :]
        assert torch.equal(got.double(), want)
        if ties:  # keys repeat every TIE_PERIOD positions: equal logits across every 64/128 border
            assert torch.equal(want[:, 60], want[:, 60 + topk.TIE_PERIOD])
        else:  # large and close: bf16 merges some of them
            assert (want.float().bfloat16().float() != want.float()).any()
