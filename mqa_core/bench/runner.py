"""The benchmark loop: for each workload, check every provider against a reference, then time it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import ProviderUnavailableError
from ..provider import Provider
from ..select import shape_reason
from ..testing.providers import provider_named
from .report import tflops_text
from .timing import Timing, graph_time, sync, time_calls, time_interleaved
from .verify import Verdict, check_selection, compare
from .workloads import Workload, input_sets


def reference(w: Workload, x: Any, providers: Mapping[tuple[str, str], Provider], arch: str
              ) -> tuple[torch.Tensor | None, str]:
    """The float64 oracle when it fits, else torch_ref (exact fp32) on the same device, else none.
    A top-k workload's reference is its inputs' clean logits, which its selection is judged on."""
    w = w.logits_only()
    if w.oracle_fits():
        return w.float64_reference(x), "float64 oracle"
    ref = providers.get(("torch_ref", w.op))
    if ref is None:
        try:
            ref = provider_named("torch_ref", arch, op=w.op)
        except ProviderUnavailableError:
            return None, ""
    return w.run(ref, x), "torch_ref (fp32)"


#: How ``run_workloads`` times the providers that passed the check, by the name rows give in ``timing``.
TIMING = {
    "per-call": "CUDA events around each single call, one provider after another (time_calls)",
    "interleaved": "batches of back-to-back calls lasting >= 1 ms, all providers of a workload once per "
                   "round (time_interleaved): what an engine sees, drift shared; use it to compare",
}


def time_providers(calls: Mapping[str, Callable[[Any], Any]], sets: Sequence[Any], device: torch.device,
                   timing: str, *, warmup: int, repeat: int) -> dict[str, Timing]:
    """Each call's Timing by the method ``timing`` names (a key of ``TIMING``); ``repeat`` samples each."""
    if timing == "interleaved":
        return time_interleaved(calls, sets, device, warmup=warmup, rounds=repeat)
    return {name: time_calls(call, sets, device, warmup=warmup, repeat=repeat) for name, call in calls.items()}


