"""Measured selection: a stamped table of per-shape-bucket timings (``mqa tune``) and how selection uses it.

``MQA_TUNING=FILE`` makes selection take, for a problem's bucket, the fastest measured provider among
those usable for the request, unless its lead is within the table's noise ``margin``; outside the
table's buckets (or when none of its measured providers is usable) the priority rule decides as usual.
An explicit ``MQA_PROVIDER`` still wins over the table.

The margin (top-level ``"margin"``, a fraction in [0, 1), default 0.05; ``mqa tune --margin``): among
the usable measured providers, let F be the fastest (time tF) and P the first by priority (tP). P is
kept when tP <= tF * (1 + margin), else F is taken. Why: a lead of a few percent on ~30 us calls is
timing noise, and the priority order is the project's prior measured over many shapes; on an H200 a
2% lead of triton over gluon in one bucket picked triton, which was 14% slower on another shape of the
same bucket. ``margin = 0`` takes the fastest (an exact tie keeps P). :meth:`Entry.pick` is the rule;
selection's choice and its load order both come from it, so they always agree.

A bucket is (op, H, D, next_n) with power-of-two ranges of M and N, written out as ``[lo, hi)`` in the
file so a reader needs no code to look a shape up:

- prefill (``fp8_mqa_logits``): M = query tokens, N = keys;
- decode (``fp8_paged_mqa_logits``): M = batch x next_n (rows of logits), N = max_context_len, and
  next_n exact when the request carries it (a problem without it matches the bucket's entries over
  every next_n, ranked by the geometric mean of their times).

A range may also be half of a power-of-two range, split at 1.5x its start (``[512, 768)`` and
``[768, 1024)``): ``mqa tune`` splits a bucket whose measured shapes pick different providers, since
one pick cannot serve both sides of a crossover (H200: triton 15% ahead at 896 x 896, gluon 5% ahead
at 700 x 900, one bucket). A problem uses the finest entry that contains it; the split bucket's own
entry still answers where no half was measured. Lookups are by half-range *cells*, so one dict
lookup serves both.

The table's ``stamp`` records what its timings depend on (device name, arch and compute capability,
torch, triton, mqa-core and each measured provider's distribution version). A table whose stamp does
not match this environment is ignored with one warning naming the file. The check runs once per
process, on the first request for the table's arch (it queries the device, so importing mqa_core or
listing providers never initialises CUDA); nothing is timed when an engine starts. The lookup per
call is a dict lookup keyed by the bucket, and the same file gives the same choice on every rank.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import stat
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import SettingsError
from .spec import LOGITS_OPS, OPS, Problem, ProviderSpec
from .versions import installed_version, triton_version

if TYPE_CHECKING:
    import torch

log = logging.getLogger("mqa_core")

SCHEMA = "mqa-tuning/2"
#: Schemas this module reads: /1 tables (power-of-two ranges only) are a subset of /2.
READS = ("mqa-tuning/1", SCHEMA)
#: A measured lead up to this fraction does not override the priority order (timing noise); see above.
DEFAULT_MARGIN = 0.05
PREFILL, PAGED = LOGITS_OPS
BUCKETS_DOC = ("A problem uses the entry with its op, H, D (and next_n for decode, when known) whose "
               "ranges [lo, hi) contain its M and N. Prefill: M = query tokens, N = keys. Decode: M = "
               "batch x next_n rows, N = max_context_len. Ranges are powers of two: [0, 1), [1, 2), [2, 4)..., "
               "or halves of one split at 1.5x its start ([512, 768), [768, 1024)); the finest entry "
               "that contains a problem wins.")

#: (op, h, d, M cell, N cell, next_n or 0): cells are :func:`cell_index`'s half-octaves.
BucketKey = tuple[str, int, int, int, int, int]


def bucket_index(x: int) -> int:
    """The power-of-two range of ``x``: 0 -> [0, 1), 1 -> [1, 2), 2..3 -> [2, 4), 4..7 -> [4, 8)..."""
    return x.bit_length()


def bucket_range(index: int) -> tuple[int, int]:
    return (0, 1) if index == 0 else (1 << (index - 1), 1 << index)


def cell_index(x: int) -> int:
    """The finest range (cell) of ``x``: its power-of-two range, halved at 1.5x its start from [2, 4) on.
    x -> :func:`cell_range`: 0 -> [0, 1), 1 -> [1, 2), 2 -> [2, 3), 3 -> [3, 4), 4..5 -> [4, 6), 6..7 ->
    [6, 8), 8..11 -> [8, 12)... Cells are numbered 2 x the power-of-two index, + 1 for an upper half."""
    b = x.bit_length()
    return 2 * b + ((x >> (b - 2)) & 1 if b >= 2 else 0)


def cell_range(cell: int) -> tuple[int, int]:
    b, upper = divmod(cell, 2)
    if b < 2:
        return bucket_range(b)
    lo = 1 << (b - 1)
    mid = lo + (lo >> 1)
    return (mid, 1 << b) if upper else (lo, mid)


def _range_cells(r: Sequence[int], what: str) -> tuple[int, ...]:
    """The cells a range covers: both halves of a power-of-two range (one below [2, 4)), or one half."""
    lo, hi = (int(v) for v in r)
    b = lo.bit_length()
    if (lo, hi) == bucket_range(b):
        return (2 * b,) if b < 2 else (2 * b, 2 * b + 1)
    if lo > 0 and cell_range(cell_index(lo)) == (lo, hi):
        return (cell_index(lo),)
    raise ValueError(f"{what} range [{lo}, {hi}) is not a power-of-two bucket ([0, 1), [1, 2), [2, 4), ...) "
                     "nor half of one split at 1.5x its start ([4, 6), [6, 8), ...)")


def _halves(r: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """A range's halves (itself when it is a half already, or below [2, 4))."""
    return tuple(cell_range(c) for c in _range_cells(r, "range"))


