"""``mqa tune``: measure providers per shape bucket, correctness first, and write a table for ``MQA_TUNING``.

For each provider (those usable on the device, or the ones named) it first runs a subset of the
conformance kit at each (op, H, D) the shapes use, through the kit's own case runner: ragged,
corner-case and empty windows, 1-D and arbitrary 2-D paged lengths, each call with its output poisoned
and checked cell by cell. A provider that fails is left out of those buckets. Then
every shape is checked against a reference and timed (``mqa bench``'s runner), with a progress bar on
stderr: the providers of a shape in interleaved rounds, each round a batch of back-to-back calls per
provider lasting >= 1 ms (``time_interleaved``), so small host-bound shapes are timed at the pace an
engine sees and drift falls on every provider alike; decode shapes on CUDA by CUDA-graph replay
instead (``--replay``), as engines run decode steps. The table (``mqa_core.tuning``) records every
provider's time in every bucket, stamped with what the timings depend on, and the noise margin
(``--margin``) within which a measured lead does not override the priority order; the summary shows
each bucket's pick as selection will make it. A bucket whose shapes pick different providers holds a
crossover, which one pick cannot serve: it is split into halves of M and N (``Bucket.halves``), the
empty halves measured at their middle in a second pass, and each half given an entry of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..spec import LOGITS_OPS, TOPK_OPS, Problem
from ..tuning import DEFAULT_MARGIN
from .common import UserError, device_or_default, providers_for, timed_calls, writable_path

if TYPE_CHECKING:
    import torch

    from ..bench.workloads import Workload
    from ..provider import Provider
    from ..tuning import Bucket, TuningTable

PREFILL, PAGED = LOGITS_OPS
#: The indexer step's op of each logits op (``--topk``): the same shapes, buckets of the top-k op.
TOPK_OF = {PREFILL: "fp8_mqa_topk", PAGED: "fp8_paged_mqa_topk"}
assert set(TOPK_OF.values()) <= set(TOPK_OPS)
KINDS = ("causal", "full", "chunk", "suffix")

EPILOG = """presets:
  quick    prefill M x N = 64 x 256, 256 x 1024 (causal) and decode B x context x next_n =
           2 x 256 x 1, 4 x 512 x 2; H=32 D=128 (seconds on a CPU)
  engine   prefill, H=32 and 64, D=128: 512 and 1k prompts, 2k chunk after 6k, 4k and 8k prompts,
           4k x 16k full windows, 256 x 64k and 1k x 32k prompt tails, each bucket at its corners:
           also at 1.75x its N, at 1.75x its M and N (the top of its range), and for full windows
           at 1.75x its M (the table keeps the geomean, and splits a bucket whose corners pick
           different providers); decode, H=32 and 64, D=128: batch 1 / 16 / 64 x context 4k / 32k
           x next_n 1 / 2 (minutes on an H200)

shapes (--shapes, added to the preset):
  prefill:M,N,H,D[:KIND]    KIND causal (default), full, chunk or suffix
  decode:B,CONTEXT,NEXT_N,H,D

buckets: op, H, D (and next_n for decode) with power-of-two ranges of M and N, written in the table
as [lo, hi); prefill M = query tokens, N = keys; decode M = batch x next_n, N = context. A bucket
whose shapes pick different providers (a crossover inside it) is split: M and N halved at 1.5x the
range's start, each half without a measured shape measured at its middle, and each half written as
an entry of its own (selection uses the finest entry that contains a problem).

timing: prefill shapes eager, the providers interleaved in rounds of >= 1 ms batches (an engine runs
prefill eagerly); with --replay auto (default) decode shapes on CUDA by CUDA-graph replay, the
device's time (engines capture decode steps; an eager 20 us decode call times the host). The table
records which, per op (arguments.timing).

examples:
  mqa tune --device cpu --providers torch_ref,example_chunked --preset quick --out t.json
  MQA_TUNING=t.json mqa explain --arch cpu --shape 256,1024,32,128
  mqa tune --preset engine --providers gluon,triton,deepgemm --out h200.json
  mqa tune --preset engine --topk 2048 --providers composed,gluon,triton --out step.json   # the indexer step"""