def run_workloads(work: Sequence[Workload], names: Sequence[str],
                  providers: Mapping[tuple[str, str], Provider], device: torch.device, arch: str, *,
                  warmup: int, repeat: int, seed: int = 0, peak: float | None = None,
                  common: Mapping[str, Any] | None = None, graph: bool = False, timing: str = "per-call",
                  progress: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One row per (workload, provider): status ok (timed), wrong, error or skipped, with the reason.

    Every provider of a workload is checked first, then the correct ones are timed by ``timing`` (a
    key of ``TIMING``, named in each row; ``repeat`` samples, each of ``calls_per_sample`` calls).
    With ``graph`` (CUDA only), each correct provider is also timed replaying a CUDA graph of its
    calls (``graph_ms``: the device's time alone) besides ``ms_median``.
    """
    if timing not in TIMING:
        raise ValueError(f"timing must be one of {', '.join(TIMING)}, got {timing!r}")
    rows: list[dict[str, Any]] = []
    for i, w in enumerate(work, 1):
        tag = f"[{i}/{len(work)}] {w.name}"
        sets = [w.setup(device, seed + j) for j in range(input_sets(w, device))]
        pairs, flops = w.valid_pairs(sets[0]), w.flops(sets[0])
        ref_out: torch.Tensor | None = None
        against = ""
        passed: dict[str, tuple[dict[str, Any], Verdict]] = {}
        calls: dict[str, Callable[[Any], torch.Tensor]] = {}
        for name in names:
            row: dict[str, Any] = {
                "record": "time", "provider": name, "workload": w.name, "label": w.label, "op": w.op,
                "kind": w.kind, "m": w.problem.m, "n": w.problem.n, "h": w.problem.h, "d": w.problem.d,
                "batch": w.batch or None, "next_n": w.next_n or None, "requests": len(w.requests) or None,
                "window": w.window or None, "clean": w.clean, "valid_pairs": pairs, "flops": flops,
                "repeat": repeat, "warmup": warmup, "input_sets": len(sets), "timing": timing, **(common or {})}
            rows.append(row)
            provider = providers.get((name, w.op))
            reason = f"does not declare {w.op}" if provider is None else shape_reason(provider.spec, w.problem)
            if reason:
                row.update(status="skipped", reason=reason)
                progress(f"{tag} {name}: skipped ({reason})")
                continue
            assert provider is not None
            if ref_out is None and not against:
                ref_out, against = reference(w, sets[0], providers, arch)
                against = against or "none"
            try:
                base = memory_mark(device)
                out = w.run(provider, sets[0])
                sync(device)
                row["peak_mib"] = peak_mib(device, base)
                if ref_out is None:
                    verdict = Verdict(True, float("nan"), True, "none", "unverified: no reference here")
                elif w.topk:
                    verdict = check_selection(out, ref_out, *w.key_windows(sets[0]), w.topk, against=against)
                else:
                    verdict = compare(out, ref_out, clean=w.clean, against=against)
                del out
            except Exception as exc:  # a crashing provider is reported; the others still run
                row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
                progress(f"{tag} {name}: ERROR {row['reason']}")
                continue
            row.update(calc_diff=None if w.topk else verdict.calc_diff, mask_identical=verdict.mask_identical,
                       verified_against=verdict.against)
            if not verdict.ok:
                row.update(status="wrong", reason=verdict.detail)
                progress(f"{tag} {name}: WRONG vs {against}: {verdict.detail}")
                continue

            def call(x: Any, w: Workload = w, p: Provider = provider) -> torch.Tensor:
                return w.run(p, x)

            passed[name], calls[name] = (row, verdict), call
        timings = time_providers(calls, sets, device, timing, warmup=warmup, repeat=repeat) if calls else {}
        for name, (row, verdict) in passed.items():
            extra = timed_row(row, timings[name], flops, peak)
            if graph and device.type == "cuda":
                extra += graph_columns(row, calls[name], sets, device, flops)
            check = "selection accepted" if w.topk else f"calc_diff {verdict.calc_diff:.1e}"
            progress(f"{tag} {name}: ok ({check} vs {against}), "
                     f"{row['ms_median']:.3f} ms, {tflops_text(row['tflops'])} TFLOP/s{extra}")
        del sets, ref_out, calls
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def memory_mark(device: torch.device) -> int | None:
    """Start measuring the peak memory of the next call on ``device``: its allocated bytes now, the
    peak counter reset (CUDA and ROCm); None where torch keeps no such counter (the CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def peak_mib(device: torch.device, mark: int | None) -> float | None:
    """MiB the calls since :func:`memory_mark` held at their peak beyond what was allocated before
    (the output included): the ``peak MiB`` column of ``mqa bench``."""
    if mark is None:
        return None
    return (int(torch.cuda.max_memory_allocated(device)) - mark) / 2**20


def timed_row(row: dict[str, Any], t: Timing, flops: float, peak: float | None) -> str:
    """Fill a correct provider's row from its Timing; the progress text it adds (the batch size)."""
    s = t.summary()
    tflops = flops / (s["median"] * 1e-3) / 1e12
    row.update(status="ok", ms_median=s["median"], ms_p10=s["p10"], ms_p90=s["p90"], ms_min=s["min"],
               ms_mean=s["mean"], tflops=tflops, pct_peak=None if peak is None else 100 * tflops / peak,
               calls_per_sample=t.calls)
    return f" (batches of {t.calls} calls)" if t.calls > 1 else ""


def graph_columns(row: dict[str, Any], call: Callable[[Any], Any], sets: Sequence[Any], device: torch.device,
                  flops: float) -> str:
    """CUDA-graph replay columns of a row; the progress text they add. A capture that fails costs these
    columns, not the run."""
    try:
        g, note = graph_time(call, sets, device)
    except Exception as exc:
        g, note = None, f"CUDA graph capture failed: {type(exc).__name__}: {exc}"
    if g is None:
        row.update(graph_ms=None, graph_note=note)
        return ""
    row.update(graph_ms=g.median, graph_tflops=flops / (g.median * 1e-3) / 1e12)
    return f", graph replay {g.median:.3f} ms"
