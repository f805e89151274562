"""The indexer step on the H200: what engines run today against mqa-core's top-k ops, one process.

    python bench/h200_indexer.py [--out DIR] [--budget SECONDS] [--fi DIR] [--only NAME,...] [--smoke]

Per shape, on the same inputs, every column is checked, then timed, with its peak memory:

- ``DG+torch.topk``: DeepGEMM's logits (``clean_logits=True``), then ``torch.topk`` (unsorted): the
  pipeline of an engine without its own top-k. ``import deep_gemm`` failing only empties the column.
- ``composed``: ``fp8_*_topk`` through the core's composed provider (the best logits kernel, then the
  best ``topk_per_row``, in row chunks within MQA_WORKSPACE_MB).
- ``fused``: prefill: the ``triton`` provider's fused kernel, which never writes the [M, N] matrix;
  decode: the ``gluon`` provider's paged logits then the Triton radix select (no host sync).
- ``gluon`` (prefill): the ``gluon`` provider's own top-k op as shipped (``GLUON_PREFILL_TOPK =
  "auto"``): the two-stage path (Gluon logits in row chunks, then the Triton radix select) where a
  chunk holds at least ``SLICED_BELOW_ROWS`` rows, the sliced path (below) where it holds fewer.
- ``two-stage gluon`` (prefill): the two-stage path forced, whatever the shape.
- ``fused gluon`` (prefill): the fused orchestration scored by the Gluon kernels (``scorer="gluon"``:
  the Gluon logits kernel for the sample, its candidate epilogue for the filter); not used by the
  provider (its epilogue doubles the logits kernel's time).
- ``sliced gluon`` (prefill): the same orchestration with ``filter="slices"``: the Gluon logits
  kernel over key slices that fit the workspace, each slice's candidates appended by a one-warp
  streaming kernel; the selection runs once per row chunk over candidates, not over every logit.
- ``logits+FI``: mqa-core's logits (gluon), then FlashInfer's ``top_k_ragged_transform`` with
  ``deterministic=True, tie_break=1`` (smaller index wins) and ``row_starts``: the same selection rule
  over the same scores. Needs ``--fi DIR`` (the unpacked archive of
  ../shared/tools/flashinfer-topk-archive.sh); otherwise the column says why.

Checked: each column's selection against the dense gluon logits of the same call (every selected
logit >= every unselected in-window logit, within 1e-5 of the row's largest magnitude), and the
mqa-core columns also exactly (same positions) against each other where their logits kernels agree.
Timed: prefill by CUDA events around whole calls (the fused path syncs once per row chunk), median of
``--reps``; decode by CUDA-graph replay (``mqa_core.bench.timing.graph_time``). ``x DG`` is the
DeepGEMM column's time over the column's (> 1: faster). Peak: ``torch.cuda.max_memory_allocated``
during one call, beyond the inputs and the call's output (MiB). Inputs: ``rand`` (random fp8, the
untrained case) and ``peak`` (a few dominant keys and a recency ramp in k_scale, as trained indexers
give). Prints one JSON line per row as it goes and a short table last; ``--out`` keeps both.
``--smoke`` runs every column that can run on the CPU at tiny sizes (torch_ref, composed).

``--skip`` leaves columns out (comma-separated names). ``--select`` times the selection alone, on
each shape's dense logits (``rand`` inputs): ``torch.topk``, FlashInfer, and the Triton radix select
under each ``--variants`` launch config (``TopkConfig`` fields, ``+``-joined, e.g.
``separate=1+filter_block=2048``; ``default`` is the shipped one). Every variant must give the
default's positions bit for bit. ``--profile`` prints the CUDA kernels of one call per shape
(torch.profiler; ``--column``, default ``composed``), to see where its time goes: the kernels by
total time, the GPU's idle gaps between kernels (traced without CPU ops, which slow the host), the
host's time by function, the host syncs by the project line that made them, and, for the fused
paths, their own counts (chunks, rows sampled, tied, rescored, peak). ``--memory gluon,triton``
shows where each named provider's top-k ops put their peak at the kit's memory-case shapes (prefill
M=512 N=131072 causal, paged B=64 next_n=2 ctx 32768; H=16, D=64, topk 2048 with values, a 16 MiB
workspace): the call once to warm up, then once under ``torch.cuda.memory._record_memory_history``,
replayed to the peak; the allocations alive there, by the line of this checkout that made them.
``--tuning slice_block=128`` runs everything under those ``mqa_topk_triton.Tuning`` launch knobs (an
A/B of a knob is two runs, or two ``--profile`` runs, on one machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # prefill | packed | decode
    m: int  # prefill rows, or decode batch
    n: int  # keys, or context length
    topk: int
    next_n: int = 1
    h: int = 64
    d: int = 128


SHAPES = (
    Shape("prefill 4k x 128k", "prefill", 4096, 131072, 2048),
    Shape("prefill 4k x 128k k512", "prefill", 4096, 131072, 512),
    Shape("prefill 1k x 1M", "prefill", 1024, 1 << 20, 2048),
    Shape("packed 8 x 2k", "packed", 8, 2048, 2048),
    Shape("decode B64 64k n1", "decode", 64, 65536, 2048, 1),
    Shape("decode B64 64k n2", "decode", 64, 65536, 2048, 2),
    Shape("decode B64 64k k512", "decode", 64, 65536, 512, 1),
    Shape("decode B1 128k", "decode", 1, 131072, 2048, 1),
    Shape("decode B8 128k", "decode", 8, 131072, 2048, 1),
)
#: ``--select`` only: the row chunks the composed path hands the selection at the default workspace
#: (256 rows of 128k keys, 32 of 1M), where a chunk's few rows must fill the GPU.
CHUNKS = (
    Shape("chunk 256 x 128k", "prefill", 256, 131072, 2048),
    Shape("chunk 32 x 1M", "prefill", 32, 1 << 20, 2048),
)
SMOKE = (
    Shape("prefill 40 x 600", "prefill", 40, 600, 64, h=16, d=64),
    Shape("packed 3 x 50", "packed", 3, 50, 64, h=16, d=64),
    Shape("decode B3 300", "decode", 3, 300, 32, 2, h=16, d=64),
)
KINDS = ("rand", "peak")


def prefill_inputs(s: Shape, kind: str, device: torch.device) -> tuple[Any, ...]:
    """(q, (k, k_scale), w, ks, ke): the last M of N tokens each seeing its prefix; ``packed``: m
    requests of n tokens each, causal inside each."""
    g = torch.Generator(device=device).manual_seed(1)
    rows, keys = (s.m * s.n, s.m * s.n) if s.kind == "packed" else (s.m, s.n)
    q = (torch.randn(rows, s.h, s.d, device=device, generator=g) * 1.5).to(torch.float8_e4m3fn)
    k = (torch.randn(keys, s.d, device=device, generator=g) * 1.5).to(torch.float8_e4m3fn)
    scale = torch.rand(keys, device=device, generator=g) * 0.9 + 0.1
    if kind == "peak":
        scale = scale * torch.exp(torch.randn(keys, device=device, generator=g) * 1.5)
        scale = scale * (1 + 3 * torch.arange(keys, device=device) / keys)
    w = torch.randn(rows, s.h, device=device, generator=g) * s.h ** -0.5
    r = torch.arange(rows, device=device)
    if s.kind == "packed":
        ks = (r // s.n) * s.n
        ke = r + 1
    else:
        ks = torch.zeros_like(r)
        ke = r + (s.n - s.m) + 1
    return q, (k, scale.float()), w.float(), ks.int(), ke.int()


def decode_inputs(s: Shape, kind: str, device: torch.device) -> tuple[Any, ...]:
    """(q, kv_cache, w, context_lens, block_tables, max_context_len): every sequence at n tokens."""
    from mqa_core.testing import make_paged_inputs

    lens = torch.full((s.m,), s.n, dtype=torch.int32)
    x = make_paged_inputs(s.m, s.next_n, s.h, s.d, s.n, device=device, seed=1, context_lens=lens)
    q, cache, w, lens, tables, n = x.args()
    if kind == "peak":  # dominant keys: scale a few cache scales up (the last 4 bytes of each token row)
        scales = cache[..., s.d:].view(torch.float32)
        g = torch.Generator(device=device).manual_seed(2)
        scales.mul_(torch.exp(torch.randn(scales.shape, device=device, generator=g) * 1.5))
    return q, cache, w, lens, tables, n


# -- columns ------------------------------------------------------------------------------------------

def deepgemm() -> tuple[Any, str]:
    try:
        import deep_gemm
    except Exception as exc:  # noqa: BLE001 - any import failure empties the column, with its reason
        return None, f"import deep_gemm failed: {type(exc).__name__}: {exc}"
    return deep_gemm, ""


def flashinfer(path: str | None) -> tuple[Any, str]:
    if not path:
        return None, "no --fi DIR (../shared/tools/flashinfer-topk-archive.sh, unpacked)"
    sys.path.insert(0, path)
    try:
        import flashinfer.topk as fi
    except Exception as exc:  # noqa: BLE001
        return None, f"import flashinfer.topk failed: {type(exc).__name__}: {exc}"
    return fi, ""


def top(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """``torch.topk`` as an engine uses it: unsorted, -1 where it had to take a -inf (outside the
    window) because the window is shorter than topk."""
    got = torch.topk(logits, min(topk, logits.shape[1]), dim=1, sorted=False)
    return got.indices.masked_fill(got.values == float("-inf"), -1).int()


def columns(s: Shape, x: tuple[Any, ...], dg: Any, fi: Any, smoke: bool) -> dict[str, Callable[[], Any]]:
    """Column name -> a call returning int32 positions [rows, topk] (absolute for prefill)."""
    import mqa_core
    from mqa_core.composed import KERNELS, composed_spec
    from mqa_core.provider import Provider
    from mqa_core.testing.providers import provider_named

    arch = mqa_core.detect_arch()
    composed = Provider(composed_spec(), KERNELS)
    own = "torch_ref" if smoke else "gluon"
    cols: dict[str, Callable[[], Any]] = {}
    if s.kind != "decode":
        q, kv, w, ks, ke = x
        logits_p = provider_named(own, arch, op="fp8_mqa_logits")
        fused = provider_named("torch_ref" if smoke else "triton", arch, op="fp8_mqa_topk")  # the fused kernel
        two = provider_named(own, arch, op="fp8_mqa_topk")
        if dg is not None:
            cols["DG+torch.topk"] = lambda: top(dg.fp8_mqa_logits(q, kv, w, ks, ke, True), s.topk)
        cols["composed"] = lambda: composed.fp8_mqa_topk(q, kv, w, ks, ke, s.topk, positions="absolute")
        cols["fused"] = lambda: fused.fp8_mqa_topk(q, kv, w, ks, ke, s.topk, positions="absolute")
        cols["gluon"] = lambda: two.fp8_mqa_topk(q, kv, w, ks, ke, s.topk, positions="absolute")
        if not smoke:  # the fused orchestration scored by the Gluon kernels (sample logits, filter epilogue)
            from mqa_provider_gluon.kernels import GLUON
            from mqa_provider_gluon.ops.mqa_topk_triton import fp8_mqa_topk_triton

            cols["two-stage gluon"] = lambda: GLUON._two_stage_prefill(q, kv, w, ks, ke, s.topk, "absolute", False,
                                                                       256 << 20)[0]
            cols["fused gluon"] = lambda: fp8_mqa_topk_triton(q, kv[0], kv[1], w, ks, ke, s.topk, positions="absolute",
                                                              select=GLUON._select, scorer="gluon")[0]
            cols["sliced gluon"] = lambda: fp8_mqa_topk_triton(q, kv[0], kv[1], w, ks, ke, s.topk,
                                                               positions="absolute", select=GLUON._select,
                                                               scorer="gluon", filter="slices")[0]
        if fi is not None:
            lengths = (ke - ks).clamp(min=0).int()
            cols["logits+FI"] = lambda: fi.top_k_ragged_transform(
                logits_p.fp8_mqa_logits(q, kv, w, ks, ke), ks, lengths, s.topk, deterministic=True,
                tie_break=1, row_starts=ks)
    else:
        q, cache, w, lens, tables, n = x
        logits_p = provider_named(own, arch, op="fp8_paged_mqa_logits")
        fused = provider_named(own, arch, op="fp8_paged_mqa_topk")
        sched = mqa_core.paged_schedule(lens) if q.is_cuda else None
        if dg is not None:  # DeepGEMM's paged path takes 2-D lengths, and then writes no -inf itself
            from mqa_core.reference import visible_lengths

            vis2d = visible_lengths(lens, s.next_n).view(-1, s.next_n).int()
            meta = dg.get_paged_mqa_logits_metadata(vis2d, 64, dg.get_num_sms())
            past = torch.arange(n, device=q.device)[None, :] >= vis2d.view(-1, 1)
            cols["DG+torch.topk"] = lambda: top(dg.fp8_paged_mqa_logits(q, cache, w, vis2d, tables, meta, n, False)
                                                .masked_fill_(past, float("-inf")), s.topk)
        cols["composed"] = lambda: composed.fp8_paged_mqa_topk(q, cache, w, lens, tables, n, s.topk, schedule=sched)
        cols["fused"] = lambda: fused.fp8_paged_mqa_topk(q, cache, w, lens, tables, n, s.topk, schedule=sched)
        if fi is not None:
            from mqa_core.reference import visible_lengths

            vis = visible_lengths(lens, s.next_n).clamp(0, n).int()
            zeros = torch.zeros_like(vis)
            cols["logits+FI"] = lambda: fi.top_k_ragged_transform(
                logits_p.fp8_paged_mqa_logits(q, cache, w, lens, tables, n, schedule=sched), zeros, vis, s.topk,
                deterministic=True, tie_break=1, row_starts=zeros, dsa_graph_safe=True)
    return cols


# -- checking -----------------------------------------------------------------------------------------

def judge(idx: torch.Tensor, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int) -> str:
    """'ok', or how many rows break the selection rule on ``logits`` (fp32, -inf outside windows);
    ``mqa bench --topk``'s check (``mqa_core.bench.verify.check_selection``)."""
    from mqa_core.bench.verify import check_selection

    v = check_selection(idx.int(), logits, ks, ke, topk, against="gluon logits")
    return "ok" if v.ok else f"FAIL {v.detail}"


