"""Decode (paged fp8 MQA logits) on ragged batches: Triton variants, mqa-core's public op and DeepGEMM
on the same inputs in one process. Checks, then times, then the tables (always printed, last).

    python bench/h200_decode_vs_deepgemm.py            # from the repo root, providers installed,
                                                       # DeepGEMM on PYTHONPATH; < 150 s on an H200
    --variants tma,pipe   Triton variants to time (default: DEFAULT_VARIANTS; "all": every one);
                          NAME+field=INT replaces PagedConfig fields, e.g. tma+programs_per_sm=2
    --budget S            no new (B, C) group after S seconds from process start (default 105)
    --deadline S          at S seconds the tables are printed from what was measured and the process
                          exits, even if a kernel hangs (default 140)
    --quick               three (B, C) groups

Inputs, as engines see them: B in {32, 128, 256} sequences whose contexts are uniform in [C/2, C]
for C in {4k, 16k, 64k}, next_n in {1, 2}, H in {32, 64}, D = 128, a shuffled 64-token page pool,
2-D context lengths by DeepGEMM's rule (row j sees ctx - next_n + j + 1), fp8 values with a
bounded exponent, float32 scales in [0.1, 1]. Groups run most telling first (ORDER), so a budget cut
keeps those; within a group next_n = 2, H = 64 (the largest gap) first.

Correctness, per shape and implementation: calc_diff < 1e-3 against an fp32 PyTorch computation
(gather through the block table, upcast, matmul) on sampled sequences, inside each row's context;
mqa-core's op also with clean_logits=True over the whole output, where the -inf mask must equal the
contexts exactly. Outputs are poisoned (NaN) before the checked calls. DeepGEMM's schedule metadata
is computed once per shape from that shape's lengths (outside the timed calls, as engines do).

Speed: each implementation with clean_logits=False (DeepGEMM's only mode with 2-D lengths) captured
in a CUDA graph that calls it on R different caches in turn (R x bytes >= 256 MB, so the 50 MB L2
cannot serve repeats). The graphs of one shape are replayed interleaved: 15 rounds, each replaying
every implementation's graph once in an order rotated by one per round, so drift (clocks, power,
memory) falls on all alike. Time: the median over rounds / R; x DeepGEMM: the median over rounds of
the ratio of the two times of one round (paired). DeepGEMM's calls are captured twice, and the second
graph is timed as one more implementation, ``deepgemm(again)``: its ratio is the run's noise floor
(one kernel against itself). GB/s counts each sequence's visible positions
rounded up to 64-token blocks x (D + 4) bytes read once, plus q, weights and the logits written;
%cp is of the device copy bandwidth measured here (eager 2 GiB -> 2 GiB copy_, read + write
counted, median of 9; a copy captured in a graph runs on a copy engine and reads ~35% lower).
With ``--separated`` every call in the graph follows a tiny plain kernel (one float incremented), and
the time of a graph of those alone (replayed in the same rounds) is subtracted: no call overlaps the
one before (a launch made dependent by PDL then waits on a kernel that neither triggers early nor is
the op), as when an engine's neighbouring kernels are launched plainly (approximate: the plain
kernels' own launch gaps partly hide behind the op's, so compare columns of one run). Without it
calls follow each other, and a kernel that lets the next one launch early
(``griddepcontrol.launch_dependents``) gains from it.
Host: microseconds per call of 40 back-to-back eager calls per shape (no sync inside; fewer calls
than the launch queue holds, so the GPU never holds the host back) for mqa-core's op, the Triton
kernel alone (its default config) and DeepGEMM (plus the compat layer in the host table).

``import deep_gemm`` may fail: then the DeepGEMM columns say so and everything else still runs.
JSON with every number goes to $OUT/h200_decode_vs_deepgemm.json when $OUT is set.
"""

from __future__ import annotations

import time

T_IMPORT = time.time()

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from mqa_core.bench.timing import batch_ms, interleaved  # noqa: E402

D, BLOCK = 128, 64
#: (B, C) groups in the order they run: the most telling first, so a budget cut keeps them.
ORDER = [(128, 16384), (32, 4096), (256, 65536), (32, 65536), (256, 4096), (128, 65536), (32, 16384),
         (256, 16384), (128, 4096)]
