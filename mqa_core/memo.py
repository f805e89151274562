"""What a call signature has already passed: the per-call path's memory.

A call's signature is everything the cheap argument checks and the choice of provider read: each
tensor argument's type, shape, strides, dtype and device, and each other argument with its type (so
``1`` is not mistaken for ``True``, nor ``5.0`` for ``5``). A signature that passed once is not checked
again: the ops remember the :class:`~mqa_core.spec.Problem` the checks returned (and, for the public
ops, the provider chosen for it) and reuse them. The checks themselves stay in :mod:`mqa_core.validate`,
the one source of truth: a signature not seen yet is always judged by them, so every error and
message is theirs, and a call that fails leaves nothing behind.

Not remembered: anything under ``MQA_VALIDATE=full`` (its checks read values, which need a device
sync and change between calls with the same signature), and calls whose signature cannot be built (an
argument that is not a tensor where one belongs: the checks then say what is wrong).

Both ops take one path (:meth:`mqa_core.Provider.call`, ``mqa_core.api``): an :class:`Op` holds what
differs between them (the signature, the checks, the value checks of ``MQA_VALIDATE=full``, the dtype
pair a provider is chosen on). A table's entry is the same for both ops and every table: (problem,
provider, the provider's call prepared for the signature or None; see
:meth:`mqa_core.Provider.prepare`). Start addresses are not part of a signature (the checks read
none but the paged cache's modulo 4): reading five more per call would cost every provider, while a
prepared call that depends on alignment reads its pointers anyway and checks them itself.

Tables belong to the registry's state (the public ops') or to a provider loaded in it (a bound
provider's), so :func:`mqa_core.reload` drops them. Each holds at most :data:`MAX_SIGNATURES` entries;
a full table is emptied and fills again. Every write is one dictionary operation (or one attribute
assignment), atomic on its own, so the per-call path takes no lock.

The last signature found (:class:`CallTable`): building a signature reads every tensor's shape,
strides, dtype and device in Python (~4 us per paged call on a 2-core CPU, ~2 on the H200's host, with
its hash), where a decode step sends one signature for every layer. So a table also keeps the last
signature it served with a tensor check built for it from torch's own guard type
(``torch._C._dynamo.guards.TensorGuards``, what ``torch.compile`` checks its inputs with: type,
dispatch keys, dtype, device, requires_grad, sizes and strides, in C++), and a call first asks that
check and compares its other arguments (values and types) with the last signature's. Only a call
that passes both is served without building its signature; any other takes the full path, so a
mismatch costs one check. The check is built on a signature's second call, once, and checked on the
tensors it was built from; where torch lacks that type or it refuses them, the signature keeps the
full path (a private torch API: the full path stays the one the results depend on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from . import validate
from .spec import FP4_PAIR, Pair, Problem, ProviderSpec, dtype_name

__all__ = ["LOGITS_DTYPES", "MAX_SIGNATURES", "MQA", "MQA_BF16", "PAGED", "PAGED_BF16", "CallTable", "Op", "Signature",
           "logits_dtype_name", "mqa_problem", "mqa_recall", "output_check", "paged_problem", "paged_recall",
           "remember", "with_logits_dtype"]

#: The most signatures one table remembers (engines send a handful of shapes per op).
MAX_SIGNATURES = 1024

Signature = tuple[Any, ...]
V = TypeVar("V")


class CallTable(dict):  # type: ignore[type-arg]
    """Remembered signatures (signature -> entry), and the last one found with its tensor check:
    ``last`` = (check, the other arguments, signature, entry) or None; ``guards`` = signature -> its
    tensor check, or False where none can be built (see the module's docstring)."""

    __slots__ = ("last", "guards")

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[Any, ...] | None = None
        self.guards: dict[Signature, Any] = {}


def _tensor_check(tensors: tuple[Any, ...]) -> Any:
    """torch's C++ check that tensors match these ones' type, dispatch keys, dtype, device,
    requires_grad, sizes and strides (``TensorGuards.check``), or False where torch has none or it
    does not accept them (then the full path serves every call)."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        # every dimension static: one list of sizes (strides) per tensor (the stub's annotation is flat)
        sizes: Any = [list(t.size()) for t in tensors]
        strides: Any = [list(t.stride()) for t in tensors]
        check = TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
        return check if check(*tensors) is True else False
    except Exception:  # another torch, or tensors it cannot guard: the full path
        return False


def output_check(out: Any, inputs: tuple[Any, ...]) -> Callable[[Any, tuple[Any, ...]], bool] | None:
    """The check a signature's later outputs are held to, built from its first (which passed
    ``mqa_core.result.check_logits`` and ``check_disjoint``): torch's guard of that output's type,
    dtype, device, sizes and strides (~0.3 us in C++ against ~1 us of attribute reads), and that it
    overlaps none of the call's ``inputs`` (the op's tensor arguments, :attr:`Op.tensors`) in memory:
    their extents are the signature's, so this is a few pointer comparisons. None where no guard can
    be built (then every output gets the full checks)."""
    guard = _tensor_check((out,))
    if not guard:
        return None
    from .result import extent

    size = extent(out)
    if not size:  # an empty output overlaps nothing
        return lambda out, inputs: guard(out) is True
    # input i overlaps [lo, lo + size) iff -extent_i < ptr_i - lo < size; an empty input never does
    # (its bound is size, so the test reads size < d < size)
    bounds = tuple(-e if e else size for e in (0 if t is None else extent(t) for t in inputs))

    def check(out: Any, inputs: tuple[Any, ...]) -> bool:
        if not guard(out):
            return False
        lo = out.data_ptr()
        for t, low in zip(inputs, bounds):
            if t is not None and low < t.data_ptr() - lo < size:
                return False
        return True

    return check


def _found(table: Any, key: Signature, entry: Any, scalars: tuple[Any, ...], tensors: tuple[Any, ...]) -> None:
    """Note ``key`` (with ``entry``) as ``table``'s last signature found, with its tensor check."""
    if not isinstance(table, CallTable):
        return
    check = table.guards.get(key)
    if check is None:
        check = _tensor_check(tensors)
        if len(table.guards) >= MAX_SIGNATURES:
            table.guards.clear()
        table.guards[key] = check
    if check is not False:
        table.last = (check, scalars, key, entry)


