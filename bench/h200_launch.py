"""Issues 11 and 14: what the launchers cost the host per call, side by side with DeepGEMM.

    PYTHONPATH=.deepgemm:providers/gluon:providers/torch_ref:. python bench/h200_launch.py   # H200, < 1 min
    python bench/h200_launch.py --cpu    # here: Triton's host path under the host-only driver
    python bench/h200_launch.py --paged [--cpu]    # the decode op instead (see "Paged" below)

One shape, the issue's: M=128, N=2048, H=64, D=128, causal, clean_logits=True. Rows (each a call an
engine or the core could make; all in one process, timed in interleaved rounds):

- ``deepgemm``: ``deep_gemm.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, True)``, its whole C++ call
  (absent when DeepGEMM does not import; the reason is printed);
- ``gluon api``: ``mqa_core.fp8_mqa_logits(q, (k, k_scale), w, ks, ke)`` under ``MQA_PROVIDER=gluon``;
- ``gluon provider`` / ``triton provider``: ``Provider.fp8_mqa_logits`` of the provider of that name
  (``mqa_core.testing.providers.provider_named``);
- ``gluon object`` / ``triton object``: the kernel objects the providers load,
  ``mqa_provider_gluon.kernels.GLUON|TRITON.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=True)``;
- ``gluon bound`` / ``triton bound``: the launchers, ``fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, True)``
  (``ops.mqa_logits_gluon_sm90``) and ``fp8_mqa_logits_triton(...)`` (``ops.mqa_logits_triton``), whose
  repeated calls launch the bound kernel;
- ``gluon triton-run`` / ``triton triton-run``: the same with ``direct=False``: Triton's
  ``JITFunction.run`` on every call (what every call cost before, less the per-call conversions);
- ``torch.empty``: the output's allocation alone, the floor of any launcher.

The levels of one kernel, outermost first: api, provider, object (the kernel object), bound (the
kernel's launcher); as in ``--paged``.

Host us/call: ``calls`` calls back to back without a sync, divided by ``calls``; median over rounds.
On the GPU the device time of one call (CUDA-graph replay) is printed too: where it is below the host
figure the device kept up, so the host is what was timed. Every GPU row is checked first: the bound
launch equals Triton's launch bit for bit, and both match the float64 oracle (calc_diff < 1e-3, same
-inf mask). With ``--cpu`` tensors stay on the CPU, kernels are compiled for sm_90 but never run
(the C launch is a no-op): it measures the Python up to the launch, and the core's arch lookup
answers sm_90 for the CPU tensors (so the gluon and triton providers are chosen and validated as on
the H200). The table comes last; JSON rows go to ``$OUT/h200_launch.json``.

Paged (``--paged``): the decode op on B=32, H=64, D=128, 64-token blocks, contexts up to 4096, for
next_n in {2, 1} with 2-D and 1-D context lengths, clean_logits=False (DeepGEMM's only mode with
2-D lengths; ``PAGED_CLEAN``). Per provider P of ``PAGED_PROVIDERS`` (one pass each, under
``MQA_PROVIDER=P``), rows outermost first: ``P api`` (``mqa_core.fp8_paged_mqa_logits``), ``P provider``
(``Provider.fp8_paged_mqa_logits`` of ``get_provider(op="fp8_paged_mqa_logits")``), ``P prepared`` (the
kernel object's ``prepare_fp8_paged_mqa_logits`` call, what the api's remembered signatures run),
``P kernel`` (``fp8_paged_mqa_logits_triton`` / ``fp8_paged_mqa_logits_gluon``, default config), ``P compat``
(``mqa_core.compat.deep_gemm.fp8_paged_mqa_logits`` with the step's metadata: the public op with a
schedule, as an engine that swapped the import calls it); beside
them in the same rounds ``deepgemm`` (its whole call, metadata computed once) and ``torch.empty``. With
``--cpu`` the op modules see an sm_90 device with 132 SMs and stream 0, and the core's arch lookup
answers sm_90 for the CPU tensors (so both providers are chosen and validated as on the H200); what
``torch.cuda.current_device()`` and the stream query cost on a GPU
is therefore not in these figures. JSON rows go to ``$OUT/h200_launch_paged.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

M, N, H, D = 128, 2048, 64, 128


def inputs(device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(M, H, D, generator=g).to(torch.float8_e4m3fn)
    k = torch.randn(N, D, generator=g).to(torch.float8_e4m3fn)
    k_scale = torch.rand(N, generator=g) + 0.5
    w = torch.randn(M, H, generator=g) * H**-0.5
    ks = torch.zeros(M, dtype=torch.int32)
    ke = (torch.arange(M) + (N - M) + 1).to(torch.int32)
    return tuple(t.to(device) for t in (q, k, k_scale, w, ks, ke))


def graph_us(fn: Callable[[], Any], replays: int = 200) -> float | None:
    """Device time of one call: a CUDA graph of it, replayed."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / replays * 1e3
    except Exception as exc:  # a capture failure costs only this figure
        print(f"  (graph capture failed: {exc!r:.120})")
        return None