QUICK = [(128, 16384), (32, 4096), (256, 65536)]
#: (next_n, H) within a group: the largest gap to DeepGEMM first.
KINDS = [(2, 64), (1, 32), (2, 32), (1, 64)]
#: Triton variants timed by default: the current defaults and the pipelined loop.
DEFAULT_VARIANTS = ("tma", "rows", "pipe", "pipetma", "piperows")
#: ``--cpu-smoke``: the whole flow on the CPU (Triton interpreter, eager timing, tiny shapes).
SMOKE = {"order": [(3, 300), (2, 130)]}
DEVICE = "cuda"
HOST_CALLS = 40
#: ``--separated``: a plain kernel before each timed call (see the module docstring).
SEPARATED = False
#: Rounds of the interleaved timing (each replays every implementation's graph once).
ROUNDS = 15
#: The name of DeepGEMM's second graph, timed as one more implementation: its ratio to DeepGEMM is the
#: run's own noise floor (an A/A comparison of one kernel with itself).
DG_AGAIN = "deepgemm(again)"


def process_start() -> float:
    """When this process started (Linux /proc), else when this module was first imported."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        start = boot + ticks / os.sysconf("SC_CLK_TCK")
        return start if start <= T_IMPORT else T_IMPORT
    except (OSError, ValueError, StopIteration, IndexError):
        return T_IMPORT


T0 = process_start()


def elapsed() -> float:
    return time.time() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


# -- inputs ----------------------------------------------------------------------------------------

class Batch:
    """One ragged batch: R page pools with the same contexts (for L2-proof timing) and their tables."""

    def __init__(self, batch: int, ctx: int, device: str, g: torch.Generator, copies: int) -> None:
        self.batch, self.ctx = batch, ctx
        self.lens = torch.randint(ctx // 2, ctx + 1, (batch,), generator=g, device=device, dtype=torch.int32)
        self.lens_host = self.lens.tolist()
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

    def operands(self, next_n: int, h: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh q [B, next_n, H, D] (fp8) and weights [B * next_n, H] for this batch, on its device."""
        dev = self.lens.device
        q = (torch.randn(self.batch, next_n, h, D, generator=g, device=dev) * 1.5).to(torch.float8_e4m3fn)
        return q, torch.randn(self.batch * next_n, h, generator=g, device=dev) * h ** -0.5

    def lens_2d(self, next_n: int) -> torch.Tensor:
        j = torch.arange(next_n, device=self.lens.device, dtype=torch.int32)
        return (self.lens[:, None] - next_n + 1 + j[None, :]).contiguous()

    def nbytes(self, next_n: int, h: int) -> int:
        return self.visible * (D + 4) + self.batch * next_n * h * (D + 4) + self.visible * next_n * 4


