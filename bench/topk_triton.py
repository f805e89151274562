"""Exactness and speed of ``topk_per_row_triton`` on one H200, against torch.topk(+sort) and FlashInfer.

    cd <repo> && PYTHONPATH=providers/gluon python bench/topk_triton.py [--quick] [--fi /tmp/fi]

Per shape: the output is checked against an exact GPU reference (int64 keys (order key, -position),
torch.topk, sort) on every row (decode) or sampled rows (prefill); then timed with CUDA-graph replay
(triton.testing.do_bench_cudagraph, median ms). FlashInfer's ``top_k_ragged_transform(deterministic=True,
tie_break=1)`` is timed when ``flashinfer.topk`` imports (``--fi``: a path holding the archive from
../shared/tools/flashinfer-topk-archive.sh, unpacked). Inputs: "randn" (untrained, random-like) and "peaked"
(a few dominant, recency-biased keys). JSON lines go to $OUT/topk_triton.jsonl when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
from mqa_provider_gluon.ops.topk_triton import TopkConfig, topk_per_row_triton, workspace_bytes


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 order keys in [0, 2**32): -0.0 == +0.0, NaN lowest (the kernel's rule)."""
    x = x.float()
    x = torch.where(x == 0, torch.zeros_like(x), x)
    b = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    k = torch.where(b >= 2**31, 0xFFFFFFFF - b, b + 2**31)
    return torch.where(x.isnan(), torch.zeros_like(k), k)


def reference(x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, rows: torch.Tensor) -> torch.Tensor:
    n = x.shape[1]
    out = torch.full((len(rows), topk), -1, dtype=torch.int32, device=x.device)
    for j, m in enumerate(rows.tolist()):
        lo, hi = max(int(ks[m]), 0), min(int(ke[m]), n)
        if lo >= hi:
            continue
        pos = torch.arange(hi - lo, device=x.device)
        comp = (order_keys(x[m, lo:hi]) - 2**31) * 2**32 + (2**32 - 1 - pos)  # unique, orders (key desc, pos asc)
        k = min(topk, hi - lo)
        sel = torch.topk(comp, k).indices.sort().values
        out[j, :k] = sel.to(torch.int32)
    return out


def make(kind: str, m: int, n: int, dtype: torch.dtype, prefill: bool, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", generator=g)
    if kind == "peaked":  # recency bias plus a few dominant keys
        x = x + 3.0 * torch.linspace(0, 1, n, device="cuda")[None, :] ** 8
        hot = torch.randint(0, n, (m, 64), device="cuda", generator=g)
        x.scatter_add_(1, hot, torch.full((m, 64), 8.0, device="cuda"))
    x = x.to(dtype)
    if prefill:
        ks = torch.zeros(m, dtype=torch.int32, device="cuda")
        ke = (n - m + torch.arange(m, device="cuda") + 1).to(torch.int32)
    else:
        ks = torch.zeros(m, dtype=torch.int32, device="cuda")
        ke = (n - torch.randint(0, 1024, (m,), device="cuda", generator=g)).to(torch.int32)
    return x, ks, ke


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fi", default=None)
    ap.add_argument("--configs", default="b2048w8p512")
    args = ap.parse_args()
    fi = None
    if args.fi:
        sys.path.insert(0, args.fi)
        try:
            import flashinfer.topk as fi  # type: ignore[no-redef]
        except Exception as e:  # noqa: BLE001
            print("flashinfer.topk unavailable:", repr(e)[:300])
    out_path = os.path.join(os.environ["OUT"], "topk_triton.jsonl") if os.environ.get("OUT") else None
    configs = {}
    for c in args.configs.split(","):
        b, rest = c[1:].split("w")
        w, p = rest.split("p")
        configs[c] = TopkConfig(block=int(b), num_warps=int(w), max_programs=int(p))
    shapes = [("prefill", 4096, 131072, 2048), ("prefill", 4096, 131072, 512), ("decode", 64, 131072, 2048),
              ("decode", 128, 65536, 2048), ("decode", 128, 131072, 2048)]
    kinds = ["randn"] if args.quick else ["randn", "peaked"]
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    for label, m, n, topk in shapes:
        for kind in kinds:
            for dtype in dtypes:
                x, ks, ke = make(kind, m, n, dtype, label == "prefill")
                row: dict = {"shape": label, "M": m, "N": n, "topk": topk, "kind": kind, "dtype": str(dtype)[6:]}
                rows = (torch.arange(m, device="cuda") if m <= 128
                        else torch.linspace(0, m - 1, 48, device="cuda").long())
                ref = reference(x, ks, ke, topk, rows)
                for name, cfg in configs.items():
                    out = torch.empty(m, topk, dtype=torch.int32, device="cuda")
                    ws = torch.empty(workspace_bytes(m, n, topk, dtype, cfg), dtype=torch.uint8, device="cuda")
                    topk_per_row_triton(x, ks, ke, topk, out=out, workspace=ws, config=cfg)
                    torch.cuda.synchronize()
                    ok = torch.equal(out[rows], ref)
                    again = out.clone()
                    topk_per_row_triton(x, ks, ke, topk, out=out, workspace=ws, config=cfg)
                    ok = ok and torch.equal(out, again)
                    ms = triton.testing.do_bench_cudagraph(
                        lambda cfg=cfg, out=out, ws=ws: topk_per_row_triton(x, ks, ke, topk, out=out, workspace=ws,
                                                                             config=cfg))
                    row[f"triton[{name}]"] = round(ms * 1000, 1)
                    row[f"exact[{name}]"] = ok
                    row["ws_MB"] = round(ws.numel() / 2**20, 1)
                cols = torch.arange(n, device="cuda")[None, :]
                masked = torch.where((cols >= ks[:, None]) & (cols < ke[:, None]), x,
                                     torch.tensor(float("-inf"), dtype=dtype, device="cuda"))

                def torch_topk() -> None:
                    torch.topk(masked, topk, dim=1, sorted=False).indices.sort(dim=1)

                row["torch_topk+sort"] = round(triton.testing.do_bench_cudagraph(torch_topk) * 1000, 1)
                if fi is not None:
                    lengths = (ke - ks).to(torch.int32)
                    zeros = torch.zeros(m, dtype=torch.int32, device="cuda")
                    try:
                        def fi_topk() -> None:
                            fi.top_k_ragged_transform(x, zeros, lengths, topk, deterministic=True, tie_break=1,
                                                      row_starts=ks)
                        fi_topk()
                        row["flashinfer_det"] = round(triton.testing.do_bench_cudagraph(fi_topk) * 1000, 1)
                    except Exception as e:  # noqa: BLE001
                        row["flashinfer_det"] = repr(e)[:200]
                print(json.dumps(row), flush=True)
                if out_path:
                    with open(out_path, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
