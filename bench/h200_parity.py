"""Issue 35 on the H200, one call: the GPU tests of the parity work, bf16 against float32 logits, and
decode timings beside DeepGEMM (bf16 vs float32 output; next_n 3 and 4). Prints a short table last.

    python bench/h200_parity.py [--install] [--out DIR] [--budget SECONDS] [--smoke]
    # DeepGEMM on PYTHONPATH for its columns; without it they say why and the rest runs. < 4 min.

1. Tests (subprocesses, each with a time limit): ``pytest -m cuda`` on the parity test files
   (tests/gluon/test_bf16_logits.py, tests/gluon/test_paged_next_n.py), then the conformance kit's
   bf16 cases for the gluon and triton providers (``--mqa-device cuda -k bf16``).
2. bf16 against float32: the public ops (the provider mqa-core picks here) on a prefill and a paged
   call: bf16 must be the float32 logits rounded once (bit-equal in every defined cell, -inf where
   float32 has -inf), and both within DeepGEMM's bar of a float64 reference.
3. Timings, by CUDA-graph replay (``mqa_core.bench.timing.graph_time``: each implementation's calls over
   the input sets captured once, the graph replayed; medians of the replays), clean_logits=False
   (DeepGEMM's only mode with 2-D lengths), ragged 2-D lengths by DeepGEMM's rule, block 64, D 128:
   a. the decode grid (B x context x next_n 1, 2 at H 64): mqa-core's op with float32 and with bf16
      logits beside DeepGEMM's float32 (and its bf16, where this DeepGEMM takes ``logits_dtype``);
   b. next_n 3 and 4 at H 32 and 64: mqa-core's op (what the gluon provider picks: the Triton kernel
      for these classes), the Gluon kernel directly where it serves the class (H 32), and the Triton
      kernel directly, beside DeepGEMM: its own call where it takes next_n > 2, else its next_n = 1
      call over the flattened batch (B * next_n sequences: TensorRT-LLM's workaround).
   ``x DG`` is DeepGEMM's time over ours (> 1: ours is faster).

Input sets per shape are rotated so the page pools exceed L2 (at least ~200 MB of pools per shape).
``--budget`` (default 100 s for the timings) skips the shapes left past it, and says so; each test
suite gets ``--test-limit`` (80 s).
``--smoke`` runs the whole script on the CPU with tiny shapes (torch_ref; no graph timings).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
T0 = time.time()
PARITY_TESTS = ["tests/gluon/test_bf16_logits.py", "tests/gluon/test_paged_next_n.py"]
D, BLOCK = 128, 64


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def install() -> None:
    """This checkout's distributions, editable, without dependencies (entry points need them)."""
    wheels = sorted((ROOT / ".wheels").glob("setuptools-*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", str(wheels[-1])], check=False)
    for dist in [ROOT, *sorted(p.parent for p in (ROOT / "providers").glob("*/pyproject.toml"))]:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                            str(dist)], capture_output=True, text=True)
        if r.returncode:
            log(f"pip install -e {dist.name} failed: {r.stderr.strip().splitlines()[-1:]}")


def run_tests(limit: int) -> list[dict[str, Any]]:
    """Each suite in a subprocess with its time limit; its last summary line kept."""
    suites = [
        ("pytest -m cuda (parity files)",
         ["-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *PARITY_TESTS]),
        ("kit bf16: gluon, triton", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--mqa-provider", "gluon",
                                     "--mqa-provider", "triton", "--mqa-device", "cuda", "-k", "bf16"]),
    ]
    results = []
    for name, args in suites:
        log(f"tests: {name}")
        try:
            r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=limit)
            lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
            tail = lines[-1] if lines else r.stderr.strip()[-200:]
            failed = [ln for ln in lines if ln.startswith("FAILED")][:8]
            results.append({"suite": name, "rc": r.returncode, "summary": tail, "failed": failed})
        except subprocess.TimeoutExpired:
            results.append({"suite": name, "rc": "timeout", "summary": f"past {limit} s", "failed": []})
        log(f"  -> {results[-1]['summary']}")
        for f in results[-1]["failed"]:
            log(f"     {f}")
    return results


# -- inputs ----------------------------------------------------------------------------------------