@dataclass(frozen=True)
class TuneShape:
    """One measured shape: prefill (M, N, H, D, window kind) or decode (batch, context, next_n, H, D)."""

    op: str
    problem: Problem
    kind: str = "causal"
    batch: int = 0
    next_n: int = 0
    topk: int = 0  # the top-k op of ``op``'s logits, selecting this many keys a row (--topk)

    def with_topk(self, topk: int) -> TuneShape:
        return replace(self, op=TOPK_OF[self.op], topk=topk)

    @property
    def paged(self) -> bool:
        return self.op in (PAGED, TOPK_OF[PAGED])

    @classmethod
    def prefill(cls, m: int, n: int, h: int, d: int, kind: str = "causal") -> TuneShape:
        return cls(PREFILL, Problem(m, n, h, d), kind)

    @classmethod
    def decode(cls, batch: int, context: int, next_n: int, h: int, d: int) -> TuneShape:
        return cls(PAGED, Problem(batch * next_n, context, h, d), "decode", batch, next_n)

    @classmethod
    def parse(cls, text: str) -> TuneShape:
        head, _, rest = text.partition(":")
        fields = rest.split(":")
        try:
            nums = [int(v) for v in fields[0].split(",")]
        except ValueError:
            nums = []
        if head == "prefill" and len(nums) == 4 and len(fields) <= 2 and all(v > 0 for v in nums):
            kind = fields[1] if len(fields) == 2 else "causal"
            if kind in KINDS:
                return cls.prefill(nums[0], nums[1], nums[2], nums[3], kind)
        if head == "decode" and len(nums) == 5 and len(fields) == 1 and all(v > 0 for v in nums):
            return cls.decode(nums[0], nums[1], nums[2], nums[3], nums[4])
        raise UserError(f"--shapes: cannot read {text!r}; expected prefill:M,N,H,D[:KIND] with KIND in "
                        f"{', '.join(KINDS)}, or decode:B,CONTEXT,NEXT_N,H,D (positive integers)")

    @property
    def name(self) -> str:
        return self.workload().name

    def workload(self) -> Workload:
        from ..bench.workloads import Workload

        return Workload(self.op, self.problem, self.kind, True, self.batch, self.next_n, topk=self.topk)

    def bucket(self) -> Bucket:
        from ..tuning import Bucket

        return Bucket.of(self.op, self.problem, self.next_n or None)

    def within(self, bucket: Bucket) -> TuneShape | None:
        """A shape like this one (kind, next_n, H, D) at the geometric middle of ``bucket``'s M and N
        ranges, or None when none fits there (a causal, suffix or chunk window needs M <= N)."""
        m, n = (round(math.sqrt(lo * hi)) for lo, hi in (bucket.m, bucket.n))
        p = self.problem
        if self.paged:
            shape = TuneShape.decode(max(1, round(m / self.next_n)), max(1, n), self.next_n, p.h, p.d)
        elif m > n and self.kind != "full":
            return None
        else:
            shape = TuneShape.prefill(max(1, m), max(1, n), p.h, p.d, self.kind)
        shape = replace(shape, op=self.op, topk=self.topk)
        return shape if bucket.contains(shape.op, shape.problem, shape.next_n) else None


def quick_preset() -> list[TuneShape]:
    return [TuneShape.prefill(64, 256, 32, 128), TuneShape.prefill(256, 1024, 32, 128),
            TuneShape.decode(2, 256, 1, 32, 128), TuneShape.decode(4, 512, 2, 32, 128)]


#: Prefill buckets of the engine preset: (M, N, window kind) at the bottom of each power-of-two range.
ENGINE_PREFILL = ((512, 512, "causal"), (1024, 1024, "causal"), (2048, 8192, "suffix"), (4096, 4096, "causal"),
                  (8192, 8192, "causal"), (4096, 16384, "full"), (256, 65536, "suffix"), (1024, 32768, "suffix"))
#: Each prefill bucket is also measured at this multiple of its M and N (near the top of its range), of
#: N alone, and for full windows of M alone: a provider's lead can turn within one bucket, along its
#: size (H200, 2026-12-03: DeepGEMM 1.3% ahead at 1024 x 32768 suffix, 13% ahead at 1500 x 40000) and
#: along its aspect (triton ahead at 512 x 512 and 896 x 896 causal, gluon 5% ahead at 700 x 900). The
#: table keeps each provider's geomean over the shapes, and splits the bucket where they disagree.
TOP_OF_BUCKET = 1.75


