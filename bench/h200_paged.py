"""The paged (decode) fp8 MQA-logits Triton kernel on one H200: correctness, then speed against torch_ref
and against the HBM bound, in one call (< 3 min).

    cd <repo> && PYTHONPATH=providers/gluon:providers/torch_ref python bench/h200_paged.py [--quick]

Correctness: against an fp32 PyTorch computation on the GPU written here (gather each sequence's keys
through its block table, upcast, matmul), calc_diff < 1e-3 on visible cells and the -inf mask
identical; on full contexts (the timed inputs) and on ragged ones (random lengths, 2-D lens, clean
and not). Speed: triton.testing median times, with Python launch overhead (``ms``) and replayed from a
CUDA graph (``graph_ms``, the kernel alone), over batch {1, 32, 128} x context {1k, 8k, 32k} x
next_n {1, 2} x H {32, 64}, D = 128, block_size = 64, every sequence at full context. Bytes counted:
each sequence's visible positions rounded up to whole blocks x (D + 4), read once, plus q, weights and
the output. GB/s uses graph_ms; % is of 4250 GB/s (H200 peak) and of a measured device copy. A short
config sweep at two large shapes follows. Largest shapes first; new shapes and configs stop being
started after fixed budgets, so the table (last) and the JSON ($OUT/h200_paged.json when $OUT is set)
always come out within 180 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
from mqa_provider_gluon.ops import paged_mqa_logits_triton as op
from mqa_provider_gluon.ops.paged_mqa_logits_triton import PagedConfig, default_config, fp8_paged_mqa_logits_triton
from mqa_provider_torch_ref.kernels import KERNELS as TORCH_REF
from triton.testing import do_bench, do_bench_cudagraph

from mqa_core.reference import split_paged_cache, visible_lengths
from mqa_core.testing import calc_diff

D, BLOCK = 128, 64
DEVICE = "cuda"
PEAK_GBS = 4250.0
BATCHES, CONTEXTS, NEXT_NS, HEADS = (1, 32, 128), (1024, 8192, 32768), (1, 2), (32, 64)
SWEEP_SHAPES = [(128, 32768, 2, 64), (32, 8192, 1, 32)]  # (batch, context, next_n, H)
SWEEP = [*(cfg for name, cfg in op.VARIANTS.items() if name != "base"), PagedConfig(programs_per_sm=2),
         PagedConfig(num_stages=3), PagedConfig(tile=128, num_warps=8)]
#: Stop starting grid shapes after GRID_BUDGET_S and sweep configs after BUDGET_S (seconds from start),
#: so the table and JSON always come out inside a 180 s limit.
GRID_BUDGET_S, BUDGET_S = 100.0, 140.0
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def make_cache(batch: int, ctx: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache of ``batch`` sequences of ``ctx`` tokens in shuffled blocks, and their block tables."""
    per_seq = triton.cdiv(ctx, BLOCK)
    blocks = batch * per_seq + 7
    values = (torch.randn(blocks, BLOCK * D, device=DEVICE, generator=g) * 1.5).to(torch.float8_e4m3fn)
    scales = torch.rand(blocks, BLOCK, device=DEVICE, generator=g) * 0.9 + 0.1
    cache = torch.cat([values.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    tables = torch.randperm(blocks, device=DEVICE, generator=g)[: batch * per_seq]
    return cache.view(blocks, BLOCK, 1, D + 4), tables.view(batch, per_seq).to(torch.int32)


def make_queries(batch: int, next_n: int, h: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = (torch.randn(batch, next_n, h, D, device=DEVICE, generator=g) * 1.5).to(torch.float8_e4m3fn)
    return q, torch.randn(batch * next_n, h, device=DEVICE, generator=g) * h ** -0.5


def fp32_torch(q, cache, weights, lens, tables, max_len: int) -> torch.Tensor:
    """Independent fp32 GPU computation: per sequence, gather its keys, one matmul, mask."""
    b, next_n, h, d = q.shape
    values, scales = split_paged_cache(cache)
    values = values.view(torch.float8_e4m3fn)
    vis = visible_lengths(lens, next_n).clamp(0, min(max_len, tables.shape[1] * BLOCK))
    vis_host = vis.view(b, next_n).max(dim=1).values.tolist()
    out = torch.full((b * next_n, max_len), float("-inf"), device=q.device)
    for bi, n in enumerate(vis_host):
        if n <= 0:
            continue
        pos = torch.arange(n, device=q.device)
        blk, off = tables[bi, pos // BLOCK].long(), pos % BLOCK
        k = values[blk, off].float()
        s = (q[bi].float().reshape(next_n * h, d) @ k.T).relu_().view(next_n, h, n)
        rows = slice(bi * next_n, (bi + 1) * next_n)
        res = torch.einsum("jhn,jh->jn", s, weights[rows]) * scales[blk, off][None, :]
        res = torch.where(pos[None, :] < vis[rows, None], res, float("-inf"))
        out[rows, :n] = res
    return out


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Outputs pre-filled with NaN, so cells the kernel leaves unwritten show (correctness runs only)."""
    real = op._new_output
    op._new_output = lambda *a: real(*a).fill_(float("nan"))
    try:
        yield
    finally:
        op._new_output = real


def check(out: torch.Tensor, ref: torch.Tensor, clean: bool) -> dict[str, Any]:
    inside = torch.isfinite(ref)
    diff = calc_diff(out[inside], ref[inside])
    mask_ok = bool(torch.equal(torch.isneginf(out), ~inside)) if clean else True
    unwritten = int(out[inside].isnan().sum())
    return {"calc_diff": diff, "mask_ok": mask_ok, "unwritten": unwritten,
            "ok": diff < 1e-3 and mask_ok and unwritten == 0}


def traffic_bytes(batch: int, ctx: int, next_n: int, h: int) -> int:
    visible = batch * triton.cdiv(ctx, BLOCK) * BLOCK  # every sequence at full context here
    return visible * (D + 4) + batch * next_n * h * (D + 4) + batch * next_n * ctx * 4


def copy_bandwidth() -> float:
    """GB/s of a 2 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(2**31, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * 2**31 / ms / 1e6


def time_fn(fn: Callable[[], Any], graph: bool) -> float:
    fn()
    if graph:
        return do_bench_cudagraph(fn, rep=40, return_mode="median")
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def run_grid(args: argparse.Namespace, copy_gbs: float) -> tuple[list[dict], list[dict]]:
    rows, checks = [], []
    g = torch.Generator(device=DEVICE).manual_seed(0)
    batches = (32, 1) if args.quick else sorted(BATCHES, reverse=True)  # the goal's shapes first
    for batch in batches:
        for ctx in sorted(CONTEXTS, reverse=True):
            if time.time() - T0 > GRID_BUDGET_S:
                log("time budget reached: stopping the grid")
                return rows, checks
            cache, tables = make_cache(batch, ctx, g)
            full = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
            for next_n in NEXT_NS:
                for h in HEADS:
                    q, w = make_queries(batch, next_n, h, g)
                    tag = f"B={batch} ctx={ctx} next_n={next_n} H={h}"
                    try:
                        with poisoned():
                            out = fp8_paged_mqa_logits_triton(q, cache, w, full, tables, ctx)
                        res = check(out, fp32_torch(q, cache, w, full, tables, ctx), True)
                        checks.append({"case": tag + " full", **res})
                        if not res["ok"]:
                            log(f"WRONG {tag}: {res}")
                        fn = lambda: fp8_paged_mqa_logits_triton(q, cache, w, full, tables, ctx)  # noqa: E731
                        ms, graph_ms = time_fn(fn, False), time_fn(fn, True)
                        nbytes = traffic_bytes(batch, ctx, next_n, h)
                        row = {"batch": batch, "ctx": ctx, "next_n": next_n, "H": h, "ms": ms,
                               "graph_ms": graph_ms, "GB/s": nbytes / graph_ms / 1e6}
                        row["%peak"] = 100 * row["GB/s"] / PEAK_GBS
                        row["%copy"] = 100 * row["GB/s"] / copy_gbs
                        if batch * ctx <= 32 * 8192:
                            ref_fn = lambda: TORCH_REF.fp8_paged_mqa_logits(q, cache, w, full, tables, ctx)  # noqa: E731
                            row["torch_ref_ms"] = time_fn(ref_fn, False)
                            row["speedup"] = row["torch_ref_ms"] / ms
                        rows.append(row)
                        log(f"{tag}: {ms:.4f} ms, graph {graph_ms:.4f} ms, {row['GB/s']:.0f} GB/s "
                            f"({row['%peak']:.0f}% of peak)")
                    except Exception as exc:  # report and keep going
                        traceback.print_exc()
                        checks.append({"case": tag, "ok": False, "error": repr(exc)})
            # Ragged contexts on the same cache: random lengths (some below next_n), 2-D lens, unclean.
            try:
                lens = torch.randint(0, ctx + 1, (batch,), generator=g, device=DEVICE, dtype=torch.int32)
                q, w = make_queries(batch, 2, 64, g)
                with poisoned():
                    out = fp8_paged_mqa_logits_triton(q, cache, w, lens, tables, ctx)
                checks.append({"case": f"B={batch} ctx={ctx} ragged", **check(
                    out, fp32_torch(q, cache, w, lens, tables, ctx), True)})
                lens2 = (lens[:, None] - 1 + torch.arange(2, device=DEVICE)[None, :]).to(torch.int32)
                with poisoned():
                    out = fp8_paged_mqa_logits_triton(q, cache, w, lens2, tables, ctx, False)
                checks.append({"case": f"B={batch} ctx={ctx} ragged 2-D unclean", **check(
                    out, fp32_torch(q, cache, w, lens2, tables, ctx), False)})
            except Exception as exc:
                traceback.print_exc()
                checks.append({"case": f"B={batch} ctx={ctx} ragged", "ok": False, "error": repr(exc)})
    return rows, checks


def run_sweep(copy_gbs: float) -> list[dict]:
    rows = []
    g = torch.Generator(device=DEVICE).manual_seed(1)
    for batch, ctx, next_n, h in SWEEP_SHAPES:
        cache, tables = make_cache(batch, ctx, g)
        full = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
        q, w = make_queries(batch, next_n, h, g)
        ref = fp32_torch(q, cache, w, full, tables, ctx)
        for cfg in [default_config("sm_90", BLOCK), *SWEEP]:
            if time.time() - T0 > BUDGET_S:
                log("time budget reached: stopping the sweep")
                return rows
            try:
                fn = lambda cfg=cfg: fp8_paged_mqa_logits_triton(q, cache, w, full, tables, ctx, config=cfg)  # noqa: E731
                with poisoned():
                    ok = check(fn(), ref, True)["ok"]
                graph_ms = time_fn(fn, True)
                gbs = traffic_bytes(batch, ctx, next_n, h) / graph_ms / 1e6
                rows.append({"shape": f"B={batch} ctx={ctx} next_n={next_n} H={h}", "config": str(cfg),
                             "ok": ok, "graph_ms": graph_ms, "GB/s": gbs, "%copy": 100 * gbs / copy_gbs})
                log(f"sweep {rows[-1]['shape']} {cfg}: {graph_ms:.4f} ms {gbs:.0f} GB/s ok={ok}")
            except Exception as exc:
                traceback.print_exc()
                rows.append({"shape": f"B={batch} ctx={ctx}", "config": str(cfg), "error": repr(exc)})
    return rows


def print_table(rows: list[dict], sweep: list[dict], checks: list[dict], copy_gbs: float) -> None:
    bad = [c for c in checks if not c.get("ok")]
    print(f"\ncorrectness: {len(checks) - len(bad)}/{len(checks)} cases ok"
          + (f"; FAILED: {[c['case'] for c in bad]}" if bad else ""))
    if checks:
        print(f"worst calc_diff: {max(c.get('calc_diff', 0.0) for c in checks):.2e}")
    print(f"measured copy bandwidth: {copy_gbs:.0f} GB/s ({100 * copy_gbs / PEAK_GBS:.0f}% of {PEAK_GBS:.0f})")
    if sweep:
        print("\nconfig sweep (graph-replayed):")
        for r in sweep:
            print(f"  {r['shape']:<32} {r['config']:<14} " + (
                f"{r['graph_ms']:.4f} ms {r['GB/s']:6.0f} GB/s {r['%copy']:4.0f}% of copy ok={r['ok']}"
                if "graph_ms" in r else r.get("error", "")))
    head = (f"{'batch':>5} {'ctx':>6} {'nn':>2} {'H':>3} {'ms':>8} {'graph_ms':>9} {'GB/s':>6} "
            f"{'%peak':>5} {'%copy':>5} {'torch_ref_ms':>12} {'speedup':>7}")
    print("\n" + head)
    for r in rows:
        ref = (f"{r['torch_ref_ms']:12.3f} {r['speedup']:7.1f}" if "torch_ref_ms" in r
               else f"{'-':>12} {'-':>7}")
        print(f"{r['batch']:5d} {r['ctx']:6d} {r['next_n']:2d} {r['H']:3d} {r['ms']:8.4f} "
              f"{r['graph_ms']:9.4f} {r['GB/s']:6.0f} {r['%peak']:5.0f} {r['%copy']:5.0f} {ref}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 32 only, no sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    log(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    copy_gbs = copy_bandwidth()
    log(f"copy bandwidth {copy_gbs:.0f} GB/s")
    rows, checks = run_grid(args, copy_gbs)
    rows.sort(key=lambda r: (r["batch"], r["ctx"], r["next_n"], r["H"]))
    sweep = [] if args.quick else run_sweep(copy_gbs)
    result = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__,
              "copy_GBps": copy_gbs, "rows": rows, "sweep": sweep, "checks": checks}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "h200_paged.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_table(rows, sweep, checks, copy_gbs)
    return 0 if all(c.get("ok") for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
