"""Decode (paged fp8 MQA logits) on ragged batches: every Triton variant, mqa-core's public op and
DeepGEMM, on the same inputs in one process. Checks, then times, then a table (last).

    cd <repo> && PYTHONPATH=providers/gluon:providers/torch_ref:. python bench/h200_decode_vs_deepgemm.py
    # or: bash bench/h200_run.sh decode_vs_deepgemm:280       (--quick: 4 shapes; --budget S)

Inputs, as engines see them: B in {32, 128, 256} sequences whose contexts are uniform in
[C/2, C] for C in {4k, 16k, 64k}, next_n in {1, 2}, H in {32, 64}, D = 128, a shuffled 64-token
page pool, 2-D context lengths built by DeepGEMM's rule (row j sees ctx - next_n + j + 1), fp8
values with a bounded exponent and float32 scales in [0.1, 1].

Correctness, per shape and implementation: calc_diff < 1e-3 against an fp32 PyTorch computation
(gather through the block table, upcast, matmul) on a sample of sequences, inside each row's
context; for the Triton kernel also with clean_logits=True over the whole output, where the -inf
mask must equal the contexts exactly. Outputs are poisoned (NaN) before the checked calls.

Speed: each implementation with clean_logits=False (DeepGEMM's only mode with 2-D lengths) replayed
from a CUDA graph that calls it on R different caches in turn (R x bytes >= 256 MB, so the 50 MB L2
cannot serve repeats), median of 15 replays / R. GB/s counts each sequence's visible positions
rounded up to 64-token blocks x (D + 4) bytes read once, plus q, weights and the written logits;
%bw is of 4250 GB/s (the measured copy bandwidth that issue 11's target refers to; the copy measured
here is printed too). Host cost: microseconds per call of 300 back-to-back eager calls on the
smallest shape (no sync inside; DeepGEMM's schedule metadata computed once outside, as engines do).

``import deep_gemm`` may fail: then the DeepGEMM columns say so and everything else still runs.
JSON with every number goes to $OUT/h200_decode_vs_deepgemm.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

D, BLOCK = 128, 64
TARGET_GBS = 4250.0
BATCHES, CONTEXTS, NEXT_NS, HEADS = (32, 128, 256), (4096, 16384, 65536), (1, 2), (32, 64)
#: (B, C) in the order they are run: the most telling first, so a budget cut keeps them.
ORDER = [(128, 16384), (256, 65536), (32, 4096), (32, 65536), (256, 4096), (128, 65536), (32, 16384),
         (256, 16384), (128, 4096)]
QUICK = [(128, 16384), (32, 4096)]
#: ``--cpu-smoke``: the whole flow on the CPU (Triton interpreter, eager timing, tiny shapes), to
#: check the script itself without a GPU.
SMOKE = {"device": "cpu", "order": [(3, 300), (2, 130)], "host_shape": (2, 130)}
DEVICE = "cuda"
HOST_SHAPE = (32, 4096)
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# -- inputs ----------------------------------------------------------------------------------------

class Batch:
    """One ragged batch: R page pools with the same contexts (for L2-proof timing) and its tables."""

    def __init__(self, batch: int, ctx: int, device: str, g: torch.Generator, copies: int) -> None:
        self.batch, self.ctx = batch, ctx
        lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=g, device=device, dtype=torch.int32)
        self.lens = lens
        self.lens_host = lens.tolist()
        per_seq = -(-ctx // BLOCK)
        blocks = batch * per_seq + 3
        self.caches, self.tables = [], []
        for _ in range(copies):
            raw = torch.randint(0, 0x58, (blocks, BLOCK * D), generator=g, device=device, dtype=torch.uint8)
            raw |= torch.randint(0, 2, (blocks, BLOCK * D), generator=g, device=device,
                                 dtype=torch.uint8) << 7  # random sign, |value| < 32
            scales = torch.rand(blocks, BLOCK, generator=g, device=device) * 0.9 + 0.1
            cache = torch.cat([raw, scales.view(torch.uint8)], dim=1).view(blocks, BLOCK, 1, D + 4)
            self.caches.append(cache)
            perm = torch.randperm(blocks, generator=g, device=device)[: batch * per_seq]
            self.tables.append(perm.view(batch, per_seq).to(torch.int32))
        self.visible = sum(-(-n // BLOCK) * BLOCK for n in self.lens_host)

    def lens_2d(self, next_n: int) -> torch.Tensor:
        j = torch.arange(next_n, device=self.lens.device, dtype=torch.int32)
        return (self.lens[:, None] - next_n + 1 + j[None, :]).contiguous()

    def nbytes(self, next_n: int, h: int) -> int:
        return self.visible * (D + 4) + self.batch * next_n * h * (D + 4) + self.visible * next_n * 4


def copies_for(batch: int, ctx: int) -> int:
    one = batch * 0.75 * ctx * (D + 4)
    return int(min(16, max(1, -(-256e6 // one))))


# -- implementations -------------------------------------------------------------------------------

Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool], torch.Tensor]


def triton_impls() -> dict[str, Impl]:
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import VARIANTS, fp8_paged_mqa_logits_triton

    def make(cfg: Any) -> Impl:
        return lambda q, c, w, lens, t, n, clean: fp8_paged_mqa_logits_triton(q, c, w, lens, t, n, clean,
                                                                              config=cfg)

    return {f"triton:{name}": make(cfg) for name, cfg in VARIANTS.items()}


def public_impls() -> dict[str, Impl]:
    import mqa_core
    from mqa_core.compat import deep_gemm as compat

    meta: dict[tuple[int, str], torch.Tensor] = {}

    def via_compat(q, c, w, lens, t, n, clean):  # noqa: ANN001, ANN202
        key = (id(lens), str(lens.device))
        if key not in meta:
            meta[key] = compat.get_paged_mqa_logits_metadata(lens, BLOCK, 132)  # not read by it
        return compat.fp8_paged_mqa_logits(q, c, w, lens, t, meta[key], n, clean)

    return {"mqa_core": lambda q, c, w, lens, t, n, clean: mqa_core.fp8_paged_mqa_logits(
                q, c, w, lens, t, n, clean_logits=clean),
            "compat": via_compat}


def deepgemm_impl() -> tuple[Impl | None, str]:
    try:
        import deep_gemm
    except Exception as exc:  # absent or broken build: say so, run the rest
        return None, f"import deep_gemm failed: {type(exc).__name__}: {exc}"
    sms = deep_gemm.get_num_sms()
    meta: dict[int, torch.Tensor] = {}

    def run(q, c, w, lens, t, n, clean):  # noqa: ANN001, ANN202
        if id(lens) not in meta:  # once per lengths tensor, outside the timed calls, as engines do
            meta[id(lens)] = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK, sms)
        return deep_gemm.fp8_paged_mqa_logits(q, c, w, lens, t, meta[id(lens)], n, clean)

    return run, f"deep_gemm from {os.path.dirname(deep_gemm.__file__)}, {sms} SMs"


# -- checks ----------------------------------------------------------------------------------------

def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    if not torch.isfinite(x).all():
        return float("inf")
    denom = float((x * x + y * y).sum())
    return 0.0 if denom == 0 else 1.0 - 2.0 * float((x * y).sum()) / denom


def oracle_rows(bt: Batch, copy: int, q: torch.Tensor, w: torch.Tensor, lens2: torch.Tensor,
                seqs: list[int]) -> dict[int, torch.Tensor]:
    """fp32 logits [next_n, ctx] of the sampled sequences, -inf outside each row's context."""
    from mqa_core.reference import split_paged_cache

    values, scales = split_paged_cache(bt.caches[copy])
    values = values.view(torch.float8_e4m3fn)
    next_n, h = q.shape[1], q.shape[2]
    rows = {}
    for b in seqs:
        n = int(lens2[b].max())
        pos = torch.arange(max(n, 0), device=q.device)
        blk, off = bt.tables[copy][b, pos // BLOCK].long(), pos % BLOCK
        k = values[blk, off].float()
        s = (q[b].float().reshape(next_n * h, D) @ k.T).relu_().view(next_n, h, -1)
        res = torch.einsum("jhn,jh->jn", s, w[b * next_n:(b + 1) * next_n]) * scales[blk, off][None, :]
        full = torch.full((next_n, bt.ctx), float("-inf"), device=q.device)
        full[:, :n] = torch.where(pos[None, :] < lens2[b][:, None], res, float("-inf"))
        rows[b] = full
    return rows


def check(out: torch.Tensor, rows: dict[int, torch.Tensor], lens2: torch.Tensor, clean: bool) -> dict:
    next_n = lens2.shape[1]
    worst, unwritten = 0.0, 0
    for b, ref in rows.items():
        got = out[b * next_n:(b + 1) * next_n]
        inside = torch.isfinite(ref)
        unwritten += int(got[inside].isnan().sum())
        worst = max(worst, calc_diff(got[inside], ref[inside]))
    mask_ok = True
    if clean:
        pos = torch.arange(out.shape[1], device=out.device)
        mask_ok = bool(torch.equal(torch.isneginf(out), pos[None, :] >= lens2.reshape(-1, 1)))
    return {"calc_diff": worst, "unwritten": unwritten, "mask_ok": mask_ok,
            "ok": worst < 1e-3 and unwritten == 0 and mask_ok}


def poisoned_call(fn: Callable[[], torch.Tensor], m: int, n: int) -> torch.Tensor:
    """Fill the allocator's next block of this size with NaN, then call: unwritten cells read NaN."""
    row = -(-max(n, 1) // 256) * 256
    torch.full((m, row + 256), float("nan"), device=DEVICE)
    return fn()


# -- timing ----------------------------------------------------------------------------------------

def graph_us(calls: list[Callable[[], Any]]) -> float:
    """Median over 15 replays of a graph that makes every call once, per call, in microseconds."""
    if DEVICE == "cpu":  # smoke run: eager, one round
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) / len(calls) * 1e6
    for c in calls:
        c()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del g
    return statistics.median(times)


def host_us(call: Callable[[], Any], n: int = 300) -> float:
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    n = n if DEVICE == "cuda" else 2
    for _ in range(20 if DEVICE == "cuda" else 1):
        call()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        call()
    per = (time.perf_counter() - t) / n * 1e6
    sync()
    return per


def copy_gbs() -> float:
    if DEVICE == "cpu":
        return float("nan")
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2**30 / (graph_us([lambda: dst.copy_(src)]) * 1e-6) / 1e9


# -- the run ---------------------------------------------------------------------------------------

def run_shape(bt: Batch, next_n: int, h: int, impls: dict[str, Impl], g: torch.Generator) -> dict:
    q = (torch.randn(bt.batch, next_n, h, D, generator=g, device=DEVICE) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(bt.batch * next_n, h, generator=g, device=DEVICE) * h ** -0.5
    lens2 = bt.lens_2d(next_n)
    tag = f"B={bt.batch} C={bt.ctx} next_n={next_n} H={h}"
    seqs = sorted({0, bt.batch - 1, int(torch.argmax(bt.lens)), int(torch.argmin(bt.lens)), bt.batch // 2})
    rows = oracle_rows(bt, 0, q, w, lens2, seqs)
    m, n = bt.batch * next_n, bt.ctx
    res: dict[str, Any] = {"B": bt.batch, "C": bt.ctx, "next_n": next_n, "H": h,
                           "bytes": bt.nbytes(next_n, h), "copies": len(bt.caches), "impls": {}}
    for name, fn in impls.items():
        r: dict[str, Any] = {}
        try:
            out = poisoned_call(lambda fn=fn: fn(q, bt.caches[0], w, lens2, bt.tables[0], n, False), m, n)
            r["check"] = check(out, rows, lens2, clean=False)
            if name == "triton:base":  # the whole -inf mask, once per shape
                out = poisoned_call(lambda fn=fn: fn(q, bt.caches[0], w, lens2, bt.tables[0], n, True), m, n)
                r["check_clean"] = check(out, rows, lens2, clean=True)
            del out
            calls = [lambda fn=fn, c=c, t=t: fn(q, c, w, lens2, t, n, False)
                     for c, t in zip(bt.caches, bt.tables)]
            r["graph_us"] = graph_us(calls)
            r["GBps"] = res["bytes"] / (r["graph_us"] * 1e-6) / 1e9
            r["pct_target"] = 100 * r["GBps"] / TARGET_GBS
        except Exception as exc:
            traceback.print_exc()
            r["error"] = f"{type(exc).__name__}: {exc}"[:300]
        res["impls"][name] = r
        ok = r.get("check", {}).get("ok")
        log(f"{tag} {name:18s} " + (f"{r['graph_us']:9.1f} us {r['GBps']:6.0f} GB/s ok={ok}"
                                    if "graph_us" in r else r.get("error", "")))
    dg = res["impls"].get("deepgemm", {}).get("graph_us")
    for r in res["impls"].values():
        if dg and "graph_us" in r:
            r["vs_deepgemm"] = dg / r["graph_us"]
    return res


def measure_host(bt: Batch, impls: dict[str, Impl], g: torch.Generator) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for next_n in NEXT_NS:
        for h in HEADS:
            q = (torch.randn(bt.batch, next_n, h, D, generator=g, device=DEVICE)).to(torch.float8_e4m3fn)
            w = torch.randn(bt.batch * next_n, h, generator=g, device=DEVICE)
            lens2 = bt.lens_2d(next_n)
            for name, fn in impls.items():
                try:
                    us = host_us(lambda fn=fn: fn(q, bt.caches[0], w, lens2, bt.tables[0], bt.ctx, False))
                except Exception as exc:
                    log(f"host cost {name}: {type(exc).__name__}: {exc}")
                    continue
                out.setdefault(name, {})[f"next_n={next_n} H={h}"] = us
    return out


def print_table(results: list[dict], host: dict[str, dict[str, float]], names: list[str], copy: float,
                dg_note: str) -> None:
    short = {n: n.replace("triton:", "") for n in names}
    print(f"\n{dg_note}")
    print(f"device copy: {copy:.0f} GB/s; %bw below is of {TARGET_GBS:.0f} GB/s")
    checks = [(f"B={r['B']} C={r['C']} nn={r['next_n']} H={r['H']}", n, c)
              for r in results for n, i in r["impls"].items()
              for c in (i.get("check"), i.get("check_clean")) if c]
    bad = [(s, n, c) for s, n, c in checks if not c["ok"]]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks ok"
          + "".join(f"\n  FAILED {s} {n}: {c}" for s, n, c in bad))
    if host:
        print(f"\nhost us per eager call (B, C = {HOST_SHAPE}; mean over the four next_n/H):")
        base = statistics.mean(host["deepgemm"].values()) if "deepgemm" in host else None
        for n in names:
            if n in host:
                us = statistics.mean(host[n].values())
                print(f"  {short[n]:12s} {us:7.1f} us" + (f"   {us / base:4.2f}x DeepGEMM" if base else ""))
    head = f"\n{'B':>4} {'C':>6} {'nn':>2} {'H':>3} " + " ".join(f"{short[n][:10]:>17s}" for n in names)
    print(head + "\n" + " " * 19 + " ".join(f"{'us  %bw  xDG':>17s}" for _ in names))
    for r in results:
        cells = []
        for n in names:
            i = r["impls"].get(n, {})
            if "graph_us" in i:
                ratio = f"{i['vs_deepgemm']:4.2f}" if "vs_deepgemm" in i else "   -"
                cells.append(f"{i['graph_us']:7.1f} {i['pct_target']:3.0f} {ratio}")
            else:
                cells.append(f"{'error' if 'error' in i else '-':>17s}")
        print(f"{r['B']:4d} {r['C']:6d} {r['next_n']:2d} {r['H']:3d} " + " ".join(f"{c:>17s}" for c in cells))
    for n in names:
        ratios = [r["impls"][n]["vs_deepgemm"] for r in results if "vs_deepgemm" in r["impls"].get(n, {})]
        pcts = [r["impls"][n]["pct_target"] for r in results
                if r["next_n"] == 1 and "pct_target" in r["impls"].get(n, {})]
        vs = (f"vs DeepGEMM min {min(ratios):.2f}x median {statistics.median(ratios):.2f}x"
              if ratios else "vs DeepGEMM -")
        bw = f"next_n=1 %bw min {min(pcts):.0f}% median {statistics.median(pcts):.0f}%" if pcts else ""
        print(f"  {short[n]:12s} {vs}; {bw}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two (B, C) pairs only")
    parser.add_argument("--budget", type=float, default=200.0,
                        help="seconds after which no new (B, C) pair is started (default 200)")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE, HOST_SHAPE
    order = QUICK if args.quick else ORDER
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE, order, HOST_SHAPE = SMOKE["device"], SMOKE["order"], SMOKE["host_shape"]
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    name = torch.cuda.get_device_properties(0).name if DEVICE == "cuda" else "cpu (smoke)"
    log(f"{name}, torch {torch.__version__}, triton {triton.__version__}")
    impls: dict[str, Impl] = {}
    dg, dg_note = deepgemm_impl() if DEVICE == "cuda" else (None, "DeepGEMM: not on the CPU")
    if dg is not None:
        impls["deepgemm"] = dg
    log(dg_note)
    impls.update(triton_impls())
    impls.update(public_impls())
    names = list(impls)
    copy = copy_gbs()
    log(f"copy bandwidth {copy:.0f} GB/s")
    g = torch.Generator(device=DEVICE).manual_seed(0)
    host: dict[str, dict[str, float]] = {}
    results: list[dict] = []
    for batch, ctx in order:
        if time.time() - T0 > args.budget:
            log(f"budget of {args.budget:.0f} s reached: no new shapes")
            break
        bt = Batch(batch, ctx, DEVICE, g, 2 if DEVICE == "cpu" else copies_for(batch, ctx))
        for next_n in NEXT_NS:
            for h in HEADS:
                results.append(run_shape(bt, next_n, h, impls, g))
        if (batch, ctx) == HOST_SHAPE:
            host = measure_host(bt, impls, g)
        del bt
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    result = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
              "deepgemm": dg_note, "copy_GBps": copy, "target_GBps": TARGET_GBS, "host_us": host,
              "shapes": results}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "h200_decode_vs_deepgemm.json"), "w") as f:
            json.dump(result, f, indent=1)
    print_table(results, host, names, copy, dg_note)
    ok = all(c["ok"] for r in results for i in r["impls"].values()
             for c in (i.get("check"), i.get("check_clean")) if c)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