def corners(m: int, n: int, h: int, kind: str) -> list[TuneShape]:
    """A prefill bucket's shapes: (M, N), (M, top N), (top M, top N), and (top M, N) where the window
    allows it (full windows always; others, the last M of N tokens, only when top M <= N)."""
    top_m, top_n = int(m * TOP_OF_BUCKET), int(n * TOP_OF_BUCKET)
    sizes = [(m, n), (m, top_n), (top_m, top_n)] + ([(top_m, n)] if kind == "full" or top_m <= n else [])
    return [TuneShape.prefill(a, b, h, 128, kind) for a, b in sizes]


def engine_preset() -> list[TuneShape]:
    """What an engine sends: short prompts, chunks, long-prompt tails (each prefill bucket at its
    corners), and decode (one shape per bucket: its providers differ by the launch, not the kernel)."""
    out = []
    for h in (32, 64):
        for m, n, kind in ENGINE_PREFILL:
            out += corners(m, n, h, kind)
        out += [TuneShape.decode(b, ctx, nn, h, 128) for b in (1, 16, 64) for ctx in (4096, 32768) for nn in (1, 2)]
    return out


PRESETS: dict[str, Callable[[], list[TuneShape]]] = {"quick": quick_preset, "engine": engine_preset}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="measure providers per shape bucket and write a table for MQA_TUNING",
                       description="Check (a kit subset, then each shape against a reference), then time "
                                   "every provider usable on the device (or the ones named) per shape "
                                   "bucket, and write a stamped JSON table: MQA_TUNING=FILE makes selection "
                                   "take each bucket's fastest usable provider, unless its lead over the "
                                   "first by priority is within --margin. Exit status 1 when a "
                                   "provider computes a wrong result or crashes (the table is still written).",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--providers", metavar="A,B", help="providers to measure (default: all usable here)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="the shapes (default: quick, unless --shapes is given)")
    p.add_argument("--shapes", nargs="+", action="extend", default=[], metavar="SHAPE",
                   help="shapes to measure, added to --preset (see below)")
    p.add_argument("--out", default="mqa-tuning.json", metavar="FILE", help="the table (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the table as JSON instead of the summary")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed rounds, each a batch of back-to-back calls per provider lasting >= 1 ms, the "
                        "providers interleaved (default: 20 on GPU, 5 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default: 5 on GPU, 1 on CPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="start no new shape after this many seconds; the table holds the buckets measured")
    p.add_argument("--replay", choices=REPLAY, default="auto",
                   help="which shapes are timed by CUDA-graph replay (the device's time, as an engine's "
                        "captured step runs them) instead of eager batches: auto = decode on CUDA (engines "
                        "capture decode; an eager ~20 us decode call times the host, not the kernel), all, "
                        "none (default %(default)s); a provider that cannot be captured is left out of "
                        "those buckets")
    p.add_argument("--topk", type=int, default=0, metavar="K",
                   help="tune the indexer step instead: every shape's top-k op (fp8_mqa_topk, "
                        "fp8_paged_mqa_topk) selecting K keys a row; the kit subset is the top-k one and each "
                        "shape's selection is checked over the reference logits. The table's buckets are the "
                        "top-k ops' (a table holds both kinds when merged by hand); selection reads them for "
                        "any topk, and the table records the K it was measured at")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, metavar="FRACTION",
                   help="written into the table: selection keeps the first provider by priority unless the "
                        "fastest measured one is faster by more than this fraction; a lead within timing "
                        "noise must not override the priority order, which holds over many shapes "
                        "(default %(default)s = 5%%; 0 takes the fastest)")


#: ``--replay``: which shapes are timed by CUDA-graph replay rather than eager interleaved batches.
REPLAY = ("auto", "all", "none")
#: What a shape's time is, by how it was taken (the table's ``arguments.timing``, per op).
REPLAYED, EAGER = "graph replay", "interleaved"


def replayed(op: str, replay: str, device: torch.device) -> bool:
    """Whether ``op``'s shapes are timed by graph replay under ``--replay`` on ``device``."""
    return device.type == "cuda" and (replay == "all" or (replay == "auto" and op in (PAGED, TOPK_OF[PAGED])))


# -- the kit subset ----------------------------------------------------------------------------------