def check(out: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """The kit's bar (mqa_core.bench.verify): calc_diff < 1e-3 inside the windows, the same -inf mask."""
    from mqa_core.bench.verify import compare

    verdict = compare(out, ref, clean=True, against="float64 oracle")
    if not verdict.ok:
        raise AssertionError(f"{name}: {verdict.detail}")


#: The paged shape class (issue 11's typical decode step) and the cases timed on it.
PAGED_B, PAGED_H, PAGED_CTX, PAGED_BLOCK = 32, 64, 4096, 64
PAGED_CASES = ((2, True), (2, False), (1, True), (1, False))  # (next_n, 2-D context_lens)
#: The providers whose levels are timed, each in its own pass under MQA_PROVIDER (on sm_90 the gluon
#: provider's paged op is the warp-specialised Gluon kernel for these classes, triton's the Triton kernel).
PAGED_PROVIDERS = ("triton", "gluon")
#: DeepGEMM (54e2261) passes context lengths to its kernel as 2-D always and then refuses to clean
#: (``attention.hpp:398``): every row of the paged table runs without the clean pass, like engines call it.
PAGED_CLEAN = False


def start(a: argparse.Namespace, cpu_stage: Callable[[ExitStack], None], cpu_calls: int
          ) -> tuple[ExitStack, str, Callable[[], None], int] | None:
    """(the stack to run under, device, wait for it, calls per round): the CPU after
    ``cpu_stage(stack)`` with ``--cpu``, else the GPU; None, having said why, when there is no GPU."""
    stack = ExitStack()
    calls = a.calls or (cpu_calls if a.cpu else 500)
    if a.cpu:
        cpu_stage(stack)
        return stack, "cpu", lambda: None, calls
    if not torch.cuda.is_available():
        print("no CUDA device: run with --cpu here")
        return None
    return stack, "cuda", torch.cuda.synchronize, calls


def cpu_paged_stage(stack: ExitStack) -> None:
    """The paged op's GPU path on CPU tensors: an sm_90 device of 132 SMs, stream 0, no device switch,
    the host-only driver with a no-op C launch; the core's arch lookup answers sm_90."""
    import contextlib

    from mqa_provider_gluon import kernels
    from mqa_provider_gluon.host_driver import HostOnlyDriver, host_only
    from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as gl_op
    from mqa_provider_gluon.ops import paged_mqa_logits_gluon_sm90 as gp_op
    from mqa_provider_gluon.ops import paged_mqa_logits_triton as pg_op

    import mqa_core.api
    import mqa_core.arch

    sm90 = lambda device=None: "sm_90"  # noqa: E731
    pg_op._arch_of = sm90  # type: ignore[assignment]
    pg_op._device_facts = gp_op._device_facts = lambda index: (132, 65536, 233472, 2048)  # type: ignore
    gp_op.gluon_supported = gl_op.gluon_supported = lambda device=None: None  # type: ignore[assignment]
    # the provider's own choice for an sm_90 device 0 (CPU tensors report device -1)
    real_launcher = kernels.paged_launcher
    kernels.paged_launcher = lambda use_gluon, index: real_launcher(use_gluon, 0)  # type: ignore[assignment]
    pg_op._stream = lambda index: 0  # type: ignore[assignment]
    torch.cuda.device = lambda device: contextlib.nullcontext()  # type: ignore[assignment,misc]
    mqa_core.api.arch_of_device = sm90  # type: ignore[assignment]
    mqa_core.arch.arch_of_device = sm90  # type: ignore[assignment]
    stack.enter_context(host_only(HostOnlyDriver(launch=lambda *args: None)))


def paged_rows(device: str, next_n: int, lens_2d: bool, name: str) -> dict[str, Callable[[], Any]]:
    """One zero-argument call per level of provider ``name`` (run under ``MQA_PROVIDER=name``) on one
    paged input (methods bound once, as an engine would), then DeepGEMM's call and the allocation."""
    from mqa_provider_gluon import kernels
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import fp8_paged_mqa_logits_gluon
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton

    import mqa_core
    from mqa_core.compat import deep_gemm as compat
    from mqa_core.testing import make_paged_inputs

    x = make_paged_inputs(PAGED_B, next_n, PAGED_H, D, PAGED_CTX, block_size=PAGED_BLOCK, device=device,
                          seed=next_n, lens_2d=lens_2d)
    args, n = x.args(), x.max_context_len
    # the step's schedule, once for all its calls: what compat's get_paged_mqa_logits_metadata returns
    # (mqa_core.paged_schedule over the device's multiprocessors; the CPU stage's sm_90 has 132)
    step_meta = mqa_core.paged_schedule(x.context_lens, 132 if device == "cpu" else None)
    provider = mqa_core.get_provider("sm_90" if device == "cpu" else None, op="fp8_paged_mqa_logits",
                                     dtype=x.q.dtype)
    if provider.name != name:
        raise RuntimeError(f"MQA_PROVIDER={name} chose {provider.name}")
    api_fn, provider_fn = mqa_core.fp8_paged_mqa_logits, provider.fp8_paged_mqa_logits
    obj = kernels.GLUON if name == "gluon" else kernels.TRITON
    kernel = {"gluon": fp8_paged_mqa_logits_gluon, "triton": fp8_paged_mqa_logits_triton}[name]
    obj.fp8_paged_mqa_logits(*args, clean_logits=PAGED_CLEAN)  # compiles and binds
    prepared = obj.prepare_fp8_paged_mqa_logits(*args, clean_logits=PAGED_CLEAN)
    if prepared is None:
        raise RuntimeError(f"{name}: no prepared call for this signature")
    rows: dict[str, Callable[[], Any]] = {
        f"{name} api": lambda: api_fn(*args, clean_logits=PAGED_CLEAN),
        f"{name} provider": lambda: provider_fn(*args, clean_logits=PAGED_CLEAN),
        f"{name} prepared": lambda: prepared(*args[:5]),
        f"{name} kernel": lambda: kernel(*args, PAGED_CLEAN),
        f"{name} compat": lambda: compat.fp8_paged_mqa_logits(x.q, x.kv_cache, x.weights, x.context_lens,
                                                              x.block_tables, step_meta, n, PAGED_CLEAN),
    }
    if device != "cpu":
        try:
            import deep_gemm

            # DeepGEMM 54e2261 takes 2-D lengths only (attention.hpp:200): 1-D ones become what each row sees
            lens = x.context_lens if x.context_lens.dim() == 2 else (
                x.context_lens[:, None] + torch.arange(1 - next_n, 1, device=device, dtype=torch.int32)).contiguous()
            meta = deep_gemm.get_paged_mqa_logits_metadata(lens, PAGED_BLOCK, deep_gemm.get_num_sms())
            rows["deepgemm"] = lambda: deep_gemm.fp8_paged_mqa_logits(x.q, x.kv_cache, x.weights, lens,
                                                                       x.block_tables, meta, n, PAGED_CLEAN)
        except Exception as exc:
            print(f"DeepGEMM not importable ({exc!r:.160}): its row stays empty")
    m = PAGED_B * next_n
    rows["torch.empty"] = lambda: torch.empty((m, n), dtype=torch.float32, device=device)
    return rows


def main_paged(a: argparse.Namespace) -> int:
    """``--paged``: the decode op's host cost per level; the table comes last."""
    from mqa_core.bench.host import host_costs
    from mqa_core.testing.providers import environment

    started = start(a, cpu_paged_stage, cpu_calls=1000)
    if started is None:
        return 2
    stack, device, wait, calls = started
    table: dict[str, dict[str, float]] = {}
    with stack:
        for provider in PAGED_PROVIDERS:
            with environment(MQA_PROVIDER=provider):
                for next_n, lens_2d in PAGED_CASES:
                    case = f"next_n={next_n} lens {'2-D' if lens_2d else '1-D'}"
                    rows = paged_rows(device, next_n, lens_2d, provider)
                    for fn in rows.values():  # first calls compile and bind
                        fn()
                    costs = host_costs(rows, wait, calls=calls, rounds=a.rounds, warmup=20)
                    # DeepGEMM and the allocation are timed beside each provider: the last pass's stay
                    table.setdefault(case, {}).update({name: cost.median for name, cost in costs.items()})
    import triton
    from mqa_provider_gluon.launch import direct_launch_unsupported

    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "python": platform.python_version(),
            "torch": torch.__version__, "triton": triton.__version__, "mode": "cpu host-only" if a.cpu else "cuda",
            "direct": direct_launch_unsupported() or "on",
            "device": torch.cuda.get_device_name() if not a.cpu else platform.processor() or "cpu",
            "b": PAGED_B, "h": PAGED_H, "d": D, "context": PAGED_CTX, "block": PAGED_BLOCK,
            "calls": calls, "rounds": a.rounds}
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "h200_launch_paged.json"), "w") as f:
            json.dump({"meta": meta, "host_us": table}, f, indent=1)
    names = list(dict.fromkeys(n for row in table.values() for n in row))
    print(f"\n{meta['date']}  {meta['device']} ({meta['mode']})  torch {meta['torch']}  triton {meta['triton']}  "
          f"paged B={PAGED_B} H={PAGED_H} D={D} context {PAGED_CTX} block {PAGED_BLOCK} "
          f"{'clean' if PAGED_CLEAN else 'no clean'}  "
          f"({calls} calls x {a.rounds} rounds, median host us/call; direct launches {meta['direct']})")
    width = {n: max(9, len(n) + 2) for n in names}
    print(f"{'case':<20}" + "".join(f"{n:>{width[n]}}" for n in names))
    for case, row in table.items():
        print(f"{case:<20}" + "".join(f"{row[n]:>{width[n]}.1f}" if n in row else f"{'-':>{width[n]}}"
                                      for n in names))
    return 0


