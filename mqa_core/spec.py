"""What a provider declares about itself: :class:`ProviderSpec` and the :class:`Problem` it is judged on.

A spec is pure data plus two optional callables (a runtime check and shape limits). It names its
kernel object by a ``"module:attr"`` string so that listing and selecting providers never imports a
kernel library (triton, aiter); the object is imported only once the provider is chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any

from .arch import ANY_ARCH, normalize_arch
from .names import PROVIDER_NAME, provider_id

#: The ops that compute logits (the scoring op and its paged decode variant).
LOGITS_OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")
#: The indexer step: the top-k key positions per query, fused with scoring (prefill, paged decode), and
#: the selection alone over given logits (``topk_per_row``), so that top-k kernels are providers too.
TOPK_OPS = ("fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row")
#: The ops a provider can serve. Each is a method of the same name on the loaded kernel object.
OPS = LOGITS_OPS + TOPK_OPS
#: The scoring op each fused top-k op is built on (what the core's composed provider chains).
SCORING_OP = {"fp8_mqa_topk": "fp8_mqa_logits", "fp8_paged_mqa_topk": "fp8_paged_mqa_logits"}
#: The core's own provider of the fused top-k ops: the best logits provider and the best
#: ``topk_per_row`` provider, in row chunks within the workspace bound (:mod:`mqa_core.composed`).
COMPOSED_NAME, COMPOSED_DISTRIBUTION = "composed", "mqa-core"
COMPOSED_ID = f"{COMPOSED_DISTRIBUTION}:{COMPOSED_NAME}"
#: What a provider may claim about its results, which the kit certifies and ``MQA_BATCH_INVARIANT``
#: selects on: ``deterministic`` (bitwise-equal results on repeated calls with the same inputs) and
#: ``batch_invariant`` (a query's result does not depend on the other queries of the call, nor on
#: keys outside its window).
CLAIMS = ("deterministic", "batch_invariant")
#: fp8 flavours a provider can accept for q and k (torch's names without the ``torch.`` prefix).
DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz")
#: Every fp8 (q dtype, k dtype) pair the op's contract allows; a provider declares the ones it serves.
DTYPE_PAIRS = tuple((q, k) for q in DTYPES for k in DTYPES)
#: FP4 as DeepGEMM takes it (``fp8_fp4_*``, sm_100): e2m1 values packed two to a byte (the first in the
#: low nibble; int8 or uint8 ``[..., D / 2]``), each group of 32 values scaled by a UE8M0 power of two,
#: the four scales of a (token, head) packed in one int32 (byte g: group g). It is a format of q and k
#: together: its one pair is :data:`FP4_PAIR`, which a provider declares per arch like any other.
FP4 = "float4_e2m1fn_x2"
FP4_PAIR = (FP4, FP4)
#: Values per UE8M0 scale in :data:`FP4`, and the most groups one int32 of scales holds.
FP4_GROUP, FP4_MAX_GROUPS = 32, 4
#: What a pair may name: the fp8 flavours, and FP4 (only as :data:`FP4_PAIR`).
PAIR_DTYPES = (*DTYPES, FP4)

Pair = tuple[str, str]


def dtype_name(dtype: Any) -> str:
    """``torch.float8_e4m3fn`` or ``"float8_e4m3fn"`` -> ``"float8_e4m3fn"``."""
    return str(dtype).removeprefix("torch.")


def dtype_pair(dtype: Any) -> Pair | None:
    """What a request's ``dtype`` means: None (any), a q dtype meaning (q, q), or a (q, k) pair.

    Raises ValueError for anything that is not a contract dtype or a pair of them.
    """
    if dtype is None:
        return None
    if isinstance(dtype, (tuple, list)):
        if len(dtype) != 2:
            raise ValueError(f"dtype pair must be (q_dtype, k_dtype); got {dtype!r}")
        q, k = dtype_name(dtype[0]), dtype_name(dtype[1])
    else:
        q = k = dtype_name(dtype)
    if (q, k) == FP4_PAIR:
        return FP4_PAIR
    if q not in DTYPES or k not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (meaning q and k alike), a (q, k) "
                         f"pair of them, or {FP4} (q and k both FP4); got {dtype!r}")
    return (q, k)


#: Short spellings a command line accepts: ``e4m3fn``/``e4m3fnuz``, ``fn``/``fnuz``, and ``fp4``/``e2m1``.
_SHORT_DTYPES = ({d.removeprefix("float8_"): d for d in DTYPES} | {d.removeprefix("float8_e4m3"): d for d in DTYPES}
                 | {"fp4": FP4, "e2m1": FP4})


def parse_dtypes(text: str) -> tuple[str, ...]:
    """``Q`` or ``Q,K`` as typed on a command line: torch's names (``torch.`` prefix optional) or short
    ones (``e4m3fn``, ``fnuz``, ``fp4``). One or two names from :data:`DTYPES`, or FP4 (alone or twice);
    ValueError naming them otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 2):
        raise ValueError(f"{text!r} is not Q or Q,K")
    names = tuple(_SHORT_DTYPES.get(p.lower().removeprefix("torch."), p.lower().removeprefix("torch."))
                  for p in parts)
    for part, name in zip(parts, names):
        if name not in PAIR_DTYPES:
            raise ValueError(f"dtype {part!r} is not one of {', '.join(DTYPES)} (or e4m3fn, e4m3fnuz, fn, fnuz), "
                             f"nor {FP4} (fp4)")
    if FP4 in names and any(n != FP4 for n in names):
        raise ValueError(f"{text!r} mixes FP4 with fp8: FP4 is a format of q and k together")
    return names