#: Prefill cases (window, clean_logits) and decode cases (batch, next_n, 2-D lengths, clean_logits) of
#: the conformance kit run at each (op, H, D) before timing: ragged, corner-case and empty windows,
#: a chunk unclean; short and block-edge 1-D lengths, arbitrary 2-D ones, unclean decode.
PREFILL_SUBSET = (("ragged", True), ("edges", True), ("empty", True), ("chunk", False))
PAGED_SUBSET = ((3, 1, False, True), (3, 2, True, True), (2, 2, False, False))
#: The top-k ops' subset (``--topk``), on exact inputs with ties: prefill (window, positions), decode
#: (batch, next_n, 2-D lengths).
TOPK_PREFILL_SUBSET = (("ragged", "relative"), ("edges", "absolute"), ("empty", "relative"))
TOPK_PAGED_SUBSET = ((3, 1, False), (3, 2, True))


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    text = text if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kit_check(provider: Provider, op: str, h: int, d: int, device: torch.device, seed: int,
              topk: int = 0) -> str | None:
    """The kit subset at (op, H, D), through the kit's own case runner (every call poisoned, the -inf
    mask exact, every in-window cell within its bound; a top-k op's selection exact on exact inputs,
    ties included): None when all pass, else the first failure."""
    from ..testing import runner
    from ..testing import topk as kit_topk
    from ..testing.cases import sizes_for

    sizes = sizes_for(device)

    def draw(i: int) -> runner.Draw:
        return runner.Draw.on(device, seed + i, base_seed=seed, reproduce=f"mqa tune --seed {seed}")

    try:
        ts = kit_topk.topk_sizes(device)  # the kit's own sizes and topk: ties land on the threshold there
        if op == TOPK_OF[PREFILL]:
            problem = Problem(*ts.windows, h, d)
            for i, (window, positions) in enumerate(TOPK_PREFILL_SUBSET):
                exact = kit_topk.exact_prefill(draw(i), problem, window=window)
                for k in dict.fromkeys((ts.topk, min(topk, problem.n))):
                    kit_topk.run_prefill_topk(provider, draw(i), exact, k, positions=positions, return_values=False,
                                              exact=True, what=f"window={window}")
        elif op == TOPK_OF[PAGED]:
            for i, (batch, next_n, lens_2d) in enumerate(TOPK_PAGED_SUBSET):
                exact_paged = kit_topk.decode_inputs(draw(i), batch, next_n, h, d, ts.paged_context,
                                                     lens_2d=lens_2d, exact=True)
                for k in dict.fromkeys((ts.paged_topk, min(topk, ts.paged_context))):
                    kit_topk.run_paged_topk(provider, draw(i), exact_paged, k, return_values=False, exact=True,
                                            what=f"batch={batch} next_n={next_n}")
        elif op == PREFILL:
            problem = Problem(*sizes.windows, h, d)
            for i, (window, clean) in enumerate(PREFILL_SUBSET):
                runner.run_prefill(provider, draw(i), problem, window=window, clean=clean)
        else:
            for i, (batch, next_n, lens_2d, clean) in enumerate(PAGED_SUBSET):
                x = runner.paged_inputs(draw(i), batch, next_n, h, d, sizes.paged_context, lens_2d=lens_2d)
                runner.run_paged(provider, draw(i), x, clean=clean, what=f"batch={batch} next_n={next_n}")
    except Exception as exc:  # AssertionError from the checks, or the provider crashing
        return _short(exc)
    return None


# -- progress --------------------------------------------------------------------------------------

class Progress:
    """A one-line bar on stderr when it is a terminal, one line per step otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done = max(1, total), 0
        self.tty = sys.stderr.isatty()

    def step(self, text: str) -> None:
        self.done = min(self.total, self.done + 1)
        self.note(text)

    def note(self, text: str) -> None:
        width = 24
        filled = round(width * self.done / self.total)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
        if self.tty:
            print(f"\r\033[K{bar}{text[:100]}", end="", file=sys.stderr, flush=True)
        else:
            print(f"{bar}{text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)


# -- measuring -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One provider on one shape: ms (median) when correct and timed, else None and why."""

    ms: float | None
    status: str


