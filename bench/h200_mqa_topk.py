"""Fused fp8 MQA top-k (mqa_topk_triton) against dense logits + top-k, on one NVIDIA GPU.

Usage: python bench/h200_mqa_topk.py [--m 4096 --n 131072 --topk 2048 --reps 5]
Prints per workload: the logits kernel alone, dense logits + torch.topk (not tie-exact, a speed
reference) and + the exact torch select, the fused op (its paths, its peak extra memory), whether
the fused result equals the exact select over the dense logits (positions and value bits), and a
profile of the fused op's kernels.
"""

from __future__ import annotations

import argparse
import time

import torch
from mqa_provider_gluon.ops import mqa_topk_triton as op
from mqa_provider_gluon.ops.mqa_logits_triton import fp8_mqa_logits_triton


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def inputs(m: int, n: int, h: int, d: int, kind: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = (torch.randn(m, h, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k = (torch.randn(n, d, device="cuda", generator=g) * 1.5).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, device="cuda", generator=g) * 0.9 + 0.1
    if kind == "peaked":  # a few dominant keys and a recency ramp, as trained indexers give
        k_scale = k_scale * torch.exp(torch.randn(n, device="cuda", generator=g) * 1.5)
        k_scale = k_scale * (1 + 3 * torch.arange(n, device="cuda") / n)
    w = torch.randn(m, h, device="cuda", generator=g) * h**-0.5
    ks = torch.zeros(m, dtype=torch.int32, device="cuda")
    ke = (torch.arange(m, device="cuda") + (n - m) + 1).to(torch.int32)
    return q, k, k_scale, w, ks, ke


def _launch_facts(q, h: int, d: int, k):
    from mqa_provider_gluon.ops.mqa_logits_triton import _device_facts, _tma_usable, default_config

    arch, programs = _device_facts(q.get_device())
    cfg = default_config(arch, h)
    tma = cfg.tma and _tma_usable(arch, d, k.data_ptr(), k.stride())
    return arch, programs, cfg, tma, op.filter_constexprs(cfg, h, d, tma), False, q.get_device()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--h", type=int, default=64)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kinds", default="random,peaked")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for kind in a.kinds.split(","):
        q, k, k_scale, w, ks, ke = inputs(a.m, a.n, a.h, a.d, kind)
        cells = int((ke.clamp(max=a.n) - ks).sum())
        flops = 2 * a.h * a.d * cells
        t_logits = timed(lambda: fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke), a.reps)  # noqa: B023
        logits = fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke)
        t_topk = timed(lambda: torch.topk(logits, a.topk, dim=1), a.reps)  # noqa: B023
        vals = torch.empty(a.m, a.topk, device="cuda")
        t_sel = timed(lambda: op.select_topk_torch(logits, ks, ke, a.topk, values=vals), a.reps)  # noqa: B023
        want, want_val = op.select_topk_torch(logits, ks, ke, a.topk, values=torch.empty(a.m, a.topk, device="cuda"))
        logits = torch.empty(0)  # frees the dense matrix
        torch.cuda.empty_cache()
        ctxs: list = []
        with op.tuning(report=lambda ws, ctx: ctxs.append(ctx)):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            pos, val = op.fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, a.topk, return_values=True)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base - pos.numel() * 8
            t_fused = timed(lambda: op.fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, a.topk), a.reps)  # noqa: B023
        same = torch.equal(pos, want) and torch.equal(val.view(torch.int32), want_val.view(torch.int32))
        print(f"\n[{kind}] M={a.m} N={a.n} H={a.h} D={a.d} topk={a.topk}: {cells:.3e} cells, {flops / 1e12:.2f} TFLOP")
        print(f"  logits kernel        {t_logits:8.2f} ms  ({flops / t_logits / 1e9:.0f} TFLOP/s)")
        print(f"  + torch.topk         {t_topk:8.2f} ms  -> dense total {t_logits + t_topk:.2f} ms")
        print(f"  + exact torch select {t_sel:8.2f} ms  -> dense total {t_logits + t_sel:.2f} ms")
        print(f"  fused (exact)        {t_fused:8.2f} ms  ({flops / t_fused / 1e9:.0f} TFLOP/s of logits)")
        print(f"  fused == exact select over dense logits (positions, value bits): {same}")
        print(f"  fused peak extra memory {peak / 2**20:.1f} MiB (workspace 256 MiB); paths {ctxs[-1]}")
        # The filter kernel alone over the whole batch: nothing passes (tau = +inf: the epilogue's
        # compare, cumsum and atomics-free path) vs the real thresholds' candidate traffic.
        lp = op._Launch(*_launch_facts(q, a.h, a.d, k))
        cap = ctxs[-1]["plan"]["capacity"]
        cnt = torch.zeros(a.m, dtype=torch.int32, device="cuda")
        pos_b = torch.empty(a.m, cap, dtype=torch.int32, device="cuda")
        val_b = torch.empty(a.m, cap, dtype=torch.float32, device="cuda")
        for name, tau in (("tau=+inf", torch.full((a.m,), float("inf"), device="cuda")),
                          ("tau=sampled-like", want_val[:, :].amin(dim=1) - 1e-3 * want_val.abs().amax(dim=1))):
            t = timed(lambda: (cnt.zero_(), op._launch_filter(lp, q, k, k_scale, w, ks, ke, tau, cnt, pos_b,  # noqa: B023
                                                               val_b, cap)), a.reps)
            print(f"  filter kernel alone, {name:18s} {t:8.2f} ms ({flops / t / 1e9:.0f} TFLOP/s), "
                  f"mean count {cnt.float().mean():.0f}")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            op.fp8_mqa_topk_triton(q, k, k_scale, w, ks, ke, a.topk)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
