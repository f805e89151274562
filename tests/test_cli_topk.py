"""The CLI for the indexer step: `mqa explain --op <top-k op>` shows the claims and the composed
provider; `mqa check` runs the kit's top-k cases, `--provider composed` included."""

from __future__ import annotations

import json

import pytest

from mqa_core.cli.main import main


@pytest.mark.parametrize("op,chosen", [("fp8_mqa_topk", "composed"), ("fp8_paged_mqa_topk", "composed"),
                                       ("topk_per_row", "torch_ref")])
def test_explain_topk_ops_show_claims(op: str, chosen: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--arch", "cpu", "--op", op]) == 0
    text = capsys.readouterr().out
    assert f"op={op}" in text and f"chosen: {chosen}" in text, text
    assert "claims" in text.splitlines()[1] and "batch-inv,det" in text, text
    assert main(["explain", "--arch", "cpu", "--op", op, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {c["name"]: c for c in data["candidates"]}
    assert data["chosen"] == chosen and sorted(rows["torch_ref"]["claims"]) == ["batch_invariant", "deterministic"]


def test_explain_batch_invariant_rejects_unclaimed(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MQA_BATCH_INVARIANT", "1")
    assert main(["explain", "--arch", "cpu", "--op", "fp8_mqa_logits"]) == 0
    text = capsys.readouterr().out
    assert "example_chunked" in text and "rejected [claims] MQA_BATCH_INVARIANT=1" in text, text


def test_check_runs_the_topk_cases_for_composed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--provider", "composed", "--provider", "torch_ref", "--device", "cpu", "-k",
                 "topk_prefill_exact or topk_paged or topk_per_row or claims", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"], data
    composed, ref = data["providers"]["composed"], data["providers"]["torch_ref"]
    assert composed["failed"] == 0 and composed["passed"] >= 15, composed
    assert ref["failed"] == 0 and ref["passed"] > composed["passed"], ref  # topk_per_row: torch_ref's only
