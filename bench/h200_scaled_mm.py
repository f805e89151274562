"""The vLLM-style torch baseline for issue 6's table: fp8 ``torch._scaled_mm`` chunked over query rows.

Each row chunk multiplies [rows*H, D] fp8 by the keys its windows reach ([D, span] fp8, column-major)
into fp32, then relu, the head-weighted sum (a batched matmul), k_scale and the window mask. Checked
against the gluon provider's result on the same inputs (calc_diff < 1e-3, identical -inf mask), then
timed with do_bench (median) on the prefill preset's shapes. Run on a CUDA machine:
    PYTHONPATH=providers/gluon:providers/torch_ref:. python bench/h200_scaled_mm.py
Prints a table last; JSON to $OUT/h200_scaled_mm.json when $OUT is set.
"""

from __future__ import annotations

import json
import os

import torch

SCORES_BYTES = 2 * 2**30  # one chunk's [rows*H, span] fp32 scores


def scaled_mm_logits(q, k, k_scale, w, ks, ke, clean=True):
    m, h, d = q.shape
    n = k.shape[0]
    out = torch.full((m, n), float("-inf"), dtype=torch.float32, device=q.device)
    one = torch.ones((), device=q.device)
    kt = k.t()  # [D, N] column-major view, what _scaled_mm wants for its second operand
    ksl, kel = ks.clamp(0, n).tolist(), ke.clamp(0, n).tolist()
    rows = max(1, min(m, SCORES_BYTES // (h * n * 4)))
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        lo, hi = min(ksl[r0:r1]), max(kel[r0:r1])
        if lo >= hi:
            continue
        span = (hi - lo + 15) // 16 * 16  # _scaled_mm wants sizes that are multiples of 16
        lo = max(0, min(lo, n - span)) if span <= n else 0
        span = min(span, n - lo)
        if span % 16:
            continue  # too small to be worth a baseline; the row stays -inf and the check flags it
        s = torch._scaled_mm(q[r0:r1].reshape(-1, d), kt[:, lo:lo + span], scale_a=one, scale_b=one,
                             out_dtype=torch.float32)
        s = torch.bmm(w[r0:r1, None, :], s.relu_().view(r1 - r0, h, span)).squeeze(1) * k_scale[lo:lo + span]
        cols = torch.arange(lo, lo + span, device=q.device)
        inside = (cols[None, :] >= ks[r0:r1, None]) & (cols[None, :] < ke[r0:r1, None])
        out[r0:r1, lo:lo + span] = torch.where(inside, s, float("-inf"))
    return out


def main() -> None:
    import triton.testing

    import mqa_core
    from mqa_core.bench.workloads import prefill_preset
    from mqa_core.testing import calc_diff

    dev = torch.device("cuda")
    gluon = mqa_core.get_provider("sm_90")
    rows = []
    for clean in (True, False):
        for w in prefill_preset(clean):
            x = w.setup(dev, seed=0)
            args = (x.q, x.k, x.k_scale, x.weights, x.ks, x.ke)
            ref = gluon.fp8_mqa_logits(*x.args(), clean_logits=True)
            out = scaled_mm_logits(*args)
            ok = calc_diff(out, ref) < 1e-3 and bool(torch.equal(torch.isinf(out), torch.isinf(ref)))
            ms = triton.testing.do_bench(lambda: scaled_mm_logits(*args), warmup=50, rep=300,
                                         return_mode="median")
            tf = w.flops(x) / ms / 1e9
            rows.append({"workload": w.name, "clean": clean, "ms": ms, "tflops": tf, "ok": ok})
            print(f"{w.name:40} clean={clean!s:5} {ms:9.3f} ms {tf:7.1f} TF/s ok={ok}", flush=True)
            del x, ref, out
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "h200_scaled_mm.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"\n{'workload':40} {'clean':5} {'ms':>9} {'TF/s':>7} ok")
    for r in rows:
        print(f"{r['workload']:40} {r['clean']!s:5} {r['ms']:9.3f} {r['tflops']:7.1f} {r['ok']}")


if __name__ == "__main__":
    main()