def mqa_recall(table: Mapping[Signature, V] | None, q: Any, kv: Any, weights: Any, ks: Any, ke: Any,
               clean_logits: Any) -> tuple[Signature | None, V | None]:
    """The prefill call's signature and what ``table`` holds for it (None when nothing).

    ``(None, None)`` without a table (``MQA_VALIDATE=full``) or when the signature cannot be built
    (not tensors where tensors belong: the checks then say what is wrong). One function per op, with
    the signature built inline: the per-call path pays one Python call here, not two.
    """
    if table is None:
        return None, None
    last = getattr(table, "last", None)
    if last is not None:  # the last signature found, asked first (see the module's docstring)
        try:
            k, k_scale = kv
            if last[1] == (type(kv), type(clean_logits), clean_logits) and last[0](q, k, k_scale, weights, ks, ke):
                return last[2], last[3]
        except Exception:  # not what the last call sent: the full path says what it is
            pass
    try:
        k, k_scale = kv
        key = (type(kv), type(clean_logits), clean_logits,
               type(q), q.shape, q.stride(), q.dtype, q.device,
               type(k), k.shape, k.stride(), k.dtype, k.device,
               type(k_scale), k_scale.shape, k_scale.stride(), k_scale.dtype, k_scale.device,
               type(weights), weights.shape, weights.stride(), weights.dtype, weights.device,
               type(ks), ks.shape, ks.stride(), ks.dtype, ks.device,
               type(ke), ke.shape, ke.stride(), ke.dtype, ke.device)
    except Exception:
        return None, None
    entry = table.get(key)
    if entry is not None:
        _found(table, key, entry, key[:3], (q, k, k_scale, weights, ks, ke))
    return key, entry


def paged_recall(table: Mapping[Signature, V] | None, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                 block_tables: Any, max_context_len: Any, schedule: Any,
                 clean_logits: Any) -> tuple[Signature | None, V | None]:
    """As :func:`mqa_recall`, for the paged op (``max_context_len`` is the problem's N, so it is part of
    the signature; the cache's start address modulo 4 too, since the checks require its float32
    scales aligned; and the schedule's layout, or None)."""
    if table is None:
        return None, None
    last = getattr(table, "last", None)
    if last is not None:  # the last signature found, asked first (see the module's docstring)
        try:
            if last[1] == (type(max_context_len), max_context_len, type(clean_logits), clean_logits,
                           kv_cache.data_ptr() & 3, schedule is None) \
                    and (last[0](q, kv_cache, weights, context_lens, block_tables) if schedule is None
                         else last[0](q, kv_cache, weights, context_lens, block_tables, schedule)):
                return last[2], last[3]
        except Exception:  # not what the last call sent: the full path says what it is
            pass
    try:
        key = (type(max_context_len), max_context_len, type(clean_logits), clean_logits,
               type(q), q.shape, q.stride(), q.dtype, q.device,
               type(kv_cache), kv_cache.shape, kv_cache.stride(), kv_cache.dtype, kv_cache.device,
               kv_cache.data_ptr() & 3,
               type(weights), weights.shape, weights.stride(), weights.dtype, weights.device,
               type(context_lens), context_lens.shape, context_lens.stride(), context_lens.dtype,
               context_lens.device,
               type(block_tables), block_tables.shape, block_tables.stride(), block_tables.dtype,
               block_tables.device,
               None if schedule is None else (type(schedule), schedule.shape, schedule.stride(), schedule.dtype,
                                              schedule.device))
    except Exception:
        return None, None
    entry = table.get(key)
    if entry is not None:
        tensors = (q, kv_cache, weights, context_lens, block_tables)
        _found(table, key, entry, (*key[:4], key[14], schedule is None),
               tensors if schedule is None else (*tensors, schedule))
    return key, entry