@dataclass(frozen=True)
class Bucket:
    """Which problems an entry covers: op, H, D, next_n (decode; None = any) and M, N ranges [lo, hi)."""

    op: str
    h: int
    d: int
    m: tuple[int, int]
    n: tuple[int, int]
    next_n: int | None = None

    def __post_init__(self) -> None:
        errors = []
        if self.op not in OPS:
            errors.append(f"op {self.op!r} is not one of {', '.join(OPS)}")
        for k in ("h", "d"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                errors.append(f"{k} must be a positive int, got {v!r}")
        for k in ("m", "n"):
            try:
                _range_cells(getattr(self, k), k)
                object.__setattr__(self, k, tuple(int(v) for v in getattr(self, k)))
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        if self.op == PREFILL and self.next_n is not None:
            errors.append("next_n is for decode (fp8_paged_mqa_logits) buckets only")
        if self.next_n is not None and (not isinstance(self.next_n, int) or self.next_n <= 0):
            errors.append(f"next_n must be a positive int or null, got {self.next_n!r}")
        if errors:
            raise ValueError("invalid bucket: " + "; ".join(errors))

    @classmethod
    def of(cls, op: str, problem: Problem, next_n: int | None = None) -> Bucket:
        """The bucket of ``problem``; ``next_n`` defaults to the problem's own (a paged call's carries it)."""
        if next_n is None:
            next_n = problem.next_n
        return cls(op, problem.h, problem.d, bucket_range(bucket_index(problem.m)),
                   bucket_range(bucket_index(problem.n)), next_n if op == PAGED else None)

    @property
    def cells(self) -> tuple[BucketKey, ...]:
        """The lookup keys this bucket answers: every (M cell, N cell) inside it."""
        head, nn = (self.op, self.h, self.d), self.next_n or 0
        return tuple(head + (mc, nc, nn) for mc in _range_cells(self.m, "m") for nc in _range_cells(self.n, "n"))

    @property
    def fineness(self) -> int:
        """How many of M and N are halved ranges: a finer entry wins over a coarser one."""
        return sum(len(_range_cells(r, "range")) == 1 and r[0] >= 2 for r in (self.m, self.n))

    def halves(self) -> tuple[Bucket, ...]:
        """The buckets a split makes: each of M and N halved where it can be (M first)."""
        return tuple(replace(self, m=m, n=n) for m in _halves(self.m) for n in _halves(self.n))

    def contains(self, op: str, problem: Problem, next_n: int | None = None) -> bool:
        """Whether a problem of ``op`` (with ``next_n``, decode) falls in this bucket."""
        return (op, problem.h, problem.d) == (self.op, self.h, self.d) and (next_n or None) == self.next_n \
            and self.m[0] <= problem.m < self.m[1] and self.n[0] <= problem.n < self.n[1]

    def __str__(self) -> str:
        nn = f" next_n={self.next_n}" if self.next_n else ""
        return (f"{self.op} H={self.h} D={self.d}{nn} M in [{self.m[0]}, {self.m[1]}) "
                f"N in [{self.n[0]}, {self.n[1]})")


def key_of(op: str, problem: Problem) -> BucketKey:
    """The lookup key of a request: the hot path's only work besides one dict lookup."""
    next_n = (getattr(problem, "next_n", None) or 0) if op == PAGED else 0
    return (op, problem.h, problem.d, cell_index(problem.m), cell_index(problem.n), next_n)


@dataclass(frozen=True)
class Entry:
    """One bucket's measurements: median ms per provider (None: not usable, wrong or crashed) and why."""

    bucket: Bucket
    times_ms: Mapping[str, float | None]
    status: Mapping[str, str] = field(default_factory=dict)
    #: The shapes measured for this bucket, as text (e.g. ``causal M=4096 N=16384 H=64 D=128``).
    shapes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        times = {}
        for name, t in dict(self.times_ms).items():
            if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)
                                  or not math.isfinite(t) or t <= 0):
                raise ValueError(f"invalid time for {name} in bucket {self.bucket}: {t!r} (ms > 0, or null)")
            times[str(name)] = None if t is None else float(t)
        object.__setattr__(self, "times_ms", MappingProxyType(times))
        object.__setattr__(self, "status", MappingProxyType({str(k): str(v) for k, v in dict(self.status).items()}))
        object.__setattr__(self, "shapes", tuple(self.shapes))

    @property
    def ranking(self) -> tuple[str, ...]:
        """Measured providers, fastest first; equal times by name, so every rank orders them alike."""
        timed = [(t, n) for n, t in self.times_ms.items() if t is not None]
        return tuple(n for _, n in sorted(timed))

    def times_text(self) -> str:
        return ", ".join(f"{n} {self.times_ms[n]:.4g} ms" for n in self.ranking)

    def pick(self, usable: Sequence[str], margin: float) -> Pick | None:
        """The margin rule over ``usable`` (priority order); None when none of them is measured here."""
        times = {n: t for n in usable if (t := self.times_ms.get(n)) is not None}
        if not times:
            return None
        first = next(iter(times))
        fastest = min(times, key=lambda n: (times[n], n))  # as in ranking: time, then name
        kept = times[first] <= times[fastest] * (1 + margin)
        return Pick(first if kept else fastest, fastest, first, times[first] / times[fastest] - 1, margin)

    def to_dict(self) -> dict[str, Any]:
        b = self.bucket
        return {"op": b.op, "h": b.h, "d": b.d, "next_n": b.next_n, "m": list(b.m), "n": list(b.n),
                "winner": self.ranking[0] if self.ranking else None, "ranking": list(self.ranking),
                "times_ms": dict(self.times_ms), "status": dict(self.status), "shapes": list(self.shapes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        bucket = Bucket(d["op"], d["h"], d["d"], tuple(d["m"]), tuple(d["n"]), d.get("next_n"))  # type: ignore[arg-type]
        return cls(bucket, d["times_ms"], d.get("status", {}), tuple(d.get("shapes", ())))


@dataclass(frozen=True)
class Pick:
    """One bucket's choice: the fastest usable measured provider, the first by priority, the pick.

    :param lead: how much faster ``fastest`` is than ``first``, as a fraction of its time (tP / tF - 1).
    """

    chosen: str
    fastest: str
    first: str
    lead: float
    margin: float

    @property
    def kept(self) -> bool:
        """Whether the priority provider was kept over a faster one (its lead within the margin)."""
        return self.chosen != self.fastest


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _merge_next_n(entries: Sequence[Entry]) -> Entry:
    """One entry for a decode bucket over every next_n: geomean time of providers timed in all of them."""
    first = entries[0].bucket
    m_range = min((e.bucket.m for e in entries), key=lambda r: r[1] - r[0])  # the cell's finest ranges
    n_range = min((e.bucket.n for e in entries), key=lambda r: r[1] - r[0])
    names = sorted({n for e in entries for n in e.times_ms})
    times: dict[str, float | None] = {}
    for name in names:
        ts = [t for e in entries if (t := e.times_ms.get(name)) is not None]
        times[name] = math.exp(sum(math.log(t) for t in ts) / len(ts)) if len(ts) == len(entries) else None
    shapes = tuple(s for e in entries for s in e.shapes)
    return Entry(Bucket(first.op, first.h, first.d, m_range, n_range, None), times, {}, shapes)


# -- the stamp ------------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine() or "CPU"


@dataclass(frozen=True)
class Stamp:
    """What a table's timings are valid for.

    :param versions: ``"torch"``, ``"triton"``, ``"mqa-core"`` and each measured provider's distribution
        name -> version (None: not installed).
    :param providers: measured provider name -> its distribution.
    """

    device_name: str
    arch: str
    capability: str | None
    versions: Mapping[str, str | None]
    providers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in ("device_name", "arch"):
            if not isinstance(getattr(self, k), str) or not getattr(self, k):
                raise ValueError(f"stamp.{k} must be a non-empty string, got {getattr(self, k)!r}")
        for k in ("torch", "triton", "mqa-core"):
            if k not in self.versions:
                raise ValueError(f"stamp.versions must record {k!r}")
        object.__setattr__(self, "versions", MappingProxyType(dict(self.versions)))
        object.__setattr__(self, "providers", MappingProxyType(dict(self.providers)))

    def to_dict(self) -> dict[str, Any]:
        return {"device_name": self.device_name, "arch": self.arch, "capability": self.capability,
                "versions": dict(self.versions), "providers": dict(self.providers)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stamp:
        return cls(d["device_name"], d["arch"], d.get("capability"), d["versions"], d.get("providers", {}))

    def mismatches(self, here: Stamp) -> list[str]:
        """What differs between this (the table's) stamp and ``here``'s, as 'what: here vs table'."""
        out = []
        for k in ("device_name", "arch", "capability"):
            if getattr(here, k) != getattr(self, k):
                out.append(f"{k.replace('_', ' ')} {getattr(here, k)} here vs {getattr(self, k)} in the table")
        for k, v in self.versions.items():
            if here.versions.get(k) != v:
                out.append(f"{k} {here.versions.get(k) or 'not installed'} here vs {v} in the table")
        return out


def current_stamp(device: torch.device, providers: Mapping[str, str]) -> Stamp:
    """This environment's stamp for ``device`` and the given providers (name -> distribution)."""
    import torch

    from .arch import arch_of_device

    if device.type == "cpu":
        name, capability = cpu_name(), None
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        name, capability = props.name, f"{props.major}.{props.minor}"
    versions: dict[str, str | None] = {"torch": torch.__version__, "triton": triton_version(),
                                       "mqa-core": installed_version("mqa-core")}
    for dist in sorted(set(providers.values())):
        versions[dist] = installed_version(dist)
    return Stamp(name, arch_of_device(device), capability, versions, dict(providers))


# -- the table ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TuningTable:
    """A stamped set of bucket entries, indexed for one dict lookup per request."""

    stamp: Stamp
    entries: tuple[Entry, ...]
    path: str = ""
    #: Free-form provenance (date, command, commit): written and read back, never interpreted.
    info: Mapping[str, Any] = field(default_factory=dict)
    #: A measured lead up to this fraction keeps the priority provider (see the module docstring).
    margin: float = DEFAULT_MARGIN
    _index: Mapping[BucketKey, Entry] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = self.margin
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
            raise ValueError(f"margin must be a number in [0, 1) (a fraction: 0.05 = 5%), got {m!r}")
        object.__setattr__(self, "margin", float(m))
        object.__setattr__(self, "entries", tuple(self.entries))
        index: dict[BucketKey, Entry] = {}
        for e in sorted(self.entries, key=lambda e: -e.bucket.fineness):  # the finest entry over a cell answers
            for key in e.bucket.cells:
                other = index.get(key)
                if other is None:
                    index[key] = e
                elif other.bucket.fineness == e.bucket.fineness:
                    raise ValueError(f"two entries for bucket {e.bucket}" if other.bucket == e.bucket else
                                     f"entries for buckets {other.bucket} and {e.bucket} overlap, neither finer")
        # Decode entries also answer requests that do not say their next_n (key next_n = 0).
        groups: dict[BucketKey, list[Entry]] = {}
        for key, e in index.items():
            if key[0] == PAGED and key[5]:
                groups.setdefault(key[:5] + (0,), []).append(e)
        for key, group in groups.items():
            if key not in index:
                index[key] = _merge_next_n(sorted(group, key=lambda e: e.bucket.next_n or 0))
        object.__setattr__(self, "_index", MappingProxyType(index))
        object.__setattr__(self, "info", MappingProxyType(dict(self.info)))

    def lookup(self, op: str, problem: Problem) -> Entry | None:
        return self._index.get(key_of(op, problem))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "stamp": self.stamp.to_dict(), "margin": self.margin, **dict(self.info),
                "buckets": BUCKETS_DOC, "entries": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> TuningTable:
        if d.get("schema") not in READS:
            raise ValueError(f"schema is {d.get('schema')!r}, expected one of {', '.join(map(repr, READS))}")
        info = {k: v for k, v in d.items() if k not in ("schema", "stamp", "margin", "entries", "buckets")}
        return cls(Stamp.from_dict(d["stamp"]), tuple(Entry.from_dict(e) for e in d["entries"]), path, info,
                   d.get("margin", DEFAULT_MARGIN))  # tables written before the margin: the default

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")


#: The largest table read (bytes): a table is a few KiB per arch; ``/dev/zero`` must not fill memory.
MAX_TABLE_BYTES = 16 * 2**20
#: The deepest nesting of arrays and objects read (a table nests four deep): deeper JSON is refused
#: before the parser recurses.
MAX_TABLE_DEPTH = 32
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def _read_table_text(path: str) -> str:
    """The file's text: a regular file (a FIFO or a device is refused without blocking on it) of at
    most :data:`MAX_TABLE_BYTES`, UTF-8. OSError or ValueError saying what is wrong."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_TABLE_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than a table's limit of {MAX_TABLE_BYTES}")
        chunks, size = [], 0
        while size <= MAX_TABLE_BYTES:
            chunk = os.read(fd, MAX_TABLE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_TABLE_BYTES:
            raise ValueError(f"more than a table's limit of {MAX_TABLE_BYTES} bytes")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (strings skipped), without recursing."""
    depth = deepest = 0
    for bracket in _JSON_BRACKETS.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def load_tuning(path: str) -> TuningTable:
    """Read a table written by ``mqa tune``; raises ValueError naming the file and what is wrong:
    also for what is not a regular file, a file over :data:`MAX_TABLE_BYTES`, and JSON nested deeper
    than :data:`MAX_TABLE_DEPTH`."""
    try:
        text = _read_table_text(path)
        if _json_depth(text) > MAX_TABLE_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_TABLE_DEPTH} levels")
        data = json.loads(text)
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"cannot read tuning table {path}: {exc}") from None
    try:
        return TuningTable.from_dict(data, path)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"invalid tuning table {path}: {what}") from None


