"""``mqa tune --topk``: the indexer step's ops tuned per bucket (kit subset on exact inputs first),
and the table driving selection of the top-k ops in a fresh process."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from kit_wrong_providers import TOPK_KERNELS
from test_cli_tune import mqa

from mqa_core import ProviderSpec
from mqa_core.cli.tune import TuneShape, kit_check
from mqa_core.provider import Provider
from mqa_core.testing.providers import provider_named

CPU = torch.device("cpu")


def test_tune_topk_writes_top_k_buckets_that_selection_reads(tmp_path: Path) -> None:
    r = mqa("tune", "--device", "cpu", "--providers", "torch_ref,composed", "--preset", "quick", "--topk", "16",
            "--margin", "0", "--out", "t.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the indexer step (top-k 16)" in r.stdout and "selection accepted vs float64 oracle" in r.stderr
    table = json.loads((tmp_path / "t.json").read_text())
    assert table["arguments"]["topk"] == 16
    ops = {e["op"] for e in table["entries"]}
    assert ops == {"fp8_mqa_topk", "fp8_paged_mqa_topk"}, ops
    entry = next(e for e in table["entries"] if e["op"] == "fp8_mqa_topk" and e["m"][0] <= 256 < e["m"][1])
    fastest = min(entry["times_ms"], key=entry["times_ms"].get)  # margin 0: the fastest is the pick
    r = mqa("explain", "--arch", "cpu", "--op", "fp8_mqa_topk", "--shape", "256,1024,32,128",
            env={"MQA_TUNING": str(tmp_path / "t.json")})
    assert r.returncode == 0, r.stderr
    assert f"chosen: {fastest} " in r.stdout and "t.json for bucket fp8_mqa_topk H=32" in r.stdout, r.stdout


def test_top_k_shapes_keep_their_op_in_a_split_half() -> None:
    shape = TuneShape.prefill(512, 512, 32, 128).with_topk(64)
    assert shape.op == "fp8_mqa_topk" and shape.workload().topk == 64 and shape.bucket().op == "fp8_mqa_topk"
    half = shape.bucket().halves()[0]
    inner = shape.within(half)
    assert inner is not None and (inner.op, inner.topk) == ("fp8_mqa_topk", 64)
    decode = TuneShape.decode(4, 512, 2, 32, 128).with_topk(8)
    assert decode.paged and decode.workload().op == "fp8_paged_mqa_topk"


def test_the_top_k_kit_subset_fails_ties_broken_the_other_way() -> None:
    ns: dict = {}
    exec(TOPK_KERNELS, ns)  # the kit's wrong providers (tests/kit_wrong_providers.py)
    spec = ProviderSpec(name="wrong_ties", ops={"fp8_mqa_topk", "fp8_paged_mqa_topk"}, archs={"cpu"},
                        dtypes={"float8_e4m3fn"}, priority=-100, load="wrong_topk_providers.kernels:TIES")
    wrong = Provider(spec, ns["TIES"])
    for op in ("fp8_mqa_topk", "fp8_paged_mqa_topk"):
        why = kit_check(wrong, op, 16, 64, CPU, 0, topk=16)
        assert why is not None and "tie" in why, why
        assert kit_check(provider_named("torch_ref", "cpu", op=op), op, 16, 64, CPU, 0, topk=16) is None