def remember(table: dict[Signature, V] | None, key: Signature | None, value: V) -> None:
    """``table[key] = value``, emptying a full table first (each step one atomic dict operation);
    nothing when the recall gave no signature."""
    if table is None or key is None:
        return
    if len(table) >= MAX_SIGNATURES:
        table.clear()
        if isinstance(table, CallTable):
            table.last = None
            table.guards.clear()
    table[key] = value


def paged_problem(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_tables: Any,
                  max_context_len: Any, schedule: Any, clean_logits: Any, *, spec: ProviderSpec | None = None,
                  full: bool = False) -> Problem:
    """:func:`mqa_core.validate.paged_mqa_logits_args`, and the problem it returns completed with
    ``next_n`` and ``block_size`` (which the checks have just established), for shape limits and
    tuning buckets."""
    problem = validate.paged_mqa_logits_args(q, kv_cache, weights, context_lens, block_tables,
                                             max_context_len, clean_logits, schedule=schedule, spec=spec,
                                             full=full)
    values = q[0] if isinstance(q, (tuple, list)) else q  # FP4: (values, scales)
    return replace(problem, next_n=values.shape[1], block_size=kv_cache.shape[1])


def mqa_problem(q: Any, kv: Any, weights: Any, ks: Any, ke: Any, clean_logits: Any, *,
                spec: ProviderSpec | None = None, full: bool = False) -> Problem:
    """:func:`mqa_core.validate.mqa_logits_args` (looked up per call: tests count the checks)."""
    return validate.mqa_logits_args(q, kv, weights, ks, ke, clean_logits, spec=spec, full=full)


def _mqa_values(result: Any, out: Any, args: tuple[Any, ...], clean_logits: bool, spec: ProviderSpec) -> None:
    result.check_mqa_values(out, args[3], args[4], clean_logits, spec)


def _paged_values(result: Any, out: Any, args: tuple[Any, ...], clean_logits: bool, spec: ProviderSpec) -> None:
    q = args[0][0] if isinstance(args[0], (tuple, list)) else args[0]
    result.check_paged_values(out, args[3], q.shape[1], clean_logits, spec)


def _mqa_pair(args: tuple[Any, ...]) -> Pair:
    if isinstance(args[0], (tuple, list)):  # FP4: (values, scales)
        return FP4_PAIR
    return dtype_name(args[0].dtype), dtype_name(args[1][0].dtype)


def _paged_pair(args: tuple[Any, ...]) -> Pair:
    if isinstance(args[0], (tuple, list)):  # FP4: (values, scales)
        return FP4_PAIR
    name = dtype_name(args[0].dtype)  # the cache holds bytes of q's fp8 flavour
    return name, name


def device_of(q: Any) -> Any:
    """The device of an op's ``q``: a tensor, or FP4's (values, scales). For the paths that run once
    per signature (a remembered one reads ``args[0].device`` of tensors it knows)."""
    return (q[0] if isinstance(q, (tuple, list)) else q).device