# -- selection ------------------------------------------------------------------------------------

class Tuning:
    """A loaded table as selection uses it; held by the registry's state and called under its lock.

    Whether the stamp matches is learned once, on the first request for the table's arch; the answer
    is kept for the life of the state (``mqa_core.reload()`` starts over).
    """

    def __init__(self, table: TuningTable) -> None:
        self.table = table
        self._matches: bool | None = None

    def _environment_matches(self) -> bool:
        if self._matches is None:
            self._matches = False
            try:
                diffs = self._differences()
            except Exception as exc:  # a broken environment probe must not break selection
                diffs = [f"cannot inspect this environment ({type(exc).__name__}: {exc})"]
            if diffs:
                text = (f"mqa_core: tuning table {self.table.path} (MQA_TUNING) does not match this "
                        f"environment ({'; '.join(diffs)}); it is ignored and providers are chosen by "
                        "priority. Run `mqa tune` here to measure this environment.")
                log.info("%s", text)  # the warning below is the one the user sees, once
                warnings.warn(text, RuntimeWarning, stacklevel=1)
            else:
                self._matches = True
        return self._matches

    def _differences(self) -> list[str]:
        import torch

        stamp = self.table.stamp
        if stamp.arch == "cpu":
            device = torch.device("cpu")
        elif not torch.cuda.is_available():
            return [f"no GPU here vs {stamp.device_name} ({stamp.arch}) in the table"]
        else:
            device = torch.device("cuda", torch.cuda.current_device())
        return stamp.mismatches(current_stamp(device, stamp.providers))

    def applies(self, arch: str, problem: Problem | None) -> bool:
        """Whether the table speaks for this request at all: a shape, its arch, a matching stamp."""
        return problem is not None and arch == self.table.stamp.arch and self._environment_matches()

    def entry(self, arch: str, op: str, problem: Problem | None) -> Entry | None:
        """The measured entry for a request, or None (no shape, another arch, no bucket, stale stamp)."""
        if problem is None or arch != self.table.stamp.arch:
            return None
        entry = self.table.lookup(op, problem)
        if entry is None or not self._environment_matches():
            return None
        return entry

    def order(self, arch: str, op: str, problem: Problem | None,
              plan: tuple[ProviderSpec, ...]) -> tuple[ProviderSpec, ...]:
        """``plan`` (usable specs, priority order) as the table ranks it: :meth:`Entry.pick` first, then
        the pick among the rest, and so on; unmeasured specs last, in plan order.

        Picking again among the rest (rather than sorting the rest by time) keeps this order equal to
        :meth:`choose`'s answer when the loader skips a spec (its shape limits, a failed import), since
        the decision then sees the same set less that spec.
        """
        entry = self.entry(arch, op, problem)
        if entry is None:
            return plan
        out: list[ProviderSpec] = []
        rest = list(plan)
        while (p := entry.pick([s.name for s in rest], self.table.margin)) is not None:
            out += [s for s in rest if s.name == p.chosen]
            rest = [s for s in rest if s.name != p.chosen]
        return tuple(out + rest)

    def choose(self, arch: str, op: str, problem: Problem | None,
               accepted: Iterable[str]) -> tuple[str | None, str] | None:
        """For :func:`mqa_core.select.decide`: (the pick among the usable providers, why), or (None, a
        note for the priority rule's why), or None when the table has nothing to say.

        ``accepted`` comes in priority order; the pick is :meth:`Entry.pick` with the table's margin.
        """
        entry = self.entry(arch, op, problem)
        path = self.table.path
        if entry is None:
            if problem is not None and self.applies(arch, problem):
                return None, f"{path} has no entry for bucket {Bucket.of(op, problem)}"
            return None
        usable = list(accepted)
        p = entry.pick(usable, self.table.margin)
        if p is None:
            return None, f"{path} measured none of the usable providers for bucket {entry.bucket}"
        faster = entry.ranking[:entry.ranking.index(p.fastest)]
        passed = f" ({', '.join(faster)} not usable here)" if faster else ""
        where = f"in {path} for bucket {entry.bucket}: {entry.times_text()}"
        margin = f"the table's {p.margin * 100:g}% margin"
        if p.kept:
            return p.chosen, (f"{p.chosen} (priority) kept: {p.fastest}'s lead {_pct(p.lead)} is within "
                              f"{margin}{passed}; measured {where}")
        if p.fastest == p.first:  # no margin question: the fastest is also first by priority
            return p.chosen, f"fastest measured usable provider{passed} {where}"
        return p.chosen, (f"fastest measured usable provider{passed}: its lead {_pct(p.lead)} over {p.first} "
                          f"(priority) exceeds {margin}; measured {where}")


def from_setting(path: str | None) -> Tuning | None:
    """``MQA_TUNING``'s value -> the table selection uses (None when unset); a bad file raises."""
    if not path:
        return None
    try:
        return Tuning(load_tuning(path))
    except ValueError as exc:
        raise SettingsError(f"MQA_TUNING={path}: {exc}") from None