def dense_logits(s: Shape, x: tuple[Any, ...], smoke: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The judge's logits (the gluon provider's, or torch_ref's on the CPU) and the windows."""
    import mqa_core
    from mqa_core.composed import paged_windows
    from mqa_core.testing.providers import provider_named

    own = provider_named("torch_ref" if smoke else "gluon", mqa_core.detect_arch(),
                         op="fp8_mqa_logits" if s.kind != "decode" else "fp8_paged_mqa_logits")
    if s.kind != "decode":
        q, kv, w, ks, ke = x
        return own.fp8_mqa_logits(q, kv, w, ks, ke), ks, ke
    q, cache, w, lens, tables, n = x
    ke = paged_windows(lens, s.next_n, tables, cache.shape[1], n)
    return own.fp8_paged_mqa_logits(q, cache, w, lens, tables, n), torch.zeros_like(ke), ke


# -- timing -------------------------------------------------------------------------------------------

def peak_mib(call: Callable[[], Any], device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base - out.numel() * out.element_size()
    return round(peak / 2**20, 1)


def event_ms(call: Callable[[], Any], device: torch.device, reps: int) -> float:
    if device.type != "cuda":
        t = time.perf_counter()
        call()
        return (time.perf_counter() - t) * 1e3
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return statistics.median(samples)


def replay_ms(call: Callable[[], Any], device: torch.device) -> tuple[float | None, str]:
    from mqa_core.bench.timing import graph_time

    got, why = graph_time(lambda _: call(), [None], device, replays=10, min_calls=8)
    return (statistics.median(got.samples) if got else None), why


# -- main ---------------------------------------------------------------------------------------------

def run_shape(s: Shape, kind: str, dg: Any, fi: Any, device: torch.device, reps: int, smoke: bool,
              skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    x = (prefill_inputs if s.kind != "decode" else decode_inputs)(s, kind, device)
    row: dict[str, Any] = {"shape": s.name, "inputs": kind, "topk": s.topk}
    logits, ks, ke = dense_logits(s, x, smoke)
    row["logits_MiB"] = round(logits.numel() * 4 / 2**20, 1)
    picks: dict[str, torch.Tensor] = {}
    for name, call in columns(s, x, dg, fi, smoke).items():
        if name in skip:
            continue
        try:
            idx = call()
            picks[name] = idx
            row[f"{name} check"] = judge(idx, logits, ks, ke, s.topk)
        except Exception as exc:  # noqa: BLE001 - a column that fails says why, the others run
            row[f"{name} check"] = f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
            continue
        row[f"{name} peak"] = peak_mib(call, device)
        if s.kind == "decode" and device.type == "cuda":
            ms, why = replay_ms(call, device)
            row[f"{name} ms"] = None if ms is None else round(ms, 4)
            if why:
                row[f"{name} why"] = why
        else:
            call()  # warm (compiles, caches)
            row[f"{name} ms"] = round(event_ms(call, device, reps), 4)
    del logits
    if "composed" in picks and "fused" in picks:
        row["composed==fused"] = bool(torch.equal(picks["composed"], picks["fused"]))
    for name in ("two-stage gluon", "fused gluon", "sliced gluon"):
        if "gluon" in picks and name in picks:
            row[f"gluon=={name}"] = bool(torch.equal(picks["gluon"], picks[name]))
    base = row.get("DG+torch.topk ms")
    for name in (*OURS, "logits+FI"):
        if base and row.get(f"{name} ms"):
            row[f"{name} x DG"] = round(base / row[f"{name} ms"], 2)
    ours = {c: row[f"{c} ms"] for c in OURS
            if row.get(f"{c} ms") and row.get(f"{c} check") == "ok"}
    if ours:
        best = min(ours, key=ours.get)  # type: ignore[arg-type]
        row["best"] = best
        for other, label in (("DG+torch.topk", "best x DG"), ("logits+FI", "best x FI")):
            if row.get(f"{other} ms"):
                row[label] = round(row[f"{other} ms"] / ours[best], 2)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    cols = ("DG+torch.topk", *OURS, "logits+FI")
    head = f"{'shape':24} {'in':4} " + " ".join(f"{c + ' ms':>17}" for c in cols) + \
        f" {'best':>11} {'x DG':>5} {'x FI':>5} " + " ".join(f"{c[:9] + ' MiB':>13}" for c in cols) + "  checks"
    lines = [head]
    for r in rows:
        ms = " ".join(f"{r.get(c + ' ms') if r.get(c + ' ms') is not None else '-':>17}" for c in cols)
        mem = " ".join(f"{r.get(c + ' peak') if r.get(c + ' peak') is not None else '-':>13}" for c in cols)
        checks = ",".join(f"{c}:{r[c + ' check']}" for c in cols if c + " check" in r and r[c + " check"] != "ok")
        lines.append(f"{r['shape']:24} {r['inputs']:4} {ms} {r.get('best', '-'):>11} {r.get('best x DG', '-'):>5} "
                     f"{r.get('best x FI', '-'):>5} {mem}  {checks or 'all ok'}")
    return "\n".join(lines)


#: mqa-core's columns (the best of them is the row's ``best``).
OURS = ("composed", "fused", "gluon", "two-stage gluon", "fused gluon", "sliced gluon")
VARIANTS = "default,ahead=1,filter_block=4096,separate=1,block=1024+num_warps=4,split_target=1024"


def topk_config(spec: str) -> Any:
    """``"default"`` or ``"field=value+field=value"`` -> a TopkConfig (ints; 0/1 for the bools)."""
    from mqa_provider_gluon.ops.topk_triton import TopkConfig

    if spec == "default":
        return TopkConfig()
    kw = dict(kv.split("=") for kv in spec.split("+"))
    return TopkConfig(**{k: (bool(int(v)) if k == "separate" else int(v)) for k, v in kw.items()})


def select_row(s: Shape, variants: list[str], fi: Any, device: torch.device, reps: int,
               smoke: bool) -> dict[str, Any]:
    """The selection alone on one shape's dense logits: torch.topk, FlashInfer, each variant."""
    import functools

    from mqa_provider_gluon.ops.topk_triton import topk_per_row_triton

    x = (prefill_inputs if s.kind != "decode" else decode_inputs)(s, "rand", device)
    logits, ks, ke = dense_logits(s, x, smoke)
    ks, ke = ks.int(), ke.int()
    calls: dict[str, Callable[[], Any]] = {"torch.topk": functools.partial(top, logits, s.topk)}
    if fi is not None:
        calls["FI"] = functools.partial(fi.top_k_ragged_transform, logits, ks, (ke - ks).clamp(min=0).int(), s.topk,
                                        deterministic=True, tie_break=1, row_starts=ks,
                                        dsa_graph_safe=s.kind == "decode")
    for v in variants:
        calls[v] = functools.partial(topk_per_row_triton, logits, ks, ke, s.topk, positions="absolute",
                                     config=topk_config(v))
    row: dict[str, Any] = {"shape": s.name}
    want = None
    for name, call in calls.items():
        got = call()
        if name in variants:
            want = got if want is None else want
            row[f"{name} same"] = bool(torch.equal(got, want))
        if s.kind == "decode" and device.type == "cuda":
            ms, _ = replay_ms(call, device)
        else:
            call()
            ms = event_ms(call, device, reps)
        row[f"{name} ms"] = None if ms is None else round(ms, 4)
    print(json.dumps(row), flush=True)
    return row


def select_table(rows: list[dict[str, Any]], variants: list[str]) -> str:
    names = ["torch.topk", "FI", *variants]
    lines = [f"{'select ms':24} " + " ".join(f"{n[:22]:>22}" for n in names)]
    for r in rows:
        cells = []
        for n in names:
            ms = r.get(f"{n} ms")
            mark = "" if r.get(f"{n} same", True) else " DIFF"
            cells.append(f"{('-' if ms is None else ms)!s:>17}{mark:>5}")
        lines.append(f"{r['shape']:24} " + " ".join(cells))
    return "\n".join(lines)


def gaps(call: Callable[[], Any]) -> None:
    """Where the GPU sat idle inside one call, traced with kernel activity only (no CPU op
    tracing, which slows the host and makes any call look host-bound): idle time between
    consecutive kernels, summed, and the longest gaps with the kernels around them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if not ks:
        print("  gaps: no kernels traced")
        return
    holes = [(ks[i].time_range.start - ks[i - 1].time_range.end, ks[i - 1].name[:40], ks[i].name[:40], i)
             for i in range(1, len(ks))]
    idle = sum(max(0, h[0]) for h in holes) / 1e3
    span = (ks[-1].time_range.end - ks[0].time_range.start) / 1e3
    print(f"  gaps (kernel tracing only): wall {wall:.2f} ms, first kernel to last {span:.2f} ms, idle between "
          f"kernels {idle:.2f} ms over {len(ks)} kernels")
    for h in sorted(holes, reverse=True)[:8]:
        print(f"    {h[0] / 1e3:7.3f} ms before kernel {h[3]:4d}: {h[1]} -> {h[2]}")


def syncs(call: Callable[[], Any]) -> None:
    """Where one call makes the host wait for the GPU: torch's sync debug mode warns at every
    synchronizing op; they are counted by the innermost line of the project that made them. Each is
    a point where the GPU runs dry until the host enqueues again."""
    import collections
    import traceback
    import warnings

    sites: collections.Counter[str] = collections.Counter()

    def note(*_: Any, **__: Any) -> None:
        frames = [f for f in traceback.extract_stack()[:-1] if "/providers/" in f.filename
                  or "/mqa_core/" in f.filename]
        sites[f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} {frames[-1].line}"
              if frames else "outside the project"] += 1

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # restores showwarning and the filters
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    print(f"  syncs: {sum(sites.values())}")
    for where, k in sites.most_common(12):
        print(f"    {k:4d}x {where[:150]}")


def profile(s: Shape, dg: Any, fi: Any, device: torch.device, smoke: bool, workspaces: list[float],
            column: str = "composed") -> None:
    """One call of ``column`` (default ``composed``) under torch.profiler: its wall time against the
    time kernels ran (idle GPU between kernels is host work the GPU waited for), and its kernels by
    total time; then the composed call's time at each ``--workspace`` bound (MiB), to see what the
    row chunks cost."""
    x = (prefill_inputs if s.kind != "decode" else decode_inputs)(s, "rand", device)
    call = columns(s, x, None, None, smoke)[column]
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3 if kernels else 0
    print(f"profile: {column} {s.name}: wall {wall:.2f} ms, first kernel to last {span:.2f} ms, kernels busy "
          f"{busy:.2f} ms, {len(kernels)} kernels")
    by: dict[str, list[float]] = {}
    for e in kernels:
        by.setdefault(e.name[:60], []).append(e.time_range.elapsed_us() / 1e3)
    for name, ts in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(f"  {sum(ts):8.3f} ms {len(ts):4d}x  median {statistics.median(ts):.3f}  {name}")
    gaps(call)
    import cProfile
    import io
    import pstats

    host = cProfile.Profile()
    host.enable()
    call()
    host.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(14)
    print("  host, by own time:\n" + "\n".join("    " + ln for ln in text.getvalue().splitlines()
                                                if ln.strip() and ("/" in ln or "{" in ln) or "ncalls" in ln))
    syncs(call)
    from mqa_provider_gluon.ops import mqa_topk_triton as mt

    seen: list[dict[str, Any]] = []
    with mt.tuning(report=lambda ws, ctx: seen.append({**ctx, "peak MiB": round(ws.peak / 2**20, 1)})):
        call()
    torch.cuda.synchronize()
    for ctx in seen:  # the fused paths' own counts: rows the sample misjudged cost a rescoring pass
        print("  path: " + ", ".join(f"{k}={v}" for k, v in ctx.items() if k != "plan") + f"; plan {ctx.get('plan')}")
    from mqa_core.composed import KERNELS, composed_spec
    from mqa_core.provider import Provider

    p = Provider(composed_spec(), KERNELS)
    for mib in workspaces:
        wb = int(mib * 2**20)
        if s.kind == "decode":
            q, cache, w, lens, tables, n = x
            one = lambda: p.fp8_paged_mqa_topk(q, cache, w, lens, tables, n, s.topk, workspace_bytes=wb)  # noqa: E731
        else:
            q, kv, w, ks, ke = x
            one = lambda: p.fp8_mqa_topk(q, kv, w, ks, ke, s.topk, positions="absolute",  # noqa: E731
                                         workspace_bytes=wb)
        try:
            one()
            print(f"  workspace {mib:6.0f} MiB: {event_ms(one, device, 5):8.3f} ms, peak {peak_mib(one, device)} MiB",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - a bound too small for the shape says so
            print(f"  workspace {mib:6.0f} MiB: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        torch.cuda.empty_cache()


def _keys_int(x: torch.Tensor) -> torch.Tensor:
    """The select kernel's order-preserving keys (``topk_triton._keys``) as int64 in [0, 2**32)."""
    x = torch.where(x == 0, torch.zeros_like(x), x.float())
    b = x.view(torch.int32).long()
    k = torch.where(b < 0, ~b & 0xFFFFFFFF, b | 0x80000000)
    return torch.where(torch.isnan(x), torch.zeros_like(k), k)


def guess_model(window: torch.Tensor, aim: int, sample: int) -> int:
    """``topk_triton._guess`` in torch: the 24-bit key prefix the kernel should derive for one window
    (``aim``, ``sample``: the plan's; tests/gluon/test_topk_triton.py holds it to the kernel's counts)."""
    w = window.numel()
    g = sample // 8
    o = torch.arange(sample, device=window.device)
    at = ((o // 8) * (w - 8)) // (g - 1) + o % 8
    sk = _keys_int(window[at])
    r = min(max(aim * sample // w, 1), sample)
    keep = torch.ones_like(sk, dtype=torch.bool)
    prefix = 0
    for shift in (24, 16, 8):
        hist = torch.bincount(((sk >> shift) & 0xFF)[keep], minlength=256)
        ge = hist.flip(0).cumsum(0).flip(0)  # keys in this bin or above
        b = int((ge >= r).sum()) - 1
        r -= int(ge[b] - hist[b])
        prefix |= b << shift
        keep &= ((sk >> shift) & 0xFF) == b
    return prefix


def counts(s: Shape, device: torch.device, topks: tuple[int, ...] = (512, 1024, 2048)) -> None:
    """Why a selection is slow: per topk, the filter's candidate counts on the device (the separate
    filter kernel's, read from its workspace) against :func:`guess_model`'s on the same logits; rows
    outside [K, CAP] take the whole-window fallback. Then the select's time at each topk."""
    from mqa_provider_gluon.ops.topk_triton import TopkConfig, plan, topk_per_row_triton, workspace_bytes

    x = (prefill_inputs if s.kind != "decode" else decode_inputs)(s, "rand", device)
    logits, ks, ke = dense_logits(s, x, False)
    ks, ke = ks.int(), ke.int()
    m, n = logits.shape
    for k in topks:
        cfg = TopkConfig(separate=True)
        p = plan(m, n, k, cfg)
        ws = torch.empty(workspace_bytes(m, n, k, config=cfg), dtype=torch.uint8, device=device)
        topk_per_row_triton(logits, ks, ke, k, workspace=ws, config=cfg)
        got = ws[-m * p.split * 4:].view(torch.int32).view(m, p.split).sum(1).tolist() if p.split else []
        model = []
        for r in range(m) if p.split else ():
            lo, hi = max(int(ks[r]), 0), min(int(ke[r]), n)
            if hi - lo <= p.cap:
                model.append(0)
                continue
            t = guess_model(logits[r, lo:hi], p.aim, p.sample)
            model.append(int((_keys_int(logits[r, lo:hi]) >= t).sum()))
        kk = [min(k, max(min(int(b), n) - max(int(a), 0), 0)) for a, b in zip(ks.tolist(), ke.tolist())]
        out = [r for r, c in enumerate(got) if not kk[r] <= c <= p.cap and c]
        diff = [r for r, (a, b) in enumerate(zip(got, model)) if a != b]
        ms = replay_ms(lambda: topk_per_row_triton(logits, ks, ke, k), device)[0] if s.kind == "decode" else \
            event_ms(lambda: topk_per_row_triton(logits, ks, ke, k), device, 5)
        print(f"counts {s.name} topk {k}: cap {p.cap} sample {p.sample} split {p.split}; device counts "
              f"{min(got, default=0)}..{max(got, default=0)}, {len(out)} rows out of [K, CAP] {out[:8]}; model "
              f"{min(model, default=0)}..{max(model, default=0)}; {len(diff)} rows differ from the model "
              f"{[(r, got[r], model[r]) for r in diff[:4]]}; select {ms:.4f} ms", flush=True)


# ---- --memory: where a top-k op's peak goes ------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _memory_args(op: str, device: torch.device) -> tuple[Any, ...]:
    from mqa_core.spec import Problem
    from mqa_core.testing.data import make_inputs, make_paged_inputs

    if op == "fp8_mqa_topk":
        return make_inputs(Problem(512, 131072, 16, 64), device=device, window="causal", seed=1).args()
    return make_paged_inputs(64, 2, 16, 64, 32768, device=device, seed=1).args()


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame inside this checkout but outside this script, as ``file:line function``."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith(ROOT) and not name.endswith("h200_indexer.py"):
            return f"{os.path.relpath(name, ROOT)}:{f.get('line')} {f.get('name')}"
    return "(outside this checkout)"


def memory(provider_name: str, op: str, device: torch.device, workspace: int = 16 << 20, top: int = 10) -> None:
    from mqa_core.arch import arch_of_device
    from mqa_core.testing.providers import provider_named

    provider = provider_named(provider_name, arch_of_device(device), op=op)
    args = _memory_args(op, device)

    def call() -> Any:
        return getattr(provider, op)(*args, 2048, return_values=True, workspace_bytes=workspace)

    call()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    idx, vals = call()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    counted = torch.cuda.max_memory_allocated() - base - idx.untyped_storage().nbytes() \
        - vals.untyped_storage().nbytes()
    live: dict[int, tuple[int, str]] = {}
    now = best = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snap["device_traces"]:
        for e in trace:
            if e["action"] == "alloc":
                live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
                now += e["size"]
            elif e["action"] == "free_requested" and e["addr"] in live:
                now -= live.pop(e["addr"])[0]
            if now > best:
                best, at_peak = now, dict(live)
    by_line: dict[str, list[int]] = {}
    for size, where in at_peak.values():
        by_line.setdefault(where, []).append(size)
    print(f"memory: {provider_name} {op}, workspace {workspace / 2**20:g} MiB: peak extra (the kit's count) "
          f"{counted / 2**20:.2f} MiB; allocated by the call at its peak {best / 2**20:.2f} MiB (outputs in)")
    for where, sizes in sorted(by_line.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(sizes) / 2**20:8.2f} MiB  x{len(sizes):<3d} {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for rows.jsonl and table.txt")
    ap.add_argument("--budget", type=float, default=400, help="seconds; shapes left past it are skipped, and said")
    ap.add_argument("--fi", help="folder holding the unpacked FlashInfer top-k archive")
    ap.add_argument("--only", default="", help="comma-separated shape names (substrings) to run")
    ap.add_argument("--kinds", default=",".join(KINDS), help="input kinds: rand, peak")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip", default="", help="comma-separated columns not to run (e.g. 'fused gluon')")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (torch_ref)")
    ap.add_argument("--select", action="store_true", help="time the selection alone, under --variants")
    ap.add_argument("--variants", default=VARIANTS, help="comma-separated TopkConfig variants for --select")
    ap.add_argument("--profile", action="store_true", help="where one call a shape spends its time: kernels, "
                    "idle gaps, host time, host syncs by line")
    ap.add_argument("--column", default="composed", help="with --profile: the column to profile (composed, "
                    "fused, gluon, 'two-stage gluon', 'fused gluon', 'sliced gluon')")
    ap.add_argument("--workspace", default="", help="with --profile: comma-separated MQA_WORKSPACE_MB figures "
                    "to time the composed call at")
    ap.add_argument("--counts", action="store_true", help="the select's filter counts on the device against a "
                    "model of its threshold guess, and its time at topk 512/1024/2048 (rand inputs)")
    ap.add_argument("--memory", default="", help="comma-separated providers: where each one's top-k ops put "
                    "their peak memory (GPU)")
    ap.add_argument("--tuning", default="", help="launch knobs of the fused orchestration (the fused and "
                    "sliced columns) for the whole run: '+'-joined Tuning fields, e.g. 'slice_block=128' "
                    "(the slice filter's step before 2026-12-08), to A/B a knob in another run")
    args = ap.parse_args()
    from mqa_provider_gluon.ops import mqa_topk_triton as mt

    knobs = dict(kv.split("=", 1) for kv in args.tuning.split("+") if kv)
    bad = sorted(set(knobs) - {f.name for f in dataclasses.fields(mt.Tuning)})
    if bad:
        ap.error(f"--tuning: no Tuning field {', '.join(bad)}")
    with mt.tuning(**{k: int(v) for k, v in knobs.items()}):
        if knobs:
            print(f"tuning: {args.tuning}", flush=True)
        run(args)


def run(args: argparse.Namespace) -> None:
    """What ``main`` was asked for (under its ``--tuning``)."""
    smoke = args.smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    dg, why_dg = (None, "smoke run") if smoke else deepgemm()
    fi, why_fi = (None, "smoke run") if smoke else flashinfer(args.fi)
    print(f"DeepGEMM: {why_dg or dg.__file__}; FlashInfer: {why_fi or fi.__file__}", flush=True)
    if device.type == "cuda":
        import triton

        print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    wanted = [w for w in args.only.split(",") if w]
    pool = SMOKE if smoke else SHAPES + (CHUNKS if args.select else ())
    shapes = [s for s in pool if not wanted or any(w in s.name for w in wanted)]
    if args.memory and device.type == "cuda":
        for name in args.memory.split(","):
            for op in ("fp8_mqa_topk", "fp8_paged_mqa_topk"):
                memory(name, op, device)
        return
    if args.profile and device.type == "cuda":
        for s in shapes:
            profile(s, dg, fi, device, smoke, [float(w) for w in args.workspace.split(",") if w], args.column)
        return
    if args.counts and device.type == "cuda":
        for s in shapes:
            counts(s, device)
        return
    if args.select:
        variants = args.variants.split(",")
        text = select_table([select_row(s, variants, fi, device, args.reps, smoke) for s in shapes], variants)
        print(text)
        if args.out:
            with open(os.path.join(args.out, "select.txt"), "w") as f:
                f.write(text + "\n")
        return
    rows, t0 = [], time.perf_counter()
    out = open(os.path.join(args.out, "rows.jsonl"), "w") if args.out else None
    for s in shapes:
        for kind in args.kinds.split(","):
            if time.perf_counter() - t0 > args.budget:
                print(f"skipped {s.name} {kind}: past --budget {args.budget:.0f} s", flush=True)
                continue
            row = run_shape(s, kind, dg, fi, device, args.reps, smoke, frozenset(c for c in args.skip.split(",") if c))
            row["s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    text = table(rows)
    print(text)
    if args.out:
        with open(os.path.join(args.out, "table.txt"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
