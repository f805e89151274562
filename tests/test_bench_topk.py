"""mqa bench --topk: the indexer step's ops benched like the logits ops, each selection checked
against the reference logits before any timing, a wrong one reported and never timed."""

from __future__ import annotations

import pytest
import torch

from mqa_core.bench.runner import run_workloads
from mqa_core.bench.verify import check_selection
from mqa_core.bench.workloads import PAGED, PAGED_TOPK, PREFILL, PREFILL_TOPK, Workload
from mqa_core.cli.main import main
from mqa_core.spec import Problem
from mqa_core.testing.providers import provider_named


def _logits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row 0 sees [1, 6), row 1 [0, 3) (shorter than topk 4), row 2 nothing; -inf elsewhere."""
    x = torch.tensor([[9.0, 5.0, 1.0, 7.0, 3.0, 6.0, 8.0],
                      [2.0, 4.0, 4.0, 0.0, 0.0, 0.0, 0.0],
                      [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    ks, ke = torch.tensor([1, 0, 4], dtype=torch.int32), torch.tensor([6, 3, 4], dtype=torch.int32)
    cols = torch.arange(7)[None, :]
    return x.masked_fill((cols < ks.long()[:, None]) | (cols >= ke.long()[:, None]), float("-inf")), ks, ke


RIGHT = [[1, 3, 4, 5], [0, 1, 2, -1], [-1, -1, -1, -1]]


@pytest.mark.parametrize("wrong,why", [
    ([[1, 2, 3, 5], *RIGHT[1:]], "key 2 (1.0) taken over key 4 (3.0)"),
    ([[1, 3, 4, 6], *RIGHT[1:]], "key 6 is outside row 0's window"),
    ([[1, 3, 4, 5], [0, 1, -1, -1], RIGHT[2]], "row 1 picks 2 of its 3 keys"),
    ([[1, 3, 3, 5], *RIGHT[1:]], "a duplicate"),
    ([RIGHT[0], RIGHT[1], [4, -1, -1, -1]], "an empty window picks a key"),
])
def test_check_selection_rejects_what_breaks_the_rule(wrong, why):
    logits, ks, ke = _logits()
    assert check_selection(torch.tensor(RIGHT, dtype=torch.int32), logits, ks, ke, 4, against="t").ok
    verdict = check_selection(torch.tensor(wrong, dtype=torch.int32), logits, ks, ke, 4, against="t")
    assert not verdict.ok and "rows break the selection rule" in verdict.detail, why
    shape = check_selection(torch.tensor(RIGHT, dtype=torch.int64), logits, ks, ke, 4, against="t")
    assert not shape.ok and "expected int32 [3, 4]" in shape.detail


def test_a_topk_workload_names_its_op_and_needs_a_topk():
    w = Workload(PREFILL, Problem(16, 48, 8, 64), "causal")
    t = w.with_topk(8)
    assert (t.op, t.topk, t.logits_op) == (PREFILL_TOPK, 8, PREFILL) and t.name.endswith(" topk=8")
    assert t.logits_only() == w
    assert Workload(PAGED, Problem(4, 100, 8, 64), "decode", batch=2, next_n=2).with_topk(3).op == PAGED_TOPK
    with pytest.raises(ValueError, match="topk must be >= 1 for fp8_mqa_topk"):
        Workload(PREFILL_TOPK, Problem(16, 48, 8, 64), "causal")
    with pytest.raises(ValueError, match="only there"):
        Workload(PREFILL, Problem(16, 48, 8, 64), "causal", topk=4)


class _Off:
    """torch_ref's top-k of the negated weights: well-formed positions, the worst keys."""

    def fp8_mqa_topk(self, q, kv, weights, *args, **kw):
        from mqa_provider_torch_ref.kernels import KERNELS

        return KERNELS.fp8_mqa_topk(q, kv, -weights, *args, **kw)


def test_run_workloads_checks_each_selection_then_times_the_right_ones(monkeypatch):
    from dataclasses import replace

    from mqa_core.provider import Provider

    ref = provider_named("torch_ref", "cpu", op=PREFILL_TOPK)
    off = Provider(replace(ref.spec, name="off", ops=frozenset({PREFILL_TOPK})), _Off())
    prefill = Workload(PREFILL, Problem(24, 80, 8, 64), "causal").with_topk(16)
    paged = Workload(PAGED, Problem(3 * 2, 150, 8, 64), "decode", batch=3, next_n=2).with_topk(32)
    providers = {("torch_ref", PREFILL_TOPK): ref, ("off", PREFILL_TOPK): off,
                 ("torch_ref", PAGED_TOPK): provider_named("torch_ref", "cpu", op=PAGED_TOPK),
                 ("composed", PREFILL_TOPK): provider_named("composed", "cpu", op=PREFILL_TOPK),
                 ("composed", PAGED_TOPK): provider_named("composed", "cpu", op=PAGED_TOPK)}
    rows = run_workloads([prefill, paged], ["torch_ref", "composed", "off"], providers, torch.device("cpu"), "cpu",
                         warmup=0, repeat=1)
    by = {(r["workload"], r["provider"]): r for r in rows}
    for w in (prefill, paged):
        for name in ("torch_ref", "composed"):
            r = by[(w.name, name)]
            assert r["status"] == "ok" and r["verified_against"] == "float64 oracle" and r["ms_median"] > 0, r
            assert r["op"] == w.op and r["calc_diff"] is None
    assert by[(prefill.name, "off")]["status"] == "wrong" and "ms_median" not in by[(prefill.name, "off")]
    assert by[(paged.name, "off")]["status"] == "skipped"


def test_mqa_bench_topk_on_the_cpu(capsys):
    assert main(["bench", "--topk", "64", "--providers", "torch_ref,composed", "--repeat", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr()
    assert "op=fp8_mqa_topk" in out.out and "the indexer step (top-k 64)" in out.out
    assert out.err.count("selection accepted vs float64 oracle") == 4, out.err
    assert main(["bench", "--topk", "-1"]) == 2
