"""Tuned selection: buckets, the table file, the stamp check, the pure decision and the registry path."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import mqa_core
from mqa_core import Problem, ProviderSpec
from mqa_core.select import decide
from mqa_core.settings import Settings
from mqa_core.testing.providers import environment
from mqa_core.tuning import (
    DEFAULT_MARGIN,
    MAX_TABLE_BYTES,
    SCHEMA,
    Bucket,
    Entry,
    Stamp,
    Tuning,
    TuningTable,
    bucket_index,
    bucket_range,
    cell_index,
    cell_range,
    current_stamp,
    load_tuning,
)

CPU_PROVIDERS = {"torch_ref": "mqa-provider-torch-ref", "example_chunked": "mqa-provider-example-chunked"}


def here() -> Stamp:
    return current_stamp(torch.device("cpu"), CPU_PROVIDERS)


def entry(op="fp8_mqa_logits", h=32, d=128, m=(256, 512), n=(1024, 2048), next_n=None, **times):
    return Entry(Bucket(op, h, d, m, n, next_n), times, {k: "ok" if v else "wrong: x" for k, v in times.items()})


def write(path, entries, stamp=None, margin=DEFAULT_MARGIN) -> str:
    TuningTable(stamp or here(), tuple(entries), margin=margin).write(str(path))
    return str(path)


# -- buckets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("x, r", [(0, (0, 1)), (1, (1, 2)), (2, (2, 4)), (3, (2, 4)), (4096, (4096, 8192)),
                                  (8191, (4096, 8192)), (65536, (65536, 131072))])
def test_power_of_two_ranges(x, r):
    assert bucket_range(bucket_index(x)) == r
    lo, hi = r
    assert lo <= x < hi


def test_bucket_of_a_problem_and_its_text():
    b = Bucket.of("fp8_paged_mqa_logits", Problem(64, 32768, 64, 128), next_n=2)
    assert (b.m, b.n, b.next_n) == ((64, 128), (32768, 65536), 2)
    assert str(b) == "fp8_paged_mqa_logits H=64 D=128 next_n=2 M in [64, 128) N in [32768, 65536)"
    assert Bucket.of("fp8_mqa_logits", Problem(3, 5, 32, 64), next_n=2).next_n is None


@pytest.mark.parametrize("x, r", [(0, (0, 1)), (1, (1, 2)), (2, (2, 3)), (3, (3, 4)), (5, (4, 6)), (6, (6, 8)),
                                  (700, (512, 768)), (767, (512, 768)), (768, (768, 1024)), (1023, (768, 1024)),
                                  (40000, (32768, 49152)), (50000, (49152, 65536))])
def test_cells_halve_each_power_of_two_range_at_one_and_a_half_times_its_start(x, r):
    assert cell_range(cell_index(x)) == r
    lo, hi = bucket_range(bucket_index(x))
    assert lo <= r[0] <= x < r[1] <= hi


def test_half_ranges_make_finer_buckets_and_a_bucket_splits_into_its_halves():
    b = Bucket("fp8_mqa_logits", 32, 128, (512, 1024), (512, 1024))
    assert b.fineness == 0 and len(b.cells) == 4
    halves = b.halves()
    assert [(h.m, h.n) for h in halves] == [((512, 768), (512, 768)), ((512, 768), (768, 1024)),
                                            ((768, 1024), (512, 768)), ((768, 1024), (768, 1024))]
    assert all(h.fineness == 2 and len(h.cells) == 1 for h in halves)
    assert sorted(k for h in halves for k in h.cells) == sorted(b.cells)
    assert str(halves[1]) == "fp8_mqa_logits H=32 D=128 M in [512, 768) N in [768, 1024)"
    one_row = Bucket("fp8_paged_mqa_logits", 32, 128, (1, 2), (4096, 8192), 1)  # M = [1, 2) has no halves
    assert [(h.m, h.n, h.fineness) for h in one_row.halves()] == [((1, 2), (4096, 6144), 1), ((1, 2), (6144, 8192), 1)]
    assert halves[1].contains("fp8_mqa_logits", Problem(700, 900, 32, 128))
    assert not halves[1].contains("fp8_mqa_logits", Problem(700, 700, 32, 128))
    assert not halves[1].contains("fp8_mqa_logits", Problem(700, 900, 64, 128))


@pytest.mark.parametrize("kw, says", [
    ({"m": (3, 8)}, r"m range \[3, 8\) is not a power-of-two bucket"),
    ({"n": (512, 700)}, r"n range \[512, 700\) is not a power-of-two bucket .* nor half of one"),
    ({"op": "nope"}, "op 'nope' is not one of"),
    ({"h": 0}, "h must be a positive int"),
    ({"next_n": 2}, "next_n is for decode"),
])
def test_bad_buckets_are_refused(kw, says):
    args = {"op": "fp8_mqa_logits", "h": 32, "d": 128, "m": (4, 8), "n": (8, 16), **kw}
    with pytest.raises(ValueError, match=says):
        Bucket(**args)


def test_ranking_is_fastest_first_ties_by_name_and_skips_unmeasured():
    e = entry(b=2.0, a=2.0, c=1.0, z=None)
    assert e.ranking == ("c", "a", "b")
    assert e.times_text() == "c 1 ms, a 2 ms, b 2 ms"
    with pytest.raises(ValueError, match="invalid time for a"):
        entry(a=-1.0)


# -- the file ------------------------------------------------------------------------------------

def test_round_trip_and_lookup(tmp_path):
    path = write(tmp_path / "t.json", [entry(torch_ref=2.0, example_chunked=1.0),
                                       entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(512, 1024), next_n=2,
                                             torch_ref=1.0)])
    table = load_tuning(path)
    assert table.path == path and table.stamp == here()
    data = json.load(open(path))
    assert data["schema"] == SCHEMA and data["entries"][0]["winner"] == "example_chunked"
    assert data["entries"][0]["m"] == [256, 512] and "power" in data["buckets"]
    assert table.lookup("fp8_mqa_logits", Problem(300, 1500, 32, 128)).ranking == ("example_chunked", "torch_ref")
    assert table.lookup("fp8_mqa_logits", Problem(300, 1500, 64, 128)) is None  # other H
    assert table.lookup("fp8_mqa_logits", Problem(600, 1500, 32, 128)) is None  # other M bucket
    assert table.lookup("fp8_paged_mqa_logits", Problem(6, 600, 32, 128)).ranking == ("torch_ref",)


def test_the_finest_entry_over_a_cell_answers_and_the_coarse_one_the_rest(tmp_path):
    coarse = entry(m=(512, 1024), n=(512, 1024), a=1.0, b=2.0)
    fine = entry(m=(512, 768), n=(768, 1024), a=2.0, b=1.0)
    for order in ((coarse, fine), (fine, coarse)):
        path = write(tmp_path / "t.json", order)
        table = load_tuning(path)
        assert table.lookup("fp8_mqa_logits", Problem(700, 900, 32, 128)).bucket == fine.bucket
        for m, n in ((600, 600), (900, 900), (1000, 520)):
            assert table.lookup("fp8_mqa_logits", Problem(m, n, 32, 128)).bucket == coarse.bucket, (m, n)
    assert json.load(open(path))["entries"][0]["m"] == [512, 768]


def test_overlapping_entries_that_are_equally_fine_are_refused_unless_a_finer_one_decides():
    m_half = entry(m=(512, 768), n=(512, 1024), a=1.0)
    n_half = entry(m=(512, 1024), n=(512, 768), a=1.0)
    with pytest.raises(ValueError, match=r"entries for buckets .* overlap, neither finer"):
        TuningTable(here(), (m_half, n_half))
    with pytest.raises(ValueError, match="two entries for bucket"):
        TuningTable(here(), (m_half, m_half))
    both = entry(m=(512, 768), n=(512, 768), a=1.0)  # the one cell they share
    for order in ((m_half, n_half, both), (both, n_half, m_half)):
        t = TuningTable(here(), order)
        assert t.lookup("fp8_mqa_logits", Problem(600, 600, 32, 128)) is both
        assert t.lookup("fp8_mqa_logits", Problem(600, 900, 32, 128)) is m_half
        assert t.lookup("fp8_mqa_logits", Problem(900, 600, 32, 128)) is n_half
        assert t.lookup("fp8_mqa_logits", Problem(900, 900, 32, 128)) is None


def test_a_table_of_the_first_schema_still_loads(tmp_path):
    path = write(tmp_path / "t.json", [entry(torch_ref=2.0, example_chunked=1.0)])
    data = json.load(open(path))
    data["schema"] = "mqa-tuning/1"
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert load_tuning(path).lookup("fp8_mqa_logits", Problem(300, 1500, 32, 128)).ranking[0] == "example_chunked"


def test_decode_requests_without_next_n_merge_the_next_n_entries(tmp_path):
    table = TuningTable(here(), (
        entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(512, 1024), next_n=1, a=1.0, b=4.0),
        entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(512, 1024), next_n=2, a=9.0, b=1.0, c=0.5),
    ))
    merged = table.lookup("fp8_paged_mqa_logits", Problem(5, 600, 32, 128))
    assert merged.times_ms == pytest.approx({"a": 3.0, "b": 2.0, "c": None})  # geomeans; c measured in one only
    assert merged.ranking == ("b", "a")

    class WithNextN(Problem):
        pass

    p = WithNextN(5, 600, 32, 128)
    object.__setattr__(p, "next_n", 2)
    assert table.lookup("fp8_paged_mqa_logits", p).ranking == ("c", "b", "a")


def test_a_split_decode_bucket_merges_per_cell_over_next_n():
    table = TuningTable(here(), (
        entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(512, 1024), next_n=1, a=1.0, b=4.0),
        entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(512, 1024), next_n=2, a=9.0, b=1.0),
        entry(op="fp8_paged_mqa_logits", m=(4, 8), n=(768, 1024), next_n=2, a=1.0, b=4.0),
    ))
    low = table.lookup("fp8_paged_mqa_logits", Problem(5, 600, 32, 128))
    high = table.lookup("fp8_paged_mqa_logits", Problem(5, 900, 32, 128))
    assert low.times_ms == pytest.approx({"a": 3.0, "b": 2.0}) and low.bucket.n == (512, 1024)
    assert high.times_ms == pytest.approx({"a": 1.0, "b": 4.0}) and high.bucket.n == (768, 1024)  # the finer
    assert low.bucket.next_n is None and low.bucket.m == (4, 8)


@pytest.mark.parametrize("content, says", [
    ("{", "cannot read tuning table"),
    ('{"schema": "other"}', "schema is 'other'"),
    ('{"schema": "mqa-tuning/1", "entries": []}', "missing field 'stamp'"),
])
def test_invalid_files_name_the_file(tmp_path, content, says):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=says) as info:
        load_tuning(str(path))
    assert str(path) in str(info.value)


def test_the_margin_is_written_read_back_and_defaults_for_older_tables(tmp_path):
    path = write(tmp_path / "t.json", [entry(torch_ref=2.0)], margin=0.125)
    assert json.load(open(path))["margin"] == 0.125 and load_tuning(path).margin == 0.125
    assert "margin" not in load_tuning(path).info
    data = json.load(open(path))
    del data["margin"]  # a table written before the margin existed
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_tuning(str(tmp_path / "old.json")).margin == DEFAULT_MARGIN == 0.05
    assert load_tuning(write(tmp_path / "zero.json", [], margin=0)).margin == 0.0


@pytest.mark.parametrize("margin", [1.0, 5, -0.01, "0.05", True, None, float("nan")])
def test_a_bad_margin_is_rejected_naming_the_file(tmp_path, margin):
    data = json.loads(open(write(tmp_path / "t.json", [entry(torch_ref=2.0)])).read())
    data["margin"] = margin
    path = tmp_path / "bad-margin.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_tuning(str(path))
    assert str(info.value).startswith(f"invalid tuning table {path}: margin must be a number in [0, 1)")
    assert repr(margin) in str(info.value)


def test_stamp_mismatches_are_listed():
    stamp = here()
    other = Stamp("Other CPU", "cpu", None, {**stamp.versions, "torch": "1.0"}, stamp.providers)
    assert other.mismatches(stamp) == [f"device name {stamp.device_name} here vs Other CPU in the table",
                                       f"torch {stamp.versions['torch']} here vs 1.0 in the table"]
    assert stamp.mismatches(stamp) == []


# -- the pure decision ---------------------------------------------------------------------------

def spec(name, priority):
    return ProviderSpec(name=name, ops={"fp8_mqa_logits"}, archs={"cpu"}, dtypes={"float8_e4m3fn"},
                        priority=priority, load=f"pkg.{name}:OBJ")


SPECS = [spec("high", 100), spec("mid", 50), spec("low", 0)]


BUCKET = "fp8_mqa_logits H=32 D=128 M in [256, 512) N in [1024, 2048)"
INSIDE = Problem(300, 1500, 32, 128)


def tuning(ranking_times, matches=True, margin=DEFAULT_MARGIN) -> Tuning:
    t = Tuning(TuningTable(here(), (entry(**ranking_times),), path="t.json", margin=margin))
    t._matches = matches
    return t


def table_hook(ranking_times, matches=True, margin=DEFAULT_MARGIN):
    return tuning(ranking_times, matches, margin).choose


def chosen(times, margin=DEFAULT_MARGIN, **settings):
    return decide(SPECS, [], Settings(**settings), arch="cpu", op="fp8_mqa_logits", problem=INSIDE,
                  tuning=table_hook(times, margin=margin))


def test_decide_takes_the_fastest_usable_measured_provider():
    d = chosen({"low": 1.0, "high": 3.0})
    assert d.chosen == "low"
    assert d.why == ("fastest measured usable provider: its lead 200.0% over high (priority) exceeds the "
                     f"table's 5% margin; measured in t.json for bucket {BUCKET}: low 1 ms, high 3 ms")
    alone = chosen({"low": 1.0})  # the fastest is also the first measured by priority: no margin question
    assert alone.why == f"fastest measured usable provider in t.json for bucket {BUCKET}: low 1 ms"
    blocked = decide(SPECS, [], Settings(disabled=frozenset({"low"})), arch="cpu", op="fp8_mqa_logits",
                     problem=INSIDE, tuning=table_hook({"low": 1.0, "high": 3.0}))
    assert blocked.chosen == "high" and "(low not usable here)" in blocked.why


def test_a_lead_within_the_margin_keeps_the_priority_provider():
    # The H200 case: triton 0.03108 ms vs gluon 0.03175 ms, gluon first by priority.
    d = chosen({"low": 0.03108, "high": 0.03175})
    assert d.chosen == "high"
    assert d.why == ("high (priority) kept: low's lead 2.2% is within the table's 5% margin; measured in "
                     f"t.json for bucket {BUCKET}: low 0.03108 ms, high 0.03175 ms")
    assert chosen({"low": 1.0, "high": 1.05}).chosen == "high"  # at the margin: kept
    assert chosen({"low": 1.0, "mid": 1.2, "high": 1.04}).chosen == "high"
    # P is the first *measured* usable provider by priority: high unmeasured here, so mid is kept.
    d = chosen({"low": 1.0, "mid": 1.04, "high": None})
    assert d.chosen == "mid" and d.why.startswith("mid (priority) kept: low's lead 4.0% is within")
    # ... and the first *usable* one: with high blocked, its faster time does not count.
    d = chosen({"low": 1.0, "mid": 1.04, "high": 0.5}, disabled=frozenset({"high"}))
    assert d.chosen == "mid" and "(high not usable here)" in d.why


def test_a_lead_beyond_the_margin_takes_the_faster_provider():
    d = chosen({"low": 1.0, "high": 1.06})
    assert d.chosen == "low"
    assert d.why == ("fastest measured usable provider: its lead 6.0% over high (priority) exceeds the "
                     f"table's 5% margin; measured in t.json for bucket {BUCKET}: low 1 ms, high 1.06 ms")
    assert chosen({"low": 1.0, "high": 1.04}, margin=0.02).chosen == "low"  # the table's margin, not 5%
    assert "exceeds the table's 2% margin" in chosen({"low": 1.0, "high": 1.04}, margin=0.02).why
    assert chosen({"low": 1.0, "high": 1.25}, margin=0.3).chosen == "high"


def test_margin_zero_takes_the_fastest():
    assert chosen({"low": 1.0, "high": 1.001}, margin=0).chosen == "low"
    assert chosen({"low": 1.0, "mid": 0.999, "high": 1.001}, margin=0).chosen == "mid"
    tie = chosen({"low": 1.0, "mid": 1.0}, margin=0)  # an exact tie: priority decides, not the name
    assert tie.chosen == "mid" and "low's lead 0.0% is within the table's 0% margin" in tie.why


PLAN = tuple(sorted(SPECS, key=lambda s: -s.priority))  # high, mid, low: the registry's plan order


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("times", [
    {"high": 1.03, "mid": 1.02, "low": 1.0},  # each within 5% of the next: picking again matters
    {"high": 1.1, "mid": 1.04, "low": 1.0},
    {"high": 1.0, "mid": 1.0, "low": 1.0},
    {"high": None, "mid": 1.3, "low": 1.0},
    {"high": 2.0, "low": 1.0},  # mid unmeasured: last
    {"high": 1.0, "mid": None, "low": None},
])
def test_order_and_choose_agree_on_every_subset(times, margin):
    t = tuning(times, margin=margin)
    order = t.order("cpu", "fp8_mqa_logits", INSIDE, PLAN)
    assert sorted(s.name for s in order) == sorted(s.name for s in PLAN)
    measured = [s.name for s in order if times.get(s.name) is not None]
    assert [s.name for s in order] == measured + [s.name for s in PLAN if s.name not in measured]
    # What the loader tries next when the first one is skipped (shape limits, failed import) is what the
    # decision picks among the rest: the same answer from both paths, whichever specs drop out.
    for k in range(len(measured)):
        rest = [s.name for s in PLAN if s.name not in measured[:k]]
        picked, _ = t.choose("cpu", "fp8_mqa_logits", INSIDE, rest)
        assert picked == measured[k], (k, rest)
        d = decide(SPECS, [], Settings(disabled=frozenset(measured[:k])), arch="cpu", op="fp8_mqa_logits",
                   problem=INSIDE, tuning=t.choose)
        assert d.chosen == measured[k]


def test_order_puts_the_pick_first_then_picks_among_the_rest():
    t = tuning({"high": 1.03, "mid": 1.02, "low": 1.0})
    assert [s.name for s in t.order("cpu", "fp8_mqa_logits", INSIDE, PLAN)] == ["high", "mid", "low"]
    t = tuning({"high": 1.1, "low": 1.0})
    assert [s.name for s in t.order("cpu", "fp8_mqa_logits", INSIDE, PLAN)] == ["low", "high", "mid"]
    assert tuning({"high": 1.0}).order("cpu", "fp8_mqa_logits", Problem(3, 5, 32, 128), PLAN) == PLAN


def test_decide_falls_back_to_priority_outside_the_table_and_obeys_mqa_provider():
    hook = table_hook({"low": 1.0})
    outside = decide(SPECS, [], Settings(), arch="cpu", op="fp8_mqa_logits", problem=Problem(3, 5, 32, 128),
                     tuning=hook)
    assert outside.chosen == "high" and "t.json has no entry for bucket" in outside.why
    none_usable = decide(SPECS, [], Settings(disabled=frozenset({"low"})), arch="cpu", op="fp8_mqa_logits",
                         problem=Problem(300, 1500, 32, 128), tuning=hook)
    assert none_usable.chosen == "high" and "measured none of the usable providers" in none_usable.why
    named = decide(SPECS, [], Settings(preference=("mid",)), arch="cpu", op="fp8_mqa_logits",
                   problem=Problem(300, 1500, 32, 128), tuning=hook)
    assert named.chosen == "mid"
    no_shape = decide(SPECS, [], Settings(), arch="cpu", op="fp8_mqa_logits", tuning=hook)
    assert no_shape.chosen == "high" and "t.json" not in no_shape.why
    stale = decide(SPECS, [], Settings(), arch="cpu", op="fp8_mqa_logits", problem=Problem(300, 1500, 32, 128),
                   tuning=table_hook({"low": 1.0}, matches=False))
    assert stale.chosen == "high" and stale.why.endswith("ties break by name")


# -- through the registry, with the real CPU providers ---------------------------------------------

def test_mqa_tuning_drives_get_provider_explain_and_the_op(tmp_path):
    path = write(tmp_path / "t.json", [entry(torch_ref=2.0, example_chunked=1.0)])
    inside, outside = Problem(300, 1500, 32, 128), Problem(30, 1500, 32, 128)
    with environment(MQA_TUNING=path):
        d = mqa_core.explain("cpu", problem=inside)
        assert d.chosen == "example_chunked"
        assert path in d.why and "example_chunked 1 ms, torch_ref 2 ms" in d.why
        assert mqa_core.get_provider("cpu", problem=inside).name == "example_chunked"
        assert mqa_core.get_provider("cpu", problem=outside).name == "torch_ref"
        assert mqa_core.get_provider("cpu").name == "torch_ref"  # no shape, no bucket
        x = mqa_core.testing.make_inputs(inside, seed=0)
        out = mqa_core.fp8_mqa_logits(*x.args())
        assert mqa_core.testing.calc_diff(out, x.reference()) < 1e-9
    with environment(MQA_TUNING=path, MQA_PROVIDER="torch_ref"):
        assert mqa_core.get_provider("cpu", problem=inside).name == "torch_ref"
    with environment(MQA_TUNING=path, MQA_DISABLE_PROVIDERS="example_chunked"):
        assert mqa_core.get_provider("cpu", problem=inside).name == "torch_ref"


def test_the_margin_holds_through_the_registry_for_get_provider_and_explain(tmp_path):
    within = write(tmp_path / "within.json", [entry(torch_ref=1.04, example_chunked=1.0)])
    zero = write(tmp_path / "zero.json", [entry(torch_ref=1.04, example_chunked=1.0)], margin=0)
    for path, expect in ((within, "torch_ref"), (zero, "example_chunked")):
        with environment(MQA_TUNING=path):
            d = mqa_core.explain("cpu", problem=INSIDE)
            assert d.chosen == mqa_core.get_provider("cpu", problem=INSIDE).name == expect
            assert path in d.why and BUCKET in d.why and "example_chunked 1 ms, torch_ref 1.04 ms" in d.why
    with environment(MQA_TUNING=within):
        assert "torch_ref (priority) kept: example_chunked's lead 4.0% is within the table's 5% margin" \
            in mqa_core.explain("cpu", problem=INSIDE).why


def test_a_stale_stamp_is_ignored_with_one_warning_naming_the_file(tmp_path):
    stamp = here()
    stale = Stamp(stamp.device_name, "cpu", None, {**stamp.versions, "mqa-provider-torch-ref": "0.0.1"},
                  stamp.providers)
    path = write(tmp_path / "stale.json", [entry(torch_ref=2.0, example_chunked=1.0)], stamp=stale)
    inside = Problem(300, 1500, 32, 128)
    with environment(MQA_TUNING=path), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert mqa_core.get_provider("cpu", problem=inside).name == "torch_ref"
        d = mqa_core.explain("cpu", problem=inside)
    assert d.chosen == "torch_ref" and path not in d.why
    mine = [w for w in caught if "tuning table" in str(w.message)]
    assert len(mine) == 1
    installed = md.version("mqa-provider-torch-ref")
    assert str(mine[0].message).startswith(f"mqa_core: tuning table {path} (MQA_TUNING) does not match this "
                                           f"environment (mqa-provider-torch-ref {installed} here vs 0.0.1 in "
                                           "the table)")


def test_a_table_for_another_arch_is_not_consulted(tmp_path):
    stamp = here()
    gpu = Stamp("NVIDIA H200", "sm_90", "9.0", stamp.versions, stamp.providers)
    path = write(tmp_path / "gpu.json", [entry(torch_ref=2.0, example_chunked=1.0)], stamp=gpu)
    with environment(MQA_TUNING=path), warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU request never looks at an sm_90 table: no warning either
        assert mqa_core.get_provider("cpu", problem=Problem(300, 1500, 32, 128)).name == "torch_ref"


def test_a_bad_file_fails_loudly_naming_the_variable(tmp_path):
    with environment(MQA_TUNING=str(tmp_path / "missing.json")):
        with pytest.raises(ValueError, match=r"MQA_TUNING=.*missing.json: cannot read tuning table"):
            mqa_core.get_provider("cpu")


def test_the_hot_path_lookup_is_one_dict_get(tmp_path, monkeypatch):
    path = write(tmp_path / "t.json", [entry(torch_ref=2.0, example_chunked=1.0)])
    table = load_tuning(path)
    calls = []

    class Spy(dict):
        def get(self, key, default=None):
            calls.append(key)
            return dict.get(self, key, default)

    object.__setattr__(table, "_index", Spy(table._index))
    assert table.lookup("fp8_mqa_logits", Problem(300, 1500, 32, 128)).ranking[0] == "example_chunked"
    assert calls == [("fp8_mqa_logits", 32, 128, 18, 22, 0)]  # cells [256, 384) and [1024, 1536)


# -- pathological files (issue 37): each a SettingsError, exit 2 from the CLI, never a hang ---------

def _mqa_providers_with_tuning(path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MQA_TUNING": path}
    return subprocess.run([sys.executable, "-m", "mqa_core.cli.main", "providers", "--arch", "cpu"],
                          capture_output=True, text=True, env=env, timeout=60)


def _fifo(tmp_path):
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return str(path)


def _deep(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    return str(path)


def _huge(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_TABLE_BYTES + 1)  # sparse: no disk used
    return str(path)


@pytest.mark.parametrize("make, says", [
    (_deep, "JSON nested deeper than 32 levels"),
    (lambda tmp_path: "/dev/zero", "not a regular file"),
    (_fifo, "not a regular file"),
    (lambda tmp_path: str(tmp_path), "not a regular file"),
    (_huge, f"more than a table's limit of {MAX_TABLE_BYTES}"),
], ids=["deep JSON", "/dev/zero", "FIFO", "directory", "over the size cap"])
def test_pathological_tables_are_a_settings_error(tmp_path, make, says):
    path = make(tmp_path)
    with environment(MQA_TUNING=path):
        with pytest.raises(mqa_core.SettingsError, match=f"MQA_TUNING={path}: cannot read tuning table .*{says}"):
            mqa_core.get_provider("cpu")
    r = _mqa_providers_with_tuning(path)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r
    assert r.stderr.startswith(f"mqa: error: MQA_TUNING={path}: cannot read tuning table") and says in r.stderr