def measure(shapes: Sequence[TuneShape], names: Sequence[str], providers: dict[tuple[str, str], Provider],
            device: torch.device, arch: str, *, warmup: int, repeat: int, seed: int,
            progress: Progress, deadline: float | None = None, replay: str = "none",
            kit: dict[tuple[str, str, int, int], str | None] | None = None) -> dict[int, dict[str, Result]]:
    """Kit subset per (provider, op, H, D), then check + time each shape: shape index -> name -> result.

    A shape :func:`replayed` under ``replay`` takes each provider's CUDA-graph replay time (a provider
    whose calls cannot be captured gets no time there, and says why). After ``deadline`` (a
    ``time.monotonic()`` value) no new shape is started; those are left out. ``kit`` keeps the kit
    subset's verdicts across calls (a later pass over more shapes does not run it again).
    """
    from ..bench.runner import run_workloads
    from ..select import shape_reason

    kit = {} if kit is None else kit
    results: dict[int, dict[str, Result]] = {}
    for i, shape in enumerate(shapes):
        if deadline is not None and time.monotonic() > deadline:
            progress.note(f"time budget reached: {len(shapes) - i} shape(s) not measured")
            break
        op, p = shape.op, shape.problem
        mine: dict[str, Result] = {}
        timed: list[str] = []
        for name in names:
            provider = providers.get((name, op))
            if provider is None:
                mine[name] = Result(None, f"unsupported: does not declare {op}")
                continue
            reason = shape_reason(provider.spec, p)
            if reason:
                mine[name] = Result(None, f"unsupported: {reason}")
                continue
            key = (name, op, p.h, p.d)
            if key not in kit:
                progress.note(f"kit subset: {name} {op} H={p.h} D={p.d}")
                kit[key] = kit_check(provider, op, p.h, p.d, device, seed, shape.topk)
            if kit[key]:
                mine[name] = Result(None, f"wrong: kit subset failed: {kit[key]}")
                continue
            timed.append(name)
        for name in names:
            if name not in timed:
                progress.step(f"{shape.name} {name}: {mine[name].status}")
        graph = replayed(op, replay, device)
        rows = run_workloads([shape.workload()], timed, providers, device, arch, warmup=warmup, repeat=repeat,
                             seed=seed + i, timing="interleaved", graph=graph, progress=progress.step) if timed else []
        for row in rows:
            mine[row["provider"]] = result_of(row, graph)
        results[i] = mine
    return results


def result_of(row: dict[str, Any], graph: bool) -> Result:
    """A provider's Result from its ``run_workloads`` row: the eager median, or with ``graph`` the
    replay time (none, with the reason, where its calls could not be captured)."""
    if row["status"] != "ok":
        return Result(None, f"{row['status']}: {row.get('reason', '')}")
    if not graph:
        return Result(float(row["ms_median"]), "ok")
    if row.get("graph_ms") is None:
        return Result(None, f"not capturable: {row.get('graph_note') or 'no CUDA-graph time'}")
    return Result(float(row["graph_ms"]), "ok")


def _buckets(shapes: Sequence[TuneShape], results: dict[int, dict[str, Result]]) -> dict[Bucket, list[int]]:
    """Each bucket's measured shapes (indices; shapes a time budget left out are in none)."""
    groups: dict[Bucket, list[int]] = {}
    for i, shape in enumerate(shapes):
        if i in results:
            groups.setdefault(shape.bucket(), []).append(i)
    return groups


def split_buckets(shapes: Sequence[TuneShape], results: dict[int, dict[str, Result]], by_priority: Sequence[str],
                  margin: float) -> list[Bucket]:
    """The buckets whose measured shapes pick different providers, each shape picking as selection
    would (:meth:`~mqa_core.tuning.Entry.pick`, ``by_priority`` and ``margin``): a crossover lies
    inside them, so one pick cannot serve the whole bucket."""
    from ..tuning import Entry

    out = []
    for bucket, idx in _buckets(shapes, results).items():
        picks = {p.chosen for i in idx
                 if (p := Entry(bucket, {n: r.ms for n, r in results[i].items()}).pick(by_priority, margin))}
        if len(picks) > 1 and len(bucket.halves()) > 1:  # [1, 2) x [1, 2) has no halves
            out.append(bucket)
    return out


def halves_to_measure(split: Sequence[Bucket], shapes: Sequence[TuneShape],
                      results: dict[int, dict[str, Result]]) -> list[TuneShape]:
    """For each split bucket, a shape at the middle of each half that holds no measured shape."""
    groups = _buckets(shapes, results)
    out = []
    for bucket in split:
        mine = [shapes[i] for i in groups[bucket]]
        for half in bucket.halves():
            if not any(half.contains(s.op, s.problem, s.next_n) for s in mine):
                shape = mine[0].within(half)
                out += [shape] if shape is not None else []
    return out