class Decode:
    """A ragged decode batch: page pools (copies, so the timed set exceeds L2), tables, 2-D lengths by
    DeepGEMM's rule, q and weights for (next_n, H)."""

    def __init__(self, torch: Any, device: Any, batch: int, ctx: int, next_n: int, h: int, seed: int,
                 pool_bytes: float) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        self.batch, self.ctx, self.next_n, self.h = batch, ctx, next_n, h
        lens = torch.randint(int(ctx * 0.7), ctx + 1, (batch,), generator=g, device=device, dtype=torch.int32)
        j = torch.arange(next_n, device=device, dtype=torch.int32)
        self.lens2d = (lens[:, None] - next_n + 1 + j[None, :]).clamp_(min=0).contiguous()
        per_seq = -(-ctx // BLOCK)
        blocks = batch * per_seq + 1
        one = blocks * BLOCK * (D + 4)
        copies = int(min(8, max(1, -(-pool_bytes // one))))
        self.caches, self.tables = [], []
        for _ in range(copies):
            vals = (torch.randn(blocks, BLOCK * D, generator=g, device=device) * 2).to(torch.float8_e4m3fn)
            scales = torch.rand(blocks, BLOCK, generator=g, device=device) * 0.9 + 0.1
            cache = torch.cat([vals.view(torch.uint8), scales.view(torch.uint8)], dim=1).view(blocks, BLOCK, 1, D + 4)
            self.caches.append(cache)
            perm = torch.randperm(blocks, generator=g, device=device)[: batch * per_seq]
            self.tables.append(perm.view(batch, per_seq).to(torch.int32))
        self.q = (torch.randn(batch, next_n, h, D, generator=g, device=device) * 1.5).to(torch.float8_e4m3fn)
        self.w = torch.randn(batch * next_n, h, generator=g, device=device) * h ** -0.5

    @property
    def sets(self) -> list[int]:
        return list(range(len(self.caches)))

    def flattened(self, torch: Any) -> tuple[Any, Any, Any]:
        """(q [B * next_n, 1, H, D], lens [B * next_n, 1], per-copy tables [B * next_n, blocks]): the
        batch as next_n = 1 sequences, one per row, each with its own length."""
        q = self.q.reshape(self.batch * self.next_n, 1, self.h, D).contiguous()
        lens = self.lens2d.reshape(-1, 1).contiguous()
        tables = [t.repeat_interleave(self.next_n, dim=0).contiguous() for t in self.tables]
        return q, lens, tables


# -- implementations: name -> (call(set index) -> logits), or a reason ------------------------------

def ours(mqa_core: Any, x: Decode, torch: Any, logits_dtype: Any, schedule: Any) -> Callable[[int], Any]:
    def call(i: int) -> Any:
        return mqa_core.fp8_paged_mqa_logits(x.q, x.caches[i], x.w, x.lens2d, x.tables[i], x.ctx, clean_logits=False,
                                             schedule=schedule, logits_dtype=logits_dtype)
    return call


def deepgemm_api() -> tuple[Any, str]:
    try:
        import deep_gemm
    except Exception as exc:  # absent or broken: its columns say so
        return None, f"DeepGEMM not importable: {type(exc).__name__}: {str(exc)[:120]}"
    where = os.path.dirname(getattr(deep_gemm, "__file__", "") or "?")
    return deep_gemm, f"DeepGEMM {getattr(deep_gemm, '__version__', '?')} from {where}"


def dg_call(dg: Any, q: Any, caches: list[Any], w: Any, lens: Any, tables: list[Any], ctx: int,
            logits_dtype: Any) -> Callable[[int], Any]:
    """DeepGEMM's paged op (current name if it has it), metadata from these lengths, outside the graph."""
    meta = dg.get_paged_mqa_logits_metadata(lens, BLOCK, dg.get_num_sms())
    if hasattr(dg, "fp8_fp4_paged_mqa_logits"):
        return lambda i: dg.fp8_fp4_paged_mqa_logits((q, None), caches[i], w, lens, tables[i], meta, ctx, False,
                                                      logits_dtype)
    if logits_dtype is not None and str(logits_dtype) != "torch.float32":
        raise RuntimeError("this DeepGEMM has no logits_dtype (legacy generation)")
    return lambda i: dg.fp8_paged_mqa_logits(q, caches[i], w, lens, tables[i], meta, ctx, False)


def timed(name: str, call: Callable[[int], Any], x: Decode, device: Any) -> tuple[float | None, str]:
    """Median us per call by graph replay over the input sets; (None, why) where it cannot be timed."""
    from mqa_core.bench.timing import graph_time

    try:
        call(0)  # compile / bind outside the capture; also surfaces refusals
    except Exception as exc:
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:110]}"
    t, why = graph_time(call, x.sets, device)
    if t is None:
        return None, why
    return t.median * 1e3, ""


def agree(torch: Any, a: Any, b: Any, lens2d: Any) -> float:
    """calc_diff of two [rows, ctx] logits over the cells every row sees (DeepGEMM's bar is 1e-3)."""
    from mqa_core.testing import calc_diff

    pos = torch.arange(a.shape[1], device=a.device)[None, :]
    seen = pos < lens2d.reshape(-1, 1)
    return float(calc_diff(a[seen].float(), b[seen].float()))


# -- the parts -------------------------------------------------------------------------------------

def bf16_checks(torch: Any, mqa_core: Any, device: Any) -> list[dict[str, Any]]:
    """The public ops in float32 and bf16 on one prefill and one paged call."""
    from mqa_core import Problem
    from mqa_core.testing import calc_diff, make_inputs, make_paged_inputs

    out = []
    x = make_inputs(Problem(512, 4096, 64, 128), window="causal", seed=1, device=device)
    ref = x.reference().to(device)  # the float64 reference is computed on the CPU
    f32 = mqa_core.fp8_mqa_logits(*x.args())
    b16 = mqa_core.fp8_mqa_logits(*x.args(), logits_dtype=torch.bfloat16)
    inside = torch.isfinite(ref)
    out.append({"op": "prefill 512x4096 H64", "provider": mqa_core.get_provider(device.type if device.type == "cpu"
                                                                                  else None).name,
                "bf16 == rne(fp32)": bool(torch.equal(b16[inside], f32[inside].to(torch.bfloat16))),
                "-inf same": bool(torch.equal(torch.isneginf(b16), torch.isneginf(f32))),
                "calc_diff fp32": float(calc_diff(f32[inside], ref[inside])),
                "calc_diff bf16": float(calc_diff(b16[inside].float(), ref[inside]))})
    p = make_paged_inputs(16, 2, 64, 128, 3000, block_size=64, lens_2d=True, seed=2, device=device)
    ref = p.reference().to(device)
    f32 = mqa_core.fp8_paged_mqa_logits(*p.args())
    b16 = mqa_core.fp8_paged_mqa_logits(*p.args(), logits_dtype=torch.bfloat16)
    inside = torch.isfinite(ref)
    out.append({"op": "paged B16 next_n2 ctx3000 H64",
                "provider": mqa_core.get_provider(None if device.type == "cuda" else "cpu",
                                                  op="fp8_paged_mqa_logits").name,
                "bf16 == rne(fp32)": bool(torch.equal(b16[inside], f32[inside].to(torch.bfloat16))),
                "-inf same": bool(torch.equal(torch.isneginf(b16), torch.isneginf(f32))),
                "calc_diff fp32": float(calc_diff(f32[inside], ref[inside])),
                "calc_diff bf16": float(calc_diff(b16[inside].float(), ref[inside]))})
    for r in out:
        log(f"bf16 check {r}")
    return out


def decode_grid(torch: Any, mqa_core: Any, dg: Any, device: Any, shapes: list[tuple[int, int, int]],
                deadline: float, pool_bytes: float) -> list[dict[str, Any]]:
    from mqa_core import paged_schedule

    rows = []
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    for batch, ctx, next_n in shapes:
        if time.time() > deadline:
            rows.append({"shape": (batch, ctx, next_n), "skipped": "past the budget"})
            continue
        x = Decode(torch, device, batch, ctx, next_n, 64, seed=batch + ctx + next_n, pool_bytes=pool_bytes)
        sched = paged_schedule(x.lens2d, sms)
        r: dict[str, Any] = {"shape": (batch, ctx, next_n)}
        for name, dtype in (("ours fp32", None), ("ours bf16", torch.bfloat16)):
            r[name], r[name + " why"] = timed(name, ours(mqa_core, x, torch, dtype, sched), x, device)
        if dg is not None:
            for name, dtype in (("DG fp32", torch.float32), ("DG bf16", torch.bfloat16)):
                try:
                    call = dg_call(dg, x.q, x.caches, x.w, x.lens2d, x.tables, ctx, dtype)
                except Exception as exc:
                    r[name], r[name + " why"] = None, f"{type(exc).__name__}: {str(exc)[:100]}"
                    continue
                r[name], r[name + " why"] = timed(name, call, x, device)
            if r.get("DG fp32") is not None:
                r["diff vs DG"] = agree(torch, ours(mqa_core, x, torch, None, sched)(0),
                                        dg_call(dg, x.q, x.caches, x.w, x.lens2d, x.tables, ctx, torch.float32)(0),
                                        x.lens2d)
        log(f"decode {r}")
        rows.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def next_n_grid(torch: Any, mqa_core: Any, dg: Any, device: Any, shapes: list[tuple[int, int, int, int]],
                deadline: float, pool_bytes: float) -> list[dict[str, Any]]:
    from mqa_core import paged_schedule

    rows = []
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    for batch, ctx, next_n, h in shapes:
        if time.time() > deadline:
            rows.append({"shape": (batch, ctx, next_n, h), "skipped": "past the budget"})
            continue
        x = Decode(torch, device, batch, ctx, next_n, h, seed=7 * batch + next_n + h, pool_bytes=pool_bytes)
        sched = paged_schedule(x.lens2d, sms)
        r: dict[str, Any] = {"shape": (batch, ctx, next_n, h)}
        r["ours"], r["ours why"] = timed("ours", ours(mqa_core, x, torch, None, sched), x, device)
        if device.type == "cuda":
            from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as gp
            from mqa_provider_gluon.ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton

            why = gp.unsupported(x.q, x.caches[0], x.w, x.lens2d, x.tables[0])
            if why is None:
                r["gluon"], r["gluon why"] = timed("gluon", lambda i: gp.fp8_paged_mqa_logits_gluon(
                    x.q, x.caches[i], x.w, x.lens2d, x.tables[i], x.ctx, False, schedule=sched), x, device)
            else:
                r["gluon"], r["gluon why"] = None, why[:90]
            r["triton"], r["triton why"] = timed("triton", lambda i: fp8_paged_mqa_logits_triton(
                x.q, x.caches[i], x.w, x.lens2d, x.tables[i], x.ctx, False), x, device)
        if dg is not None:
            try:
                native = dg_call(dg, x.q, x.caches, x.w, x.lens2d, x.tables, ctx, torch.float32)
                r["DG native"], r["DG native why"] = timed("DG native", native, x, device)
            except Exception as exc:
                r["DG native"], r["DG native why"] = None, f"{type(exc).__name__}: {str(exc)[:100]}"
            fq, flens, ftables = x.flattened(torch)
            try:
                flat = dg_call(dg, fq, x.caches, x.w, flens, ftables, ctx, torch.float32)
                r["DG flat"], r["DG flat why"] = timed("DG flat", flat, x, device)
                r["diff vs DG flat"] = agree(torch, ours(mqa_core, x, torch, None, sched)(0), flat(0), x.lens2d)
            except Exception as exc:
                r["DG flat"], r["DG flat why"] = None, f"{type(exc).__name__}: {str(exc)[:100]}"
        log(f"next_n {r}")
        rows.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# -- the table -------------------------------------------------------------------------------------

def _us(v: Any) -> str:
    return f"{v:8.1f}" if isinstance(v, float) else "       -"


def _x(base: Any, ours: Any) -> str:
    return f"{base / ours:6.2f}x" if isinstance(base, float) and isinstance(ours, float) and ours > 0 else "      -"


def _rows(rows: list[dict[str, Any]], line: Callable[[dict[str, Any]], str]) -> list[str]:
    """One line per row: ``line(row)``, or what skipped it."""
    return [f"  {r['shape']} skipped: {r['skipped']}" if "skipped" in r else line(r) for r in rows]


def table(env: dict[str, Any], tests: list[dict[str, Any]], checks: list[dict[str, Any]],
          decode: list[dict[str, Any]], nn: list[dict[str, Any]]) -> str:
    lines = [f"== issue 35 parity: {env['device']}, torch {env['torch']}, triton {env['triton']}; {env['deepgemm']}",
             "tests:"]
    lines += [f"  {t['suite']}: rc={t['rc']} {t['summary']}" for t in tests]
    lines.append("bf16 vs fp32 (public ops):")
    for c in checks:
        lines.append(f"  {c['op']} [{c['provider']}]: bf16==rne(fp32) {c['bf16 == rne(fp32)']}, -inf same "
                     f"{c['-inf same']}, calc_diff fp32 {c['calc_diff fp32']:.2e} bf16 {c['calc_diff bf16']:.2e}")
    lines.append("decode H=64 D=128 block 64, graph replay, median us/call (x DG = DeepGEMM fp32 / ours):")
    lines.append("      B    ctx nn | ours f32 ours b16 |   DG f32   DG b16 |  f32 x  b16 x | b16/f32")

    def decode_line(r: dict[str, Any]) -> str:
        b, c, n = r["shape"]
        ratio = (f"{r['ours bf16'] / r['ours fp32']:6.2f}"
                 if isinstance(r.get("ours bf16"), float) and isinstance(r.get("ours fp32"), float) else "     -")
        return (f"  {b:5d} {c:6d} {n:2d} | {_us(r.get('ours fp32'))} {_us(r.get('ours bf16'))} | "
                f"{_us(r.get('DG fp32'))} {_us(r.get('DG bf16'))} | {_x(r.get('DG fp32'), r.get('ours fp32'))} "
                f"{_x(r.get('DG fp32'), r.get('ours bf16'))} | {ratio}")

    lines += _rows(decode, decode_line)
    lines.append("next_n 3/4, graph replay, median us/call (x DG = best DeepGEMM / ours):")
    lines.append("      B    ctx nn   H |     ours    gluon   triton | DG native  DG flat |   x DG")

    def nn_line(r: dict[str, Any]) -> str:
        b, c, n, h = r["shape"]
        dgs = [v for v in (r.get("DG native"), r.get("DG flat")) if isinstance(v, float)]
        best_dg = min(dgs) if dgs else None
        best_ours = min([v for v in (r.get("ours"), r.get("gluon"), r.get("triton")) if isinstance(v, float)],
                        default=None)
        return (f"  {b:5d} {c:6d} {n:2d} {h:3d} | {_us(r.get('ours'))} {_us(r.get('gluon'))} "
                f"{_us(r.get('triton'))} | {_us(r.get('DG native'))} {_us(r.get('DG flat'))} | "
                f"{_x(best_dg, r.get('ours'))} (best ours {_x(best_dg, best_ours)})")

    lines += _rows(nn, nn_line)
    why = sorted({f"{k}: {v}" for r in decode + nn for k, v in r.items() if k.endswith(" why") and v})
    if why:
        lines.append("not timed: " + "; ".join(why)[:1500])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install", action="store_true", help="pip install -e this checkout's distributions first")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="write parity.json here")
    ap.add_argument("--budget", type=float, default=100.0, help="seconds for the timings (shapes past it skipped)")
    ap.add_argument("--test-limit", type=int, default=80, help="seconds per test suite")
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, no graph timings")
    args = ap.parse_args(argv)
    if args.install:
        install()
    import torch
    import triton

    import mqa_core

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dg, dg_text = deepgemm_api()
    env = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
           "torch": torch.__version__, "triton": triton.__version__, "deepgemm": dg_text,
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()}
    log(f"env {env}")
    tests = [] if args.no_tests or device.type != "cuda" else run_tests(args.test_limit)
    checks = bf16_checks(torch, mqa_core, device)
    deadline = time.time() + args.budget
    if device.type == "cuda":
        decode_shapes = [(32, 4096, 1), (32, 4096, 2), (128, 8192, 1), (128, 8192, 2), (64, 32768, 2)]
        nn_shapes = [(64, 8192, 3, 64), (64, 8192, 4, 64), (64, 8192, 3, 32), (64, 8192, 4, 32),
                     (16, 32768, 4, 64)]
        pool = 200e6
    else:
        decode_shapes, nn_shapes, pool = [(2, 256, 2)], [(2, 256, 3, 32)], 1e5
    decode = decode_grid(torch, mqa_core, dg, device, decode_shapes, deadline, pool)
    nn = next_n_grid(torch, mqa_core, dg, device, nn_shapes, deadline, pool)
    text = table(env, tests, checks, decode, nn)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "parity.json").write_text(json.dumps(
            {"env": env, "tests": tests, "checks": checks, "decode": decode, "next_n": nn}, indent=1, default=str))
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