def format_pairs(pairs: Iterable[Pair]) -> str:
    """``(float8_e4m3fn, float8_e4m3fnuz), ...`` in a stable order."""
    return ", ".join(f"({q}, {k})" for q, k in sorted(pairs))

_LOAD = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class Problem:
    """The sizes a call has, for shape limits: M queries, N keys, H heads, head dim D.

    For the paged op, ``m`` is batch * next_n and ``n`` is max_context_len; a paged call's problem
    also carries ``next_n`` (draft tokens per sequence) and ``block_size`` (tokens per cache block),
    for shape limits and tuning buckets. Both are None where unknown (prefill, or a problem built by
    hand): limits and lookups that need them then judge without.
    """

    m: int
    n: int
    h: int
    d: int
    next_n: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        for k in ("m", "n", "h", "d"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"Problem.{k} must be a non-negative int, got {v!r}")
        for k in ("next_n", "block_size"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"Problem.{k} must be a positive int or None, got {v!r}")

    @classmethod
    def parse(cls, text: str) -> "Problem":
        """``"M,N,H,D"`` -> Problem; the CLI's ``--shape``."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(f"shape must be M,N,H,D as four non-negative integers, got {text!r}")
        m, n, h, d = (int(p) for p in parts)
        if max(m, n, h, d) >= 2**31:
            raise ValueError(f"shape M,N,H,D takes sizes below 2**31 (the kernels index in int32), got {text!r}")
        if h == 0 or d == 0:
            raise ValueError(f"shape M,N,H,D needs H >= 1 and D >= 1 (M and N may be 0), got {text!r}")
        return cls(m, n, h, d)

    def __str__(self) -> str:
        paged = "".join(f",{k}={v}" for k, v in (("next_n", self.next_n), ("block_size", self.block_size)) if v)
        return f"M={self.m},N={self.n},H={self.h},D={self.d}{paged}"


#: A runtime check: given the arch asked for, None when usable, else the reason it is not.
RuntimeCheck = Callable[[str], str | None]
#: Shape limits: given a problem, None when supported, else the reason it is not.
ShapeLimits = Callable[[Problem], str | None]
#: What a spec may pass as ``dtype_pairs``: pairs for every arch, or arch -> pairs ("any": the rest).
PairsDeclaration = Iterable[Pair] | Mapping[str, Iterable[Pair]]


class PairsByArch(Mapping[str, frozenset[Pair]]):
    """arch -> the (q dtype, k dtype) pairs served there; ``"any"`` covers archs not listed.

    Immutable and hashable, so a spec holding it stays a hashable value.
    """

    __slots__ = ("_table",)

    def __init__(self, table: Mapping[str, frozenset[Pair]]) -> None:
        self._table = dict(table)

    def __getitem__(self, arch: str) -> frozenset[Pair]:
        return self._table[arch]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._table))

    def __len__(self) -> int:
        return len(self._table)

    def __hash__(self) -> int:
        return hash(frozenset(self._table.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{a!r}: {{{format_pairs(p)}}}" for a, p in self.items()) + "}"


def _pairs_table(declared: Any, archs: frozenset[str], errors: list[str]) -> dict[str, frozenset[Pair]]:
    """Validate and normalise a ``dtype_pairs`` declaration; problems go to ``errors``."""
    if isinstance(declared, Mapping):
        raw = list(declared.items())
    elif isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
        errors.append(f"dtype_pairs must be pairs (q_dtype, k_dtype) or a mapping arch -> pairs; "
                      f"got {type(declared).__name__}")
        return {}
    else:
        raw = [(ANY_ARCH, declared)]
    table: dict[str, frozenset[Pair]] = {}
    for arch, pairs in raw:
        try:
            key = ANY_ARCH if arch == ANY_ARCH else normalize_arch(arch)
        except (TypeError, ValueError) as exc:
            errors.append(f"dtype_pairs: {exc}")
            continue
        if key != ANY_ARCH and ANY_ARCH not in archs and key not in archs:
            errors.append(f"dtype_pairs lists {key}, which archs does not declare")
        got: set[Pair] = set()
        items = [] if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable) else list(pairs)
        for p in items:
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not (all(dtype_name(x) in DTYPES for x in p) or tuple(map(dtype_name, p)) == FP4_PAIR)):
                errors.append(f"dtype_pairs[{key!r}]: {p!r} is not a (q_dtype, k_dtype) pair of {list(DTYPES)}, "
                              f"nor {FP4_PAIR}")
                continue
            got.add((dtype_name(p[0]), dtype_name(p[1])))
        if not items:
            errors.append(f"dtype_pairs[{key!r}] must be a non-empty collection of (q_dtype, k_dtype) pairs")
        table[key] = table.get(key, frozenset()) | frozenset(got)
    if table and ANY_ARCH not in table:
        uncovered = sorted(a for a in archs if a not in table)
        if uncovered:
            errors.append(f"dtype_pairs covers neither {', '.join(uncovered)} nor {ANY_ARCH!r}")
    return table


@dataclass(frozen=True)
class ProviderSpec:
    """A provider's capability, priority and lazy kernel, as returned by the ``mqa_providers`` hook.

    :param name: lower case (``[a-z][a-z0-9_-]*``); what ``MQA_PROVIDER`` and
        ``MQA_DISABLE_PROVIDERS`` name. Unique per distribution; a name two distributions claim is
        ambiguous and neither is chosen until the user picks one as ``distribution:name``.
    :param ops: the ops served, from :data:`OPS`.
    :param archs: arch names it is written for (any well-formed ``sm_XY[Z]``, ``gfxNNN[N]``,
        ``cpu``; normalised), or ``"any"``.
    :param dtypes: shorthand for fp8 flavours accepted for q and k alike: ``{d}`` means the pair
        ``(d, d)`` on every arch. When ``dtype_pairs`` is given, it is the declaration and this is
        derived from it: the flavours ``d`` whose pair ``(d, d)`` is declared on some arch.
    :param priority: higher wins; ties break by name. In use: flydsl 300, gluon 200, deepgemm 180,
        triton 150, torch_ref 0.
    :param load: ``"module:attr"`` of the kernel object, imported only when chosen. The object has
        one method per op in ``ops``, with the op's signature.
    :param check: optional runtime check ``check(arch) -> None | reason``; must not raise or be slow.
        For an explicit arch it answers for what is installed here, not for the local device.
    :param shape_limits: optional ``shape_limits(problem) -> None | reason``.
    :param description: one line for ``mqa providers``.
    :param distribution: the distribution it came from; set by discovery from the installed
        distribution (a spec that names another one is rejected).
    :param version: that distribution's version; set by discovery.
    :param claims: what it claims of its results, from :data:`CLAIMS` (``deterministic``,
        ``batch_invariant``); the conformance kit fails a provider whose claim is false, and
        ``MQA_BATCH_INVARIANT=1`` chooses only among providers claiming ``batch_invariant``.
    :param dtype_pairs: the (q dtype, k dtype) pairs served: an iterable of pairs for every arch, or
        a mapping ``arch -> pairs`` where ``"any"`` covers the archs not listed. Stored as a
        :class:`PairsByArch`. The paged op's cache is bytes of q's flavour: it uses the (q, q) pairs.
        :data:`FP4_PAIR` declares FP4 (DeepGEMM's packed e2m1 with UE8M0 scales, group 32) where
        listed; calls with FP4 inputs go only to providers that declare it on the tensors' arch.
    """

    name: str
    ops: frozenset[str]
    archs: frozenset[str]
    dtypes: frozenset[str] = frozenset()
    _: KW_ONLY
    priority: int
    load: str
    check: RuntimeCheck | None = field(default=None, compare=False)
    shape_limits: ShapeLimits | None = field(default=None, compare=False)
    description: str = ""
    distribution: str = ""
    version: str = ""
    dtype_pairs: PairsDeclaration | None = None
    claims: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Accept any iterable for the set fields, store frozensets: specs hash and compare cleanly.
        errors: list[str] = []
        for k in ("ops", "archs", "dtypes", "claims"):
            v = getattr(self, k)
            if isinstance(v, str):
                v = (v,)
            try:
                object.__setattr__(self, k, frozenset(v))
            except TypeError:
                errors.append(f"{k} must be a collection of names, got {type(v).__name__}")
                object.__setattr__(self, k, frozenset())
        if not isinstance(self.name, str) or not PROVIDER_NAME.fullmatch(self.name):
            errors.append(f"name {self.name!r} must match {PROVIDER_NAME.pattern} (lower case, whole name)")
        if not self.ops or not self.ops <= set(OPS):
            errors.append(f"ops {sorted(self.ops, key=str)} must be a non-empty subset of {list(OPS)}")
        if not self.claims <= set(CLAIMS):
            errors.append(f"claims {sorted(self.claims, key=str)} must be a subset of {list(CLAIMS)}")
        archs = set()
        for a in self.archs:
            try:
                archs.add(ANY_ARCH if a == ANY_ARCH else normalize_arch(a))
            except (TypeError, ValueError) as exc:
                errors.append(f"archs: {exc}")
        if not self.archs:
            errors.append(f"archs must name at least one arch, or {ANY_ARCH!r}")
        object.__setattr__(self, "archs", frozenset(archs))
        self._set_pairs(errors)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            errors.append(f"priority must be an int, got {self.priority!r}")
        if not isinstance(self.load, str) or not _LOAD.fullmatch(self.load):
            errors.append(f"load {self.load!r} must be 'package.module:attr'")
        for k in ("check", "shape_limits"):
            if getattr(self, k) is not None and not callable(getattr(self, k)):
                errors.append(f"{k} must be callable or None")
        for k in ("description", "distribution", "version"):
            v = getattr(self, k)
            if not isinstance(v, str) or any(c in v for c in "\r\n\0"):
                errors.append(f"{k} must be a one-line str, got {v!r}")
        if errors:
            raise ValueError(f"invalid ProviderSpec {self.name!r}: " + "; ".join(errors))

    def _set_pairs(self, errors: list[str]) -> None:
        dtypes = self.dtypes
        if not dtypes <= set(DTYPES):
            errors.append(f"dtypes {sorted(dtypes, key=str)} must be a subset of {list(DTYPES)}")
        if self.dtype_pairs is None:
            if not dtypes:
                errors.append(f"declare dtypes (fp8 flavours for q and k alike, from {list(DTYPES)}) or "
                              "dtype_pairs")
            table = {ANY_ARCH: frozenset((d, d) for d in dtypes)}
        else:
            # dtype_pairs is the declaration; dtypes is derived from it (so that replace() on a spec,
            # which passes both, and a replaced dtype_pairs stay consistent).
            table = _pairs_table(self.dtype_pairs, self.archs, errors)
            object.__setattr__(self, "dtypes", frozenset(q for pairs in table.values() for q, k in pairs
                                                         if q == k and q in DTYPES))
        object.__setattr__(self, "dtype_pairs", PairsByArch(table))

    @property
    def id(self) -> str:
        """``distribution:name``: the identity selection and ``MQA_PROVIDER`` use (names can collide)."""
        return provider_id(self.distribution, self.name)

    def serves_arch(self, arch: str) -> bool:
        return ANY_ARCH in self.archs or arch in self.archs

    def pairs_for(self, arch: str) -> frozenset[Pair]:
        """The (q dtype, k dtype) pairs served on ``arch`` (a normalised name); empty where it does
        not serve that arch."""
        if not self.serves_arch(arch):
            return frozenset()
        table: Mapping[str, frozenset[Pair]] = self.dtype_pairs  # type: ignore[assignment]
        got = table.get(arch)
        return got if got is not None else table.get(ANY_ARCH, frozenset())


# -- plain copies (discovery) ----------------------------------------------------------------------
# A plugin's spec may hold objects of its own types: a str subclass whose __hash__ raises or whose
# __eq__ says yes to every name, an int subclass whose __neg__ raises, a spec built without
# __post_init__. Discovery copies every field into builtins of exactly the declared type before
# anything hashes, sorts or compares it, through the slots of the builtin types themselves (which a
# subclass cannot override), and refuses what cannot be copied as that plugin's failure.


def _plain_str(v: Any, what: str) -> str:
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str.__str__(v)  # str's own slot: an exact copy of the characters, whatever v overrides
    raise TypeError(f"{what} must be a str, got {type(v).__name__}")


def _plain_int(v: Any, what: str) -> int:
    if type(v) is int:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return int.__int__(v)
    raise TypeError(f"{what} must be an int, got {type(v).__name__}")


def _plain_str_set(v: Any, what: str) -> frozenset[str]:
    if not isinstance(v, frozenset):  # what __post_init__ stores
        raise TypeError(f"{what} must be a frozenset of str, got {type(v).__name__}")
    return frozenset(_plain_str(x, f"an item of {what}") for x in frozenset.__iter__(v))


def _plain_pairs(v: Any, what: str) -> dict[str, frozenset[Pair]] | None:
    if v is None:
        return None
    if type(v) is not PairsByArch:
        raise TypeError(f"{what} must be a PairsByArch (as ProviderSpec stores it), got {type(v).__name__}")
    table = object.__getattribute__(v, "_table")
    if type(table) is not dict:
        raise TypeError(f"{what} holds a {type(table).__name__}, not a dict")
    out: dict[str, frozenset[Pair]] = {}
    for arch, pairs in dict.items(table):
        got = set()
        for p in _plain_tuples(pairs, what):
            q, k = p
            got.add((_plain_str(q, f"a dtype in {what}"), _plain_str(k, f"a dtype in {what}")))
        out[_plain_str(arch, f"an arch in {what}")] = frozenset(got)
    return out


def _plain_tuples(pairs: Any, what: str) -> list[tuple[Any, ...]]:
    if not isinstance(pairs, frozenset):
        raise TypeError(f"{what} holds a {type(pairs).__name__}, not a frozenset of pairs")
    out = []
    for p in frozenset.__iter__(pairs):
        if not isinstance(p, tuple) or tuple.__len__(p) != 2:
            raise TypeError(f"{what} holds {type(p).__name__}, not a (q_dtype, k_dtype) pair")
        out.append(tuple(tuple.__iter__(p)))
    return out


def _plain_callable(v: Any, what: str) -> Any:
    return v  # plugin code, called only inside the isolation of mqa_core.select._ask


#: How each field's declared type is copied into builtins; a new field needs its type here (a test
#: checks every field has one).
PLAIN: dict[str, Callable[[Any, str], Any]] = {
    "str": _plain_str,
    "int": _plain_int,
    "frozenset[str]": _plain_str_set,
    "PairsDeclaration | None": _plain_pairs,
    "RuntimeCheck | None": _plain_callable,
    "ShapeLimits | None": _plain_callable,
}


def plain_spec(spec: ProviderSpec) -> ProviderSpec:
    """A copy of ``spec`` whose every field is a builtin of exactly its declared type (validated
    again by ``__post_init__``); TypeError or ValueError, naming the field, for what cannot be copied."""
    if type(spec) is not ProviderSpec:
        raise TypeError(f"expected a ProviderSpec, got {type(spec).__name__}")
    values = {}
    for f in fields(ProviderSpec):
        copy = PLAIN[str(f.type)]
        try:
            value = object.__getattribute__(spec, f.name)
        except AttributeError:
            raise TypeError(f"ProviderSpec.{f.name} is missing (a spec built without its constructor)") from None
        values[f.name] = copy(value, f"ProviderSpec.{f.name}")
    return ProviderSpec(**values)