def build_table(shapes: Sequence[TuneShape], names: Sequence[str], results: dict[int, dict[str, Result]],
                stamp: Any, info: dict[str, Any], margin: float = DEFAULT_MARGIN,
                split: Sequence[Bucket] = ()) -> TuningTable:
    """One entry per bucket, keeping each provider's geomean time over the bucket's shapes; a bucket in
    ``split`` also gets one entry per half that holds a measured shape."""
    from ..tuning import Entry, TuningTable

    def entry(bucket: Bucket, idx: Sequence[int]) -> Entry:
        times: dict[str, float | None] = {}
        status: dict[str, str] = {}
        for name in names:
            rs = [results[i][name] for i in idx]
            bad = next((r for r in rs if r.ms is None), None)
            ms = [r.ms for r in rs if r.ms is not None]
            times[name] = None if bad else math.exp(sum(math.log(t) for t in ms) / len(ms))
            status[name] = bad.status if bad else "ok"
        return Entry(bucket, times, status, tuple(shapes[i].name for i in idx))

    entries = []
    for bucket, idx in _buckets(shapes, results).items():
        entries.append(entry(bucket, idx))
        if bucket in split:
            for half in bucket.halves():
                inside = [i for i in idx if half.contains(shapes[i].op, shapes[i].problem, shapes[i].next_n)]
                entries += [entry(half, inside)] if inside else []
    return TuningTable(stamp, tuple(entries), info=info, margin=margin)


def summary(table: TuningTable, names: Sequence[str], by_priority: Sequence[str] | None = None) -> str:
    """Each bucket's pick (``Entry.pick`` over ``by_priority``, default ``names``) and every time."""
    head = ["bucket", "pick", *names]
    rows = [head]
    picks: dict[str, int] = {}
    kept = 0
    for e in table.entries:
        p = e.pick(by_priority or names, table.margin)
        pick = "-" if p is None else p.chosen + (f" (kept; {p.fastest} {p.lead * 100:.1f}% faster)" if p.kept else "")
        picks[p.chosen if p else "-"] = picks.get(p.chosen if p else "-", 0) + 1
        kept += bool(p and p.kept)
        cells = [str(e.bucket), pick]
        for n in names:
            t = e.times_ms.get(n)
            cells.append(f"{t:.4g}" if t is not None else e.status.get(n, "-").split(":")[0])
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("picks: " + ", ".join(f"{n} {c}" for n, c in sorted(picks.items(), key=lambda kv: (-kv[1], kv[0]))))
    lines.append(f"pick: the fastest, or the first by priority ({', '.join(by_priority or names)}) when the "
                 f"fastest leads it by at most the table's {table.margin * 100:g}% margin (--margin; kept in "
                 f"{kept} bucket{'s' if kept != 1 else ''})")
    return "\n".join(lines)


def priority_order(names: Sequence[str]) -> list[str]:
    """``names`` in selection's priority order (unknown names last, as given)."""
    from ..select import sort_key
    from ..testing.providers import spec_named

    specs = {n: spec_named(n) for n in names}
    return sorted(names, key=lambda n: (0, *sort_key(s)) if (s := specs[n]) else (1, 0, "", ""))