@dataclass(frozen=True)
class Op:
    """What the per-call path needs to know of one op; its arguments travel as one tuple ``args`` (the
    five tensor arguments first, then the paged op's ``max_context_len`` and ``schedule``)."""

    name: str
    #: (table, *args, clean_logits) -> (signature or None, the table's entry or None)
    recall: Callable[..., tuple[Signature | None, Any]]
    #: (*args, clean_logits, spec=, full=) -> Problem: the op's checks
    check: Callable[..., Problem]
    #: (the result module, out, args, clean_logits, spec): the value checks of MQA_VALIDATE=full
    values: Callable[[Any, Any, tuple[Any, ...], bool, ProviderSpec], None]
    #: args -> the (q, k) dtype pair a provider is chosen on
    pair: Callable[[tuple[Any, ...]], Pair]
    #: How many of ``args`` the kernel function takes positionally; the rest are the call's hints.
    positional: int
    #: The hints' names, in their order in ``args`` after the positional ones: keyword arguments a
    #: kernel function receives only where it names them (and the call gives one, not None), as pluggy
    #: passes a hook only the arguments it takes.
    hint_names: tuple[str, ...] = ()
    #: args -> the op's tensor arguments (what an output must not overlap), named by :attr:`tensor_names`
    tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]] = tuple
    tensor_names: tuple[str, ...] = ()
    #: The logits' dtype, as torch names it, where it is not float32 (None: float32, the ops' default).
    #: Such a variant of an op is an op of its own here: its own memo tables, and its ``args`` end with
    #: the torch dtype, which a kernel function receives as the hint ``logits_dtype`` where it names it.
    logits_dtype: str | None = None
    #: The name of the kernel object's optional ``prepare_<op>`` function (set from ``name``; a field, not
    #: a property: the per-call path reads it).
    prepare: str = field(init=False)
    #: What a provider keys its per-function facts by (``name``, or ``name[dtype]`` for a variant), and
    #: the same for the prepare function.
    key: str = field(init=False)
    prepare_key: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prepare", f"prepare_{self.name}")
        suffix = f"[{self.logits_dtype}]" if self.logits_dtype else ""
        object.__setattr__(self, "key", self.name + suffix)
        object.__setattr__(self, "prepare_key", self.prepare + suffix)


#: The logits dtypes the ops produce (torch's names): float32 (the default) and bfloat16.
LOGITS_DTYPES = ("float32", "bfloat16")


def logits_dtype_name(dtype: Any, op: str) -> str:
    """``torch.bfloat16`` (or its name) -> ``"bfloat16"``; TypeError naming the op for anything else
    than the dtypes of :data:`LOGITS_DTYPES`."""
    name = dtype_name(dtype) if dtype is not None else "float32"
    if name not in LOGITS_DTYPES:
        raise TypeError(f"{op}: logits_dtype must be torch.float32 or torch.bfloat16; got {dtype!r}")
    return name


def with_logits_dtype(op: Op, dtype: str) -> Op:
    """``op`` producing ``dtype`` logits: the same checks and signatures (its tables are its own, so
    the dtype need not enter them), ``args`` one longer (the torch dtype, passed as the hint
    ``logits_dtype``)."""
    base_recall, base_check, n = op.recall, op.check, op.positional + len(op.hint_names)

    def recall(table: Any, *a: Any) -> tuple[Signature | None, Any]:
        return base_recall(table, *a[:n], a[-1])

    def check(*a: Any, **kw: Any) -> Problem:
        return base_check(*a[:n], a[-1], **kw)

    return replace(op, recall=recall, check=check, hint_names=(*op.hint_names, "logits_dtype"),
                   logits_dtype=dtype)


def _q_tensors(q: Any) -> tuple[Any, ...]:
    """(q, None), or (q values, q_sf) for FP4. An absent tensor is None in :attr:`Op.tensors`, so
    each input keeps its index and name."""
    return (q, None) if not isinstance(q, tuple) else (q[0], q[1])


def _mqa_tensors(args: tuple[Any, ...]) -> tuple[Any, ...]:
    q, kv, weights, ks, ke = args[:5]  # a logits_dtype variant appends the dtype
    q, sf = _q_tensors(q)
    return (q, kv[0], kv[1], weights, ks, ke, sf)


def _paged_tensors(args: tuple[Any, ...]) -> tuple[Any, ...]:
    q, sf = _q_tensors(args[0])
    return (q, *args[1:5], args[6], sf)


MQA = Op("fp8_mqa_logits", mqa_recall, mqa_problem, _mqa_values, _mqa_pair, 5, (), _mqa_tensors,
         ("q", "k", "k_scale", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "q_sf"))
PAGED = Op("fp8_paged_mqa_logits", paged_recall, paged_problem, _paged_values, _paged_pair, 6, ("schedule",),
           _paged_tensors, ("q", "kv_cache", "weights", "context_lens", "block_tables", "schedule", "q_sf"))
MQA_BF16 = with_logits_dtype(MQA, "bfloat16")
PAGED_BF16 = with_logits_dtype(PAGED, "bfloat16")
#: The ops by name (``mqa_core.spec.OPS`` lists the names a spec may declare).
OP_BY_NAME = {MQA.name: MQA, PAGED.name: PAGED}
#: Every variant of each op, by name: what a provider reads its kernel object's functions for.
VARIANTS = {MQA.name: (MQA, MQA_BF16), PAGED.name: (PAGED, PAGED_BF16)}
