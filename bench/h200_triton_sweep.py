"""Correctness and speed of the portable Triton fp8 MQA-logits kernel over its configs, on one H200 (< 4 min).

    cd <repo> && PYTHONPATH=providers/gluon python bench/h200_triton_sweep.py [--configs a,b] [--quick]

Phase 1 runs every config with clean_logits=True; phase 2 reruns the default and the fastest config
per H with clean_logits=False. The configs run in a worker subprocess that streams one JSON line per result;
if it dies (a compiler abort, a fault), that config is reported failed and a fresh worker goes on with the
rest. Per config and H: small odd shapes (M=1, N=77, ragged windows with empty rows, ks < 0, ke > N, k_scale
[N, 1], output poisoned with NaN) checked in full against a float64 oracle; the benchmark shapes checked on
sampled rows against a float32 torch reference (calc_diff < 1e-3) and in full for the -inf mask; then timed
with triton.testing.do_bench (median). TF/s = 2*H*D*valid_pairs / time. A table is printed last; the JSON
goes to $OUT/h200_triton_sweep.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

D = 128
HEADS = (32, 64)
SHAPES = [  # (label, M, N, ke offset): ks = 0, ke[m] = offset + m + 1
    ("4k x 16k", 4096, 16384, 16384 - 4096),
    ("8k x 8k", 8192, 8192, 0),
    ("16k x 48k", 16384, 49152, 32768),
]
#: name -> (query-heads per program (block_m * H), block_n, num_warps, num_stages, TMA key loads);
#: "default" is the launcher's own choice (r128n64w4s3 + TMA on sm_90). Most informative first: near
#: the time budget the later ones are skipped.
CONFIGS: dict[str, tuple[int, int, int, int, bool] | None] = {
    "default": None,
    "r128n64w4s3": (128, 64, 4, 3, False),
    "r64n128w4s3tma": (64, 128, 4, 3, True),
    "r256n64w4s3tma": (256, 64, 4, 3, True),
    "r128n64w4s4tma": (128, 64, 4, 4, True),
    "r64n128w4s2tma": (64, 128, 4, 2, True),
    "r128n128w8s3tma": (128, 128, 8, 3, True),
    "r256n64w8s3tma": (256, 64, 8, 3, True),
    "r64n64w4s4tma": (64, 64, 4, 4, True),
}
#: ``--smoke``: the whole script on the CPU under the Triton interpreter with tiny shapes, to test it here.
SMOKE_SHAPES = [("8 x 80", 8, 80, 72), ("16 x 16", 16, 16, 0)]
#: Seconds the whole run may take (--budget): no config starts in the last RESERVE_S of it (one config
#: takes ~10-20 s), and SIGTERM (``timeout``) still prints the table of what finished.
BUDGET_S = 230.0
RESERVE_S = 25.0
CONFIG_TIMEOUT_S = 90.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- worker
def worker(names: list[str], cleans: list[bool], quick: bool, smoke: bool) -> None:
    """Run ``names`` x H x ``cleans``; print one JSON line per result on stdout."""
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton
    from mqa_provider_gluon.ops import mqa_logits_triton as op

    from mqa_core.reference import fp8_mqa_logits_ref

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cpu" if smoke else "cuda")
    shapes = SMOKE_SHAPES if smoke else SHAPES[:1] if quick else SHAPES

    def median_ms(fn) -> float:
        if not smoke:
            return triton.testing.do_bench(fn, warmup=10, rep=60 if quick else 120, return_mode="median")
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    cache: dict = {}

    def emit(**row) -> None:
        print(json.dumps(row), flush=True)

    def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.double(), y.double()
        denom = float((x * x + y * y).sum())
        return 0.0 if denom == 0 else 1.0 - 2.0 * float((x * y).sum()) / denom

    def inputs(m: int, n: int, h: int, seed: int, scale_2d: bool = False):
        g = torch.Generator(device=dev).manual_seed(seed)
        q = (torch.randn(m, h, D, device=dev, generator=g) * 1.5).to(torch.float8_e4m3fn)
        k = (torch.randn(n, D, device=dev, generator=g) * 1.5).to(torch.float8_e4m3fn)
        k_scale = torch.rand(n, device=dev, generator=g) * 0.9 + 0.1
        w = torch.randn(m, h, device=dev, generator=g) * h**-0.5
        return q, k, k_scale[:, None] if scale_2d else k_scale, w

    def bench_inputs(m: int, n: int, h: int, off: int):
        key = (m, n, h, off)
        if key not in cache:
            cache.clear()  # one shape at a time: the 16k x 48k outputs are 3 GB each
            q, k, k_scale, w = inputs(m, n, h, seed=m + n + h)
            ks = torch.zeros(m, dtype=torch.int32, device=dev)
            ke = (torch.arange(m, device=dev, dtype=torch.int32) + off + 1)
            rows = torch.linspace(0, m - 1, 64 if quick else 192, device=dev).long()
            ref = torch.empty(len(rows), n, device=dev)
            for i in range(0, len(rows), 32):  # float32 torch reference on sampled rows
                r = rows[i:i + 32]
                s = torch.einsum("rhd,nd->rhn", q[r].float(), k.float()).clamp_min_(0)
                ref[i:i + 32] = torch.einsum("rhn,rh->rn", s, w[r]) * k_scale[None, :]
            pairs = int((ke.clamp(max=n) - ks).clamp(min=0).sum())
            cache[key] = (q, k, k_scale, w, ks, ke, rows, ref, pairs)
        return cache[key]

    def small_cases(cfg, h: int, clean: bool) -> float:
        """Full check of odd shapes against the float64 oracle; returns the worst calc_diff."""
        worst = 0.0
        for i, (m, n) in enumerate([(1, 77), (5, 40)] if smoke else [(1, 77), (37, 77), (130, 300), (64, 4099)]):
            q, k, k_scale, w = inputs(m, n, h, seed=100 + i, scale_2d=bool(i % 2))
            g = torch.Generator(device=dev).manual_seed(i)
            ks = torch.randint(-8, n, (m,), device=dev, generator=g, dtype=torch.int32)
            ke = ks + torch.randint(-4, n // 2 + 12, (m,), device=dev, generator=g, dtype=torch.int32)
            ke[:: 7] = -3  # empty rows
            real_new = op._new_output
            op._new_output = lambda *a: real_new(*a).fill_(float("nan"))
            try:
                out = op.fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, clean, config=cfg)
            finally:
                op._new_output = real_new
            ref = fp8_mqa_logits_ref(q, k, k_scale, w, ks, ke)
            inside = torch.isfinite(ref)
            if clean and not torch.equal(torch.isneginf(out), ~inside):
                raise AssertionError(f"small case M={m} N={n}: -inf mask differs")
            if out[inside].isnan().any():
                raise AssertionError(f"small case M={m} N={n}: in-window cells unwritten")
            worst = max(worst, calc_diff(out[inside], ref[inside]))
        return worst

    jit = op.kernel(interpret=smoke)
    caches = getattr(jit, "device_caches", None)
    for name in names:
        spec = CONFIGS[name]
        for h in (16,) if smoke else HEADS:
            for clean in cleans:
                emit(event="start", config=name, h=h, clean=clean)
                try:
                    cfg = None if spec is None else op.TritonConfig(max(1, spec[0] // h), *spec[1:])
                    before = dict(caches[0][0]) if caches is not None else {}
                    t0 = time.time()
                    worst_small = small_cases(cfg, h, clean)
                    compile_s = time.time() - t0
                    after = caches[0][0] if caches is not None else {}
                    compiled = [v for k_, v in after.items() if k_ not in before]
                    regs = [getattr(c, "n_regs", None) for c in compiled]
                    spills = [getattr(c, "n_spills", None) for c in compiled]
                except Exception as e:  # compile failure or wrong numbers: report, go on
                    emit(event="fail", config=name, h=h, clean=clean, stage="small",
                         error=f"{type(e).__name__}: {str(e)[:400]}")
                    continue
                for label, m, n, off in shapes:
                    q, k, k_scale, w, ks, ke, rows, ref, pairs = bench_inputs(m, n, h, off)
                    try:
                        fn = lambda: op.fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, clean, config=cfg)
                        out = fn()
                        cols = torch.arange(n, device=dev)[None, :]
                        inside = (cols >= ks[:, None]) & (cols < ke.clamp(max=n)[:, None])
                        mask_ok = torch.equal(torch.isneginf(out), ~inside) if clean else True
                        got = out[rows]
                        keep = inside[rows]
                        finite = bool(torch.isfinite(got[keep]).all())
                        diff = calc_diff(got[keep], ref[keep]) if finite else float("inf")
                        del out, inside
                        ms = median_ms(fn)
                        emit(event="result", config=name, h=h, clean=clean, shape=label, m=m, n=n,
                             ms=ms, tflops=2 * h * D * pairs / (ms * 1e-3) / 1e12, calc_diff=diff,
                             mask_ok=mask_ok, ok=bool(mask_ok and diff < 1e-3), small_diff=worst_small,
                             compile_s=round(compile_s, 1), regs=regs, spills=spills,
                             cfg=str(cfg or op.default_config("sm_90", h)))
                    except Exception as e:
                        emit(event="fail", config=name, h=h, clean=clean, stage=label,
                             error=f"{type(e).__name__}: {str(e)[:400]}")
                    if not smoke:
                        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- parent
@contextlib.contextmanager
def _killed_on_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_phase(names: list[str], cleans: list[bool], flags: list[str], deadline: float,
              rows: list[dict]) -> None:
    """Run ``names`` in workers, restarting after a crash or a hang with the configs not yet started."""
    todo = list(names)
    while todo and time.time() < deadline:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--configs", ",".join(todo),
               "--cleans", ",".join(str(int(c)) for c in cleans)] + flags
        with tempfile.TemporaryFile("w+") as err, _killed_on_exit(
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)) as proc:
            # stderr goes to a file, not a pipe: a chatty worker never blocks
            state = {"current": None, "since": time.time(), "why": None}

            def watchdog() -> None:  # kills a worker stuck in one config (no output to wake the loop)
                while proc.poll() is None:
                    if time.time() - state["since"] > CONFIG_TIMEOUT_S:
                        state["why"] = "timeout"
                        proc.kill()
                    time.sleep(1.0)

            threading.Thread(target=watchdog, daemon=True).start()
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if row["event"] == "start":
                    if row["config"] != state["current"]:
                        if state["current"] in todo:
                            todo.remove(state["current"])
                        if time.time() > deadline:
                            log(f"time budget reached: skipping {todo}")
                            state["why"] = "budget"
                            proc.kill()
                            break
                        state["current"] = row["config"]
                    state["since"] = time.time()
                    log(f"  {row['config']} H={row['h']} clean={row['clean']} ...")
                    continue
                rows.append(row)
                if row["event"] == "fail":
                    log(f"  FAIL {row['config']} H={row['h']} {row['stage']}: {row['error']}")
                else:
                    log(f"  {row['config']:>13} H={row['h']} clean={int(row['clean'])} {row['shape']:>9}: "
                        f"{row['ms']:.3f} ms {row['tflops']:.0f} TF/s diff={row['calc_diff']:.1e} "
                        f"ok={row['ok']} regs={row['regs']}")
            proc.wait()
            current = state["current"]
            if state["why"] == "budget":
                return
            if current in todo:
                todo.remove(current)
            if proc.returncode == 0:
                return
            err.seek(0)
            tail = err.read()[-600:]
            rows.append({"event": "fail", "config": current, "stage": state["why"] or "worker died",
                         "error": f"exit {proc.returncode}: {tail}"})
            log(f"  worker {state['why'] or 'died'} in {current}: {tail[-300:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--cleans", default="1")
    ap.add_argument("--quick", action="store_true", help="one shape, fewer rows and repetitions")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter): tests the script")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        sys.exit(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    if args.worker:
        worker(names, [bool(int(c)) for c in args.cleans.split(",")], args.quick, args.smoke)
        return

    import torch
    import triton

    t0 = time.time()
    deadline = t0 + args.budget - RESERVE_S
    rows: list[dict] = []
    device = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name()
    flags = ["--quick"] * args.quick + ["--smoke"] * args.smoke

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"signal {signum}: reporting what finished")

    signal.signal(signal.SIGTERM, stop)
    log(f"device {device}, torch {torch.__version__}, triton {triton.__version__}")
    try:
        log("phase 1: clean_logits=True, every config")
        run_phase(names, [True], flags, deadline, rows)
        ok = [r for r in rows if r["event"] == "result" and r["ok"]]
        best: list[str] = ["default"] if "default" in names else []
        for h in HEADS + (16,):  # the fastest per H by total time over the shapes
            total: dict[str, float] = {}
            for r in ok:
                if r["h"] == h:
                    total[r["config"]] = total.get(r["config"], 0.0) + r["ms"]
            best += [c for c in sorted(total, key=total.__getitem__) if c not in best][:1]
        log(f"phase 2: clean_logits=False, {best}")
        run_phase(best, [False], flags, deadline, rows)
    finally:
        report(rows, device, time.time() - t0)


def report(rows: list[dict], device: str, seconds: float) -> None:
    import torch
    import triton

    lines = [f"{'config':>16} {'H':>3} {'clean':>5} {'shape':>9} {'ms':>8} {'TF/s':>6} {'calc_diff':>9} "
             f"{'ok':>3} {'regs':>5} {'spills':>6}"]
    for r in rows:
        if r["event"] == "result":
            lines.append(f"{r['config']:>16} {r['h']:>3} {int(r['clean']):>5} {r['shape']:>9} {r['ms']:>8.3f} "
                         f"{r['tflops']:>6.0f} {r['calc_diff']:>9.1e} {'yes' if r['ok'] else 'NO':>3} "
                         f"{str(r['regs'][0] if r['regs'] else '-'):>5} "
                         f"{str(r['spills'][0] if r['spills'] else '-'):>6}")
        else:
            lines.append(f"{r.get('config', '?'):>16} {r.get('h', '-'):>3} {int(r.get('clean', 1)):>5} "
                         f"FAILED at {r['stage']}: {r['error'][:120]}")
    lines.append(f"total {seconds:.0f} s; the JSON's cfg field gives block_m/n, warps, stages, tma")
    print("\n".join(lines), flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "h200_triton_sweep.json"), "w") as f:
            json.dump({"device": device, "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