def core_rows(device: str, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor,
              ks: torch.Tensor, ke: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """The core's levels of prefill: the public call (under MQA_PROVIDER=gluon, which the caller sets)
    and each provider's method (bound once, as an engine would)."""
    import mqa_core
    from mqa_core.testing.providers import provider_named

    arch = "sm_90" if device == "cpu" else mqa_core.arch.arch_of_device(q.device)
    gluon, triton_ = (provider_named(name, arch, dtype=q.dtype).fp8_mqa_logits for name in ("gluon", "triton"))
    api_fn = mqa_core.fp8_mqa_logits
    return {"gluon api": lambda: api_fn(q, kv, w, ks, ke, clean_logits=True),
            "gluon provider": lambda: gluon(q, kv, w, ks, ke, clean_logits=True),
            "triton provider": lambda: triton_(q, kv, w, ks, ke, clean_logits=True)}


def cpu_prefill_stage(stack: ExitStack) -> None:
    """The prefill launchers' GPU path on CPU tensors: one sm_90 device with 132 SMs, the host-only
    driver with a no-op C launch, the core's arch lookup answering sm_90."""
    from mqa_provider_gluon import kernels
    from mqa_provider_gluon.host_driver import HostOnlyDriver, host_only
    from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as gl_op
    from mqa_provider_gluon.ops import mqa_logits_triton as tr_op

    import mqa_core.api
    import mqa_core.arch

    sm90 = lambda device=None: "sm_90"  # noqa: E731
    tr_op._device_facts = lambda index: ("sm_90", 4 * 132)  # type: ignore[assignment]
    gl_op.gluon_supported = lambda device=None: None  # type: ignore[assignment]
    gl_op._multiprocessors = lambda index: 132  # type: ignore[assignment]
    kernels.prefill_launcher = (  # type: ignore[assignment]
        lambda use_gluon, index: gl_op.fp8_mqa_logits_gluon if use_gluon else tr_op.fp8_mqa_logits_triton)
    mqa_core.api.arch_of_device = sm90  # type: ignore[assignment]
    mqa_core.arch.arch_of_device = sm90  # type: ignore[assignment]
    stack.enter_context(host_only(HostOnlyDriver(launch=lambda *args: None)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="host-only driver on this machine (no GPU)")
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--paged", action="store_true", help="the decode op's levels instead of prefill's launchers")
    a = ap.parse_args()
    if a.paged:
        return main_paged(a)
    from mqa_provider_gluon import kernels
    from mqa_provider_gluon.ops import mqa_logits_gluon_sm90 as gl_op
    from mqa_provider_gluon.ops import mqa_logits_triton as tr_op

    from mqa_core.bench.host import host_costs
    from mqa_core.testing.providers import environment

    started = start(a, cpu_prefill_stage, cpu_calls=2000)
    if started is None:
        return 2
    stack, device, wait, calls = started
    q, k, k_scale, w, ks, ke = inputs(device)
    rows: dict[str, Callable[[], Any]] = {}
    try:
        import deep_gemm

        rows["deepgemm"] = lambda: deep_gemm.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, True)
    except Exception as exc:
        print(f"DeepGEMM not importable ({exc!r:.160}): its row stays empty")
    gluon_reason = None if a.cpu else gl_op.gluon_supported(torch.device(device))
    core = core_rows(device, q, (k, k_scale), w, ks, ke)
    if gluon_reason is None:
        rows["gluon api"], rows["gluon provider"] = core["gluon api"], core["gluon provider"]
        rows["gluon object"] = lambda: kernels.GLUON.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=True)
        rows["gluon bound"] = lambda: gl_op.fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, True)
        rows["gluon triton-run"] = lambda: gl_op.fp8_mqa_logits_gluon(q, k, k_scale, w, ks, ke, True, direct=False)
    else:
        print(f"Gluon kernel unavailable: {gluon_reason}")
    rows["triton provider"] = core["triton provider"]
    rows["triton object"] = lambda: kernels.TRITON.fp8_mqa_logits(q, (k, k_scale), w, ks, ke, clean_logits=True)
    rows["triton bound"] = lambda: tr_op.fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, True)
    rows["triton triton-run"] = lambda: tr_op.fp8_mqa_logits_triton(q, k, k_scale, w, ks, ke, True, direct=False)
    rows["torch.empty"] = lambda: torch.empty((M, N), dtype=torch.float32, device=device)

    from mqa_provider_gluon.launch import direct_launch_unsupported, hooks_active

    gate = direct_launch_unsupported() or ("triton launch hooks are registered" if hooks_active() else None)
    print(f"direct launches: {'on' if gate is None else 'OFF: ' + gate}")
    stack.enter_context(environment(MQA_PROVIDER="gluon"))
    with stack:
        t = time.time()
        for fn in rows.values():  # first calls compile and bind
            fn()
        print(f"first calls: {time.time() - t:.1f}s")
        if not a.cpu:
            from mqa_core.reference import fp8_mqa_logits_ref

            ref = fp8_mqa_logits_ref(q, k, k_scale, w, ks, ke)
            for which in ("gluon", "triton"):
                if f"{which} bound" not in rows:
                    continue
                run_path, bound = rows[f"{which} triton-run"](), rows[f"{which} bound"]()
                torch.cuda.synchronize()
                if not torch.equal(bound, run_path):
                    raise AssertionError(f"{which}: the bound launch differs from triton's launch")
                check(bound, ref, f"{which} bound")
                check(rows[f"{which} object"](), ref, f"{which} object")
            if "deepgemm" in rows:
                check(rows["deepgemm"](), ref, "deepgemm")
            print("checked: bound == triton launch bit for bit; all rows match the float64 oracle")
        costs = host_costs(rows, wait, calls=calls, rounds=a.rounds, warmup=20)
        device_us = {name: graph_us(fn) for name, fn in rows.items()} if not a.cpu else {}

    import triton

    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "python": platform.python_version(),
            "direct": gate or "on",
            "torch": torch.__version__, "triton": triton.__version__, "mode": "cpu host-only" if a.cpu else "cuda",
            "device": torch.cuda.get_device_name() if not a.cpu else platform.processor() or "cpu",
            "m": M, "n": N, "h": H, "d": D, "calls": calls, "rounds": a.rounds}
    base = costs["deepgemm"].median if "deepgemm" in costs else None
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "h200_launch.json"), "w") as f:
            json.dump({"meta": meta, "rows": {k: {"host_us": v.median, "wall_us": v.wall_median,
                                                  "device_us": device_us.get(k)} for k, v in costs.items()}},
                      f, indent=1)
    print(f"\n{meta['date']}  {meta['device']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"M={M} N={N} H={H} D={D} clean  ({calls} calls x {a.rounds} rounds, medians; direct launches "
          f"{meta['direct']})")
    print(f"{'row':<18} {'host us/call':>12} {'with sync':>10} {'device us':>10} {'x deepgemm':>10}")
    for name, cost in costs.items():
        host, wall, dev = cost.median, cost.wall_median, device_us.get(name)
        ratio = f"{host / base:.2f}" if base else "-"
        print(f"{name:<18} {host:>12.1f} {wall:>10.1f} {(f'{dev:.1f}' if dev else '-'):>10} {ratio:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