def copies_for(batch: int, ctx: int) -> int:
    one = batch * 0.75 * ctx * (D + 4)
    return int(min(16, max(1, -(-256e6 // one))))


# -- implementations -------------------------------------------------------------------------------
# An implementation is bound once per shape (q, weights, lengths, max_context_len, clean) and then
# called per cache: ``impl(q, w, lens, n, clean) -> call(cache, table) -> logits``. Binding per
# shape is what keeps DeepGEMM's schedule metadata tied to the lengths it was computed from.

Call = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, bool], Call]


def triton_impls(names: list[str]) -> dict[str, Impl]:
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import VARIANTS, fp8_paged_mqa_logits_triton

    def make(cfg: Any) -> Impl:
        def bind(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
            return lambda c, t: fp8_paged_mqa_logits_triton(q, c, w, lens, t, n, clean, config=cfg)
        return bind

    return {f"triton:{name}": make(variant_config(name, VARIANTS)) for name in names}


def gluon_impls(names: list[str]) -> dict[str, Impl]:
    """The warp-specialised Gluon kernel, per ``GluonPagedConfig`` (``ws``, with +field=INT edits; the
    edit ``+schedule=1`` passes a split computed once per shape by compat's
    ``get_paged_mqa_logits_metadata``, outside the timed calls as DeepGEMM's)."""
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import GluonPagedConfig, fp8_paged_mqa_logits_gluon

    from mqa_core.compat.deep_gemm import get_paged_mqa_logits_metadata

    def make(cfg: Any, scheduled: bool) -> Impl:
        def bind(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
            s = get_paged_mqa_logits_metadata(lens, BLOCK, num_sms(lens)) if scheduled else None
            return lambda c, t: fp8_paged_mqa_logits_gluon(q, c, w, lens, t, n, clean, config=cfg, schedule=s)
        return bind

    def split(name: str) -> tuple[str, bool]:
        base, *edits = name.split("+")
        return "+".join([base, *(e for e in edits if e != "schedule=1")]), "schedule=1" in edits

    return {f"gluon:{name}": make(variant_config(split(name)[0], {"ws": GluonPagedConfig()}), split(name)[1])
            for name in names}


def variant_config(name: str, variants: dict[str, Any]) -> Any:
    """``NAME`` or ``NAME+field=int+...``: a VARIANTS entry, with PagedConfig fields replaced (e.g.
    ``tma+programs_per_sm=2``), so a launch-shape question needs no new named variant."""
    import dataclasses

    base, *edits = name.split("+")
    if base not in variants:
        raise SystemExit(f"--variants: unknown {base!r} in {name!r}; known: {sorted(variants)}")
    fields = {f.name for f in dataclasses.fields(variants[base])}
    changes: dict[str, int] = {}
    for edit in edits:
        key, _, value = edit.partition("=")
        if key not in fields or not value.lstrip("-").isdigit():
            raise SystemExit(f"--variants: {edit!r} in {name!r} is not FIELD=INT of PagedConfig "
                             f"({', '.join(sorted(fields))})")
        changes[key] = int(value)
    try:
        return dataclasses.replace(variants[base], **changes)
    except ValueError as exc:
        raise SystemExit(f"--variants: {name!r}: {exc}") from None


def kernel_impl() -> Impl:
    """The Triton kernel alone with its default config (what mqa-core dispatches to on sm_90)."""
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton

    def bind(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
        return lambda c, t: fp8_paged_mqa_logits_triton(q, c, w, lens, t, n, clean)
    return bind


def public_impls() -> dict[str, Impl]:
    import mqa_core
    from mqa_core.compat import deep_gemm as compat

    def core(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
        return lambda c, t: mqa_core.fp8_paged_mqa_logits(q, c, w, lens, t, n, clean_logits=clean)

    def scheduled(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
        s = mqa_core.paged_schedule(lens, num_sms(lens))  # once per step, as an engine would
        return lambda c, t: mqa_core.fp8_paged_mqa_logits(q, c, w, lens, t, n, clean_logits=clean, schedule=s)

    def via_compat(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
        meta = compat.get_paged_mqa_logits_metadata(lens, BLOCK, num_sms(lens))
        return lambda c, t: compat.fp8_paged_mqa_logits(q, c, w, lens, t, meta, n, clean)

    return {"mqa_core": core, "mqa_core+schedule": scheduled, "compat": via_compat}


def num_sms(t: torch.Tensor) -> int:
    """Programs a schedule splits over: the device's multiprocessors (132 for the CPU smoke run)."""
    return torch.cuda.get_device_properties(t.device).multi_processor_count if t.is_cuda else 132


def deepgemm_impl(pdl: bool = False) -> tuple[Impl | None, str]:
    """DeepGEMM's op at its defaults, or with ``pdl`` launched as a programmatic dependent launch
    (``deep_gemm.set_pdl(True)`` around each call; off by default in DeepGEMM): the column to hold
    against mqa-core's own PDL launch, so a gain that is only the launch mode shows as such."""
    try:
        import deep_gemm
    except Exception as exc:  # absent or broken build: say so, run the rest
        return None, f"DeepGEMM: import deep_gemm failed: {type(exc).__name__}: {exc}"
    sms = deep_gemm.get_num_sms()

    def bind(q: torch.Tensor, w: torch.Tensor, lens: torch.Tensor, n: int, clean: bool) -> Call:
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK, sms)  # from these very lengths
        if not pdl:
            return lambda c, t: deep_gemm.fp8_paged_mqa_logits(q, c, w, lens, t, meta, n, clean)

        def call(c: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            deep_gemm.set_pdl(True)
            try:
                return deep_gemm.fp8_paged_mqa_logits(q, c, w, lens, t, meta, n, clean)
            finally:
                deep_gemm.set_pdl(False)
        return call

    return bind, f"DeepGEMM from {os.path.dirname(deep_gemm.__file__)}, {sms} SMs"


# -- checks ----------------------------------------------------------------------------------------

def oracle_rows(bt: Batch, q: torch.Tensor, w: torch.Tensor, lens2: torch.Tensor,
                seqs: list[int]) -> dict[int, torch.Tensor]:
    """fp32 logits [next_n, ctx] of the sampled sequences (cache copy 0), -inf outside each row's context."""
    from mqa_core.reference import split_paged_cache

    values, scales = split_paged_cache(bt.caches[0])
    values = values.view(torch.float8_e4m3fn)
    next_n, h = q.shape[1], q.shape[2]
    rows = {}
    for b in seqs:
        n = int(lens2[b].max())
        pos = torch.arange(max(n, 0), device=q.device)
        blk, off = bt.tables[0][b, pos // BLOCK].long(), pos % BLOCK
        k = values[blk, off].float()
        s = (q[b].float().reshape(next_n * h, D) @ k.T).relu_().view(next_n, h, -1)
        res = torch.einsum("jhn,jh->jn", s, w[b * next_n:(b + 1) * next_n]) * scales[blk, off][None, :]
        full = torch.full((next_n, bt.ctx), float("-inf"), device=q.device)
        full[:, :n] = torch.where(pos[None, :] < lens2[b][:, None], res, float("-inf"))
        rows[b] = full
    return rows


def check(out: torch.Tensor, rows: dict[int, torch.Tensor], lens2: torch.Tensor, clean: bool) -> dict:
    from mqa_core.testing.data import calc_diff

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
    """Median over ROUNDS replays of a graph that makes every call once, per call, in microseconds
    (the copy-bandwidth base; the implementations are timed by :func:`interleaved_us`)."""
    return interleaved_us({"one": calls})["one"][0]


def interleaved_us(groups: dict[str, list[Callable[[], Any]]],
                   errors: dict[str, str] | None = None) -> dict[str, tuple[float, list[float]]]:
    """Per group: (median microseconds per call, microseconds per call of each round). Every group's
    calls are captured in their own graph first; then each round replays every graph once, in an order
    rotated by one per round, so a drift of the clocks or the memory during the run falls on every
    group alike and a round's times compare with each other (paired ratios). With SEPARATED, each call
    follows a plain one-float kernel, and a graph of those alone, replayed in the same rounds, is
    subtracted. A group whose capture fails is left out (its error in ``errors``)."""
    if DEVICE == "cpu":  # smoke run: eager, one round
        out = {}
        for name, calls in groups.items():
            t = time.perf_counter()
            for c in calls:
                c()
            us = (time.perf_counter() - t) / len(calls) * 1e6
            out[name] = (us, [us])
        return out
    graphs: dict[str, Any] = {}
    plain_key = None
    if SEPARATED:
        bump = torch.zeros(1, device=DEVICE)

        def plain() -> None:
            bump.add_(1.0)

        n = len(next(iter(groups.values())))
        plain_key = "\0plain"
        graphs[plain_key] = _captured([plain] * n)
        groups = {k: [f for c in v for f in (plain, c)] for k, v in groups.items()}
    for name, calls in groups.items():
        try:
            graphs[name] = _captured(calls)
        except Exception as exc:
            traceback.print_exc()
            if errors is not None:
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    dev = torch.device(DEVICE)
    ms = interleaved({name: functools.partial(batch_ms, lambda _, g=g: g.replay(), (None,), 0, 1, dev)
                      for name, g in graphs.items()}, ROUNDS, rotate=True)
    times = {name: [t * 1e3 for t in v] for name, v in ms.items()}
    graphs.clear()
    out = {}
    for name, calls in groups.items():
        if name not in times:
            continue
        per = len(calls) // (2 if SEPARATED else 1)
        rounds = [(t - (times[plain_key][i] if plain_key else 0.0)) / per for i, t in enumerate(times[name])]
        out[name] = (statistics.median(rounds), rounds)
    return out


def _captured(calls: list[Callable[[], Any]]) -> Any:
    """A CUDA graph that makes ``calls`` in turn, warmed (eager calls, a side stream, 3 replays)."""
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
    return g


def paired_ratio(base: list[float], mine: list[float]) -> float:
    """Median over rounds of base / mine, each round's two times taken moments apart."""
    return statistics.median(b / m for b, m in zip(base, mine) if m > 0)


def host_us(call: Callable[[], Any]) -> float:
    """Host microseconds per call of back-to-back eager calls (no sync inside)."""
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    n = HOST_CALLS if DEVICE == "cuda" else 2
    for _ in range(5 if DEVICE == "cuda" else 1):
        call()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        call()
    per = (time.perf_counter() - t) / n * 1e6
    sync()
    return per


def copy_gbs() -> dict[str, float]:
    """Device copy bandwidth, read + written bytes: eager copy_ of 2 GiB into 2 GiB, median of 9
    (the base of %cp), and the same copy replayed from a graph (slower: for the record)."""
    if DEVICE == "cpu":
        return {"eager": float("nan"), "graph": float("nan")}
    n = 2**31
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(9):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    eager = 2 * n / statistics.median(times) / 1e9
    graph = 2 * n / (graph_us([lambda d=dst, s=src: d.copy_(s)]) * 1e-6) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return {"eager": eager, "graph": graph}


# -- the run ---------------------------------------------------------------------------------------

class Run:
    """Everything measured so far (read by the deadline watchdog, so it can print the tables)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.info: dict[str, Any] = {}
        self.shapes: list[dict] = []
        self.names: list[str] = []
        self.host_names: list[str] = []
        self.printed = False


RUN = Run()


def run_shape(bt: Batch, next_n: int, h: int, impls: dict[str, Impl], host_impls: dict[str, Impl],
              g: torch.Generator) -> dict:
    q, w = bt.operands(next_n, h, g)
    lens2 = bt.lens_2d(next_n)
    tag = f"B={bt.batch} C={bt.ctx} next_n={next_n} H={h}"
    seqs = sorted({0, bt.batch - 1, int(torch.argmax(bt.lens)), int(torch.argmin(bt.lens)), bt.batch // 2})
    rows = oracle_rows(bt, q, w, lens2, seqs)
    m, n = bt.batch * next_n, bt.ctx
    res: dict[str, Any] = {"B": bt.batch, "C": bt.ctx, "next_n": next_n, "H": h,
                           "bytes": bt.nbytes(next_n, h), "copies": len(bt.caches), "impls": {}, "host_us": {}}
    with RUN.lock:
        RUN.shapes.append(res)
    timed: dict[str, list[Callable[[], Any]]] = {}
    for name, impl in impls.items():
        r: dict[str, Any] = {}
        res["impls"][name] = r
        try:
            call = impl(q, w, lens2, n, False)
            out = poisoned_call(lambda call=call: call(bt.caches[0], bt.tables[0]), m, n)
            r["check"] = check(out, rows, lens2, clean=False)
            if name == "mqa_core":  # the whole -inf mask, once per shape
                clean = impl(q, w, lens2, n, True)
                out = poisoned_call(lambda clean=clean: clean(bt.caches[0], bt.tables[0]), m, n)
                r["check_clean"] = check(out, rows, lens2, clean=True)
            del out
            timed[name] = [lambda call=call, c=c, t=t: call(c, t) for c, t in zip(bt.caches, bt.tables)]
        except Exception as exc:
            traceback.print_exc()
            r["error"] = f"{type(exc).__name__}: {exc}"[:300]
    if "deepgemm" in timed:  # the A/A control: one more graph of the same DeepGEMM calls
        timed[DG_AGAIN] = list(timed["deepgemm"])
        res["impls"][DG_AGAIN] = {}
    errors: dict[str, str] = {}
    times = interleaved_us(timed, errors)
    dg_rounds = times.get("deepgemm", (0.0, []))[1]
    for name in timed:
        r = res["impls"][name]
        if name in errors:
            r["error"] = errors[name]
        if name not in times:
            continue
        r["graph_us"], r["round_us"] = times[name]
        r["GBps"] = res["bytes"] / (r["graph_us"] * 1e-6) / 1e9
        if dg_rounds:
            r["vs_deepgemm"] = paired_ratio(dg_rounds, r["round_us"])
        ok = r.get("check", {}).get("ok")
        log(f"{tag} {name:18s} {r['graph_us']:9.1f} us {r['GBps']:6.0f} GB/s ok={ok}"
            + (f" x{r['vs_deepgemm']:.3f}" if "vs_deepgemm" in r else ""))
    for name, impl in host_impls.items():
        try:
            call = impl(q, w, lens2, n, False)
            res["host_us"][name] = host_us(lambda call=call: call(bt.caches[0], bt.tables[0]))
        except Exception as exc:
            log(f"host cost {name}: {type(exc).__name__}: {exc}")
    log(f"{tag} host us/call: " + " ".join(f"{k} {v:.1f}" for k, v in res["host_us"].items()))
    return res


def summary(shapes: list[dict], names: list[str], host_names: list[str], info: dict) -> str:
    """The tables: per shape, then per implementation, then per (next_n, H) class, then host cost."""
    copy = info.get("copy_GBps", {}).get("eager", float("nan"))
    short = {n: n.replace("triton:", "") for n in names}
    lines = [f"\n{info.get('device', '?')}  torch {info.get('torch', '?')}  triton {info.get('triton', '?')}",
             info.get("deepgemm", "") + f"; mqa_core's op runs provider {info.get('mqa_core_provider', '?')}",
             f"copy bandwidth (read + write): {copy:.0f} GB/s eager copy_ (the %cp base); "
             f"{info.get('copy_GBps', {}).get('graph', float('nan')):.0f} GB/s when replayed from a graph",
             f"timing: {info.get('timing', '?')}"]
    checks = [(f"B={r['B']} C={r['C']} nn={r['next_n']} H={r['H']}", n, c)
              for r in shapes for n, i in r["impls"].items()
              for c in (i.get("check"), i.get("check_clean")) if c]
    bad = [(s, n, c) for s, n, c in checks if not c["ok"]]
    errors = [(f"B={r['B']} C={r['C']} nn={r['next_n']} H={r['H']}", n, i["error"])
              for r in shapes for n, i in r["impls"].items() if "error" in i]
    lines.append(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks ok"
                 + "".join(f"\n  FAILED {s} {n}: {c}" for s, n, c in bad)
                 + "".join(f"\n  ERROR {s} {n}: {e}" for s, n, e in errors))
    others = [n for n in names if n != "deepgemm"]
    lines.append("\nper shape: GB/s, x DeepGEMM (>1 faster), % of copy bandwidth; host us per eager call")
    head = f"{'B':>4} {'C':>6} {'nn':>2} {'H':>3} {'DG GB/s':>7} " + " ".join(f"{short[n][:14]:>15s}" for n in others)
    head += "  " + " ".join(f"{h[:8]:>8s}" for h in host_names)
    lines.append(head)
    for r in shapes:
        dg = r["impls"].get("deepgemm", {})
        cells = []
        for n in others:
            i = r["impls"].get(n, {})
            if "GBps" in i:
                ratio = f"{i['vs_deepgemm']:4.2f}" if "vs_deepgemm" in i else "   -"
                cells.append(f"{i['GBps']:5.0f} {ratio} {100 * i['GBps'] / copy:3.0f}")
            else:
                cells.append("error" if "error" in i else "-")
        host = " ".join(f"{r['host_us'][h]:8.1f}" if h in r["host_us"] else f"{'-':>8s}" for h in host_names)
        dg_cell = f"{dg['GBps']:7.0f}" if "GBps" in dg else f"{'-':>7s}"
        lines.append(f"{r['B']:4d} {r['C']:6d} {r['next_n']:2d} {r['H']:3d} {dg_cell} "
                     + " ".join(f"{c:>15s}" for c in cells) + "  " + host)
    lines.append("\nper implementation (x DeepGEMM over the shapes; % of copy bandwidth at next_n = 1):")
    for n in others:
        ratios = [r["impls"][n]["vs_deepgemm"] for r in shapes if "vs_deepgemm" in r["impls"].get(n, {})]
        pcts = [100 * r["impls"][n]["GBps"] / copy for r in shapes
                if r["next_n"] == 1 and "GBps" in r["impls"].get(n, {})]
        vs = (f"x DG min {min(ratios):.2f} median {statistics.median(ratios):.2f} "
              f">=1.0 on {sum(x >= 1.0 for x in ratios)}/{len(ratios)}" if ratios else "x DG -")
        bw = f"; next_n=1 %cp min {min(pcts):.0f} median {statistics.median(pcts):.0f}" if pcts else ""
        lines.append(f"  {short[n]:12s} {vs}{bw}")
    lines.append("\nbest kernel variant per (next_n, H) class (geomean x DeepGEMM over the class's shapes):")
    variants = [n for n in names if n.startswith(("triton:", "gluon:"))]
    for nn, h in sorted({(r["next_n"], r["H"]) for r in shapes}):
        cls = [r for r in shapes if (r["next_n"], r["H"]) == (nn, h)]
        scores = {}
        for n in variants:
            ratios = [r["impls"][n]["vs_deepgemm"] for r in cls if "vs_deepgemm" in r["impls"].get(n, {})]
            if ratios and len(ratios) == len(cls):
                scores[short[n]] = statistics.geometric_mean(ratios)
        ranked = sorted(scores.items(), key=lambda kv: -kv[1])
        lines.append(f"  next_n={nn} H={h}: " + ", ".join(f"{k} {v:.2f}" for k, v in ranked))
    lines.append("\neager host us per call (mean over shapes; per (next_n, H) class):")
    for hname in host_names:
        vals = [r["host_us"][hname] for r in shapes if hname in r["host_us"]]
        if not vals:
            continue
        per_cls = {}
        for nn, h in sorted({(r["next_n"], r["H"]) for r in shapes}):
            v = [r["host_us"][hname] for r in shapes if (r["next_n"], r["H"]) == (nn, h) and hname in r["host_us"]]
            if v:
                per_cls[f"{nn}/{h}"] = statistics.mean(v)
        dg = [r["host_us"]["deepgemm"] for r in shapes if "deepgemm" in r["host_us"] and hname in r["host_us"]]
        mine = [r["host_us"][hname] for r in shapes if "deepgemm" in r["host_us"] and hname in r["host_us"]]
        vs = f"  {statistics.mean(mine) / statistics.mean(dg):4.2f}x DeepGEMM" if dg else ""
        lines.append(f"  {hname:10s} {statistics.mean(vals):7.1f} us{vs}   "
                     + " ".join(f"{k}:{v:.1f}" for k, v in per_cls.items()))
    return "\n".join(lines)


def finish(reason: str) -> int:
    """Print the tables (once) and write the JSON; the exit status: 0 when every check passed."""
    with RUN.lock:
        if RUN.printed:
            return 0
        RUN.printed = True
        for _ in range(20):  # the watchdog may read while the main thread adds a result: retry
            try:
                shapes = json.loads(json.dumps([r for r in RUN.shapes if r["impls"]], default=str))
                break
            except RuntimeError:
                time.sleep(0.05)
        else:
            shapes = []
        info = dict(RUN.info, finished=reason, elapsed_s=elapsed())
        if os.environ.get("OUT"):
            try:
                with open(os.path.join(os.environ["OUT"], "h200_decode_vs_deepgemm.json"), "w") as f:
                    json.dump({**info, "shapes": shapes}, f, indent=1, default=str)
            except OSError as exc:
                print(f"could not write the JSON: {exc}", flush=True)
        print(f"\n=== {reason} after {elapsed():.0f} s: {len(shapes)} shapes", flush=True)
        print(summary(shapes, RUN.names, RUN.host_names, info), flush=True)
        ok = all(c["ok"] for r in shapes for i in r["impls"].values()
                 for c in (i.get("check"), i.get("check_clean")) if c)
        return 0 if ok else 1


def watchdog(deadline: float) -> threading.Timer:
    """At the deadline print what was measured and end the process (a hung kernel would otherwise
    leave no table at all)."""
    def fire() -> None:
        finish(f"deadline of {deadline:.0f} s reached")
        sys.stdout.flush()
        os._exit(3)
    timer = threading.Timer(max(1.0, deadline - elapsed()), fire)
    timer.daemon = True
    timer.start()
    return timer


def main() -> int:
    global DEVICE, SEPARATED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated Triton variants (VARIANTS names, each optionally with "
                             "+field=INT PagedConfig edits, e.g. tma+programs_per_sm=2) or 'all'")
    parser.add_argument("--gluon", default="",
                        help="comma-separated Gluon paged-kernel variants: ws, each optionally with "
                             "+field=INT GluonPagedConfig edits (e.g. ws+stages=16); default none")
    parser.add_argument("--deepgemm-pdl", action="store_true",
                        help="also time DeepGEMM launched as a programmatic dependent launch (set_pdl(True)), "
                             "the launch mode mqa-core's Gluon kernel uses by default")
    parser.add_argument("--separated", action="store_true",
                        help="time each call after a tiny plain kernel (its time subtracted), so no call overlaps "
                             "the one before, as beside an engine's plainly launched kernels")
    parser.add_argument("--quick", action="store_true", help="three (B, C) groups only")
    parser.add_argument("--budget", type=float, default=105.0,
                        help="seconds from process start after which no new (B, C) group starts")
    parser.add_argument("--deadline", type=float, default=140.0,
                        help="seconds from process start at which the tables are printed and it exits")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    SEPARATED = args.separated
    order = QUICK if args.quick else ORDER
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE, order = "cpu", SMOKE["order"]
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    timer = watchdog(args.deadline)
    import triton
    from mqa_provider_gluon.ops.paged_mqa_logits_triton import VARIANTS

    variants = sorted(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    name = torch.cuda.get_device_properties(0).name if DEVICE == "cuda" else "cpu (smoke)"
    log(f"{name}, torch {torch.__version__}, triton {triton.__version__}; variants {variants}")
    dg, dg_note = deepgemm_impl() if DEVICE == "cuda" else (None, "DeepGEMM: not on the CPU")
    log(dg_note)
    impls: dict[str, Impl] = {"deepgemm": dg} if dg is not None else {}
    if dg is not None and args.deepgemm_pdl:
        impls["deepgemm+pdl"] = deepgemm_impl(pdl=True)[0]
    publics = public_impls()
    impls["mqa_core"] = publics["mqa_core"]
    impls["mqa_core+schedule"] = publics["mqa_core+schedule"]
    impls.update(triton_impls(variants))
    gluon = [v for v in args.gluon.split(",") if v]
    impls.update(gluon_impls(gluon))
    host_impls: dict[str, Impl] = {"mqa_core": publics["mqa_core"], "mqa_core+schedule": publics["mqa_core+schedule"],
                                   "kernel": kernel_impl(), "compat": publics["compat"]}
    if gluon:
        host_impls[f"gluon:{gluon[0]}"] = impls[f"gluon:{gluon[0]}"]
    if dg is not None:
        host_impls["deepgemm"] = dg
    try:
        import mqa_core

        chosen = mqa_core.get_provider(None if DEVICE == "cuda" else "cpu", op="fp8_paged_mqa_logits").name
    except Exception as exc:  # reported, and the mqa_core column will show the error too
        chosen = f"? ({type(exc).__name__}: {exc})"
    log(f"mqa_core's op runs provider {chosen}")
    copy = copy_gbs()
    log(f"copy bandwidth {copy['eager']:.0f} GB/s (eager copy_, read + write); "
        f"{copy['graph']:.0f} GB/s replayed from a graph")
    with RUN.lock:
        RUN.names = list(impls) + ([DG_AGAIN] if dg is not None else [])
        RUN.host_names = list(host_impls)
        RUN.info = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
                    "deepgemm": dg_note, "copy_GBps": copy, "variants": variants, "argv": sys.argv[1:],
                    "timing": ("each call after a plain one-float kernel, its time subtracted (--separated)"
                               if SEPARATED else "calls back to back in one graph"),
                    "mqa_core_provider": chosen}
    g = torch.Generator(device=DEVICE).manual_seed(0)
    reason = "all shapes done"
    for batch, ctx in order:
        if elapsed() > args.budget:
            reason = f"budget of {args.budget:.0f} s reached: no new (B, C) group"
            log(reason)
            break
        bt = Batch(batch, ctx, DEVICE, g, 2 if DEVICE == "cpu" else copies_for(batch, ctx))
        for next_n, h in KINDS:
            run_shape(bt, next_n, h, impls, host_impls, g)
        del bt
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    timer.cancel()
    return finish(reason)


if __name__ == "__main__":
    sys.exit(main())