def run(args: argparse.Namespace) -> int:
    from ..arch import arch_of_device
    from ..bench import report
    from ..testing.providers import spec_named, usable_providers
    from ..tuning import current_stamp

    start = time.monotonic()
    if args.budget is not None and args.budget <= 0:
        raise UserError("--budget must be > 0 seconds")
    if not 0 <= args.margin < 1:
        raise UserError(f"--margin must be a fraction in [0, 1) (0.05 = 5%), got {args.margin:g}")
    writable_path("--out", args.out)  # a table nobody can write must not cost the measurements first
    shapes = [TuneShape.parse(s) for s in args.shapes]
    preset = args.preset or ("quick" if not shapes else None)
    shapes = (PRESETS[preset]() if preset else []) + shapes
    device = device_or_default(args.device)
    arch = arch_of_device(device)
    if args.topk < 0:
        raise UserError(f"--topk must be >= 1 (or 0: the logits ops), got {args.topk}")
    if args.topk:
        shapes = [s.with_topk(args.topk) for s in shapes]
    if args.replay == "all" and device.type != "cuda":
        raise UserError(f"--replay all times CUDA-graph replays, which {device} has none of; use --replay auto "
                        "or none")
    warmup, repeat = timed_calls(args, device.type != "cpu", gpu_repeat=20)
    ops = list(dict.fromkeys(s.op for s in shapes))
    timing = {op: REPLAYED if replayed(op, args.replay, device) else EAGER for op in ops}
    names = ([n.strip() for n in args.providers.split(",") if n.strip()] if args.providers
             else usable_providers(arch, ops))
    if not names:
        raise UserError(f"no provider is usable on {device} ({arch}) for {', '.join(ops)} (see `mqa explain`)")
    providers = providers_for(names, ops, device, arch)

    device_name = report.device_name(device)
    print(f"mqa tune: {len(shapes)} shapes x {len(names)} providers ({', '.join(names)}) on {device_name} "
          f"({arch}); kit subset, then {warmup} warm-up calls + {repeat} interleaved rounds of >= 1 ms "
          "batches each" + "".join(f"; {op} by CUDA-graph replay" for op, t in timing.items() if t == REPLAYED),
          file=sys.stderr, flush=True)
    progress = Progress(len(shapes) * len(names))
    by_priority = priority_order(names)
    deadline = None if args.budget is None else start + args.budget
    kit: dict[tuple[str, str, int, int], str | None] = {}
    try:
        results = measure(shapes, names, providers, device, arch, warmup=warmup, repeat=repeat, seed=args.seed,
                          progress=progress, deadline=deadline, replay=args.replay, kit=kit)
        split = split_buckets(shapes, results, by_priority, args.margin)
        added = halves_to_measure(split, shapes, results)
        if added:  # then the halves of each split bucket that no shape of it fell in
            progress.total += len(added) * len(names)
            progress.note(f"{len(split)} bucket(s) pick different providers on different shapes: measuring "
                          f"{len(added)} more shape(s) in their halves")
            more = measure(added, names, providers, device, arch, warmup=warmup, repeat=repeat,
                           seed=args.seed + len(shapes), progress=progress, deadline=deadline, replay=args.replay,
                           kit=kit)
            results.update({len(shapes) + i: r for i, r in more.items()})
            shapes = shapes + added
    finally:
        progress.close()
    dists = {n: spec.distribution for n in names if (spec := spec_named(n)) is not None}
    info = {"created": report.now(), "commit": report.git_commit(),
            "arguments": {"device": str(device), "providers": list(names), "preset": preset,
                          "shapes": list(args.shapes), "warmup": warmup, "repeat": repeat, "replay": args.replay,
                          "timing": timing, "seed": args.seed, "topk": args.topk or None,
                          "budget_s": args.budget, "shapes_measured": len(results), "shapes_planned": len(shapes)},
            "split": [str(b) for b in split]}
    table = build_table(shapes, names, results, current_stamp(device, dists), info, args.margin, split)
    try:
        table.write(args.out)
    except OSError as exc:
        raise UserError(f"--out {args.out}: cannot write the table: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(table.to_dict(), indent=1))
    else:
        how = {EAGER: f"median of {repeat} interleaved rounds (each a >= 1 ms batch of back-to-back calls per "
                      f"provider) after {warmup} warm-up calls",
               REPLAYED: "CUDA-graph replay (the device's time; median of 10 replays)"}
        what = f"the indexer step (top-k {args.topk})" if args.topk else "fp8 MQA logits"
        print(f"{what} on {device_name} ({arch}): ms per call; "
              + "; ".join(f"{op}: {how[t]}" for op, t in timing.items()))
        print(summary(table, names, by_priority))
        if split:
            print(f"split {len(split)} bucket(s) whose shapes picked different providers; each half measured "
                  "has an entry of its own (the finest entry containing a problem is used): "
                  + "; ".join(map(str, split)))
        if len(results) < len(shapes):
            print(f"time budget ({args.budget:g} s) reached: {len(shapes) - len(results)} of {len(shapes)} "
                  "shapes not measured; their buckets fall back to priority")
        print(f"wrote {args.out}: use it with MQA_TUNING={args.out}")
    bad = [(shapes[i].name, n, r.status) for i, rs in results.items() for n, r in rs.items()
           if r.status.startswith(("wrong", "error"))]
    if bad:
        print(f"mqa tune: {len(bad)} result(s) wrong or crashed: "
              + "; ".join(f"{n} on {s}: {st}" for s, n, st in bad[:5]), file=sys.stderr)
    return 1 if bad else 0
