"""Argument checks for the ops, run before any kernel launches; each error says expected vs got.

Cheap checks (types, dtypes, shapes, devices) always run; checks of values that would need a
device sync (k_scale > 0, block ids in range) run only with ``MQA_VALIDATE=full``.

q and k may be different fp8 flavours: the public ops accept any pair of the contract and choose a
provider that declares it; a bound :class:`~mqa_core.Provider` accepts the pairs its spec declares
on the tensors' arch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .schedule import schedule_problem
from .spec import DTYPES, FP4, FP4_GROUP, FP4_MAX_GROUPS, FP4_PAIR, Problem, ProviderSpec, dtype_name, format_pairs

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_INT32", "dtype_name", "mqa_logits_args", "paged_mqa_logits_args"]

#: Integer arguments and sizes a caller states are below this: the kernels index in int32.
MAX_INT32 = 2**31


def _desc(t: Any) -> str:
    import torch

    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{dtype_name(t.dtype)} {list(t.shape)} on {t.device}"


def _tensor(op: str, name: str, t: Any, dtypes: Sequence[str], shape: Sequence[int | None],
            shape_text: str) -> None:
    import torch

    want = " or ".join(dtypes)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor ({want} {shape_text}); got {_desc(t)}")
    if dtype_name(t.dtype) not in dtypes:
        raise TypeError(f"{op}: {name} must be {want} {shape_text}; got {_desc(t)}")
    if t.dim() != len(shape) or any(s is not None and s != g for s, g in zip(shape, t.shape)):
        raise ValueError(f"{op}: {name} must have shape {_expected(shape, shape_text)}; got {_desc(t)}")


def _expected(shape: Sequence[int | None], shape_text: str) -> str:
    """The expected shape in words and, where the other arguments fix them, in sizes: ``[M, H, D]
    (3 dimensions)``, ``[B, max_blocks] = [2, max_blocks]``, ``[N] = [83] or [N, 1] = [83, 1]``."""
    alternatives = [a.strip() for a in shape_text.split(" or ")]
    dims = [[n.strip() for n in a.strip("[]").split(",")] for a in alternatives]
    if all(s is None for s in shape):
        return f"{shape_text} ({len(shape)} dimension{'s' if len(shape) != 1 else ''})"
    chosen = next((d for d in dims if len(d) == len(shape)), dims[-1])
    known = {n: str(s) for s, n in zip(shape, chosen) if s is not None and not n.isdigit()}
    return " or ".join(f"{a} = [{', '.join(known.get(n, n) for n in d)}]" if any(n in known for n in d) else a
                       for a, d in zip(alternatives, dims))


def _same_device(op: str, named: dict[str, "torch.Tensor"]) -> None:
    devices = {str(t.device) for t in named.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in named.items())
        raise ValueError(f"{op}: all tensors must be on one device; got {where}")


def mqa_logits_args(q: Any, kv: Any, weights: Any, ks: Any, ke: Any, clean_logits: Any, *,
                    spec: ProviderSpec | None = None, full: bool = False, op: str = "fp8_mqa_logits") -> Problem:
    """Check the prefill op's arguments; return the problem sizes. ``op``: the name errors give (the
    prefill top-k op takes the same tensors)."""
    if isinstance(q, (tuple, list)):
        return _fp4_mqa_logits_args(op, q, kv, weights, ks, ke, clean_logits, spec=spec)
    # Any fp8 flavour of the contract: a bound provider's pairs are judged once the device is known.
    _tensor(op, "q", q, DTYPES, (None, None, None), "[M, H, D]")
    m, h, d = q.shape
    if h == 0 or d == 0:
        raise ValueError(f"{op}: q must have H > 0 and D > 0; got {_desc(q)}")
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise TypeError(f"{op}: kv must be a tuple (k [N, D], k_scale [N]); got {type(kv).__name__}"
                        + (f" of length {len(kv)}" if isinstance(kv, (tuple, list)) else ""))
    k, k_scale = kv
    _tensor(op, "k (kv[0])", k, list(DTYPES), (None, d), "[N, D]")
    n = k.shape[0]
    if not (hasattr(k_scale, "dim") and k_scale.dim() == 2):
        _tensor(op, "k_scale (kv[1])", k_scale, ["float32"], (n,), "[N] or [N, 1]")
    else:
        _tensor(op, "k_scale (kv[1])", k_scale, ["float32"], (n, 1), "[N] or [N, 1]")
    _tensor(op, "weights", weights, ["float32"], (m, h), "[M, H]")
    _tensor(op, "cu_seqlen_ks", ks, ["int32"], (m,), "[M]")
    _tensor(op, "cu_seqlen_ke", ke, ["int32"], (m,), "[M]")
    if not isinstance(clean_logits, bool):
        raise TypeError(f"{op}: clean_logits must be a bool; got {type(clean_logits).__name__}")
    _same_device(op, {"q": q, "k": k, "k_scale": k_scale, "weights": weights,
                      "cu_seqlen_ks": ks, "cu_seqlen_ke": ke})
    if spec is not None:
        _serves_device(op, q, spec, dtype_name(k.dtype))
    if full and n and not bool((k_scale > 0).all()):
        raise ValueError(f"{op}: k_scale must be > 0 everywhere (MQA_VALIDATE=full)")
    return Problem(m, n, h, d)


def paged_mqa_logits_args(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_tables: Any,
                          max_context_len: Any, clean_logits: Any, *, schedule: Any = None,
                          spec: ProviderSpec | None = None, full: bool = False,
                          op: str = "fp8_paged_mqa_logits") -> Problem:
    """Check the paged (decode) op's arguments; return the problem sizes (M = B * next_n). A
    ``schedule`` is checked for its layout only (:mod:`mqa_core.schedule`: its values are a hint).
    ``op``: the name errors give (the paged top-k op takes the same tensors)."""
    fp4 = isinstance(q, (tuple, list))
    if fp4:
        q = _fp4_q(op, q, 4)
        q_dev = q[0]
        b, next_n, h, row = q_dev.shape  # row: bytes a token's values take in the cache
        d = 2 * row
    else:
        # Any fp8 flavour of the contract: a bound provider's pairs are judged once the device is known.
        _tensor(op, "q", q, DTYPES, (None, None, None, None), "[B, next_n, H, D]")
        b, next_n, h, d = q.shape
        row = d
        q_dev = q
    if h == 0 or d == 0 or next_n == 0:
        raise ValueError(f"{op}: q must have next_n, H, D > 0; got {_desc(q_dev)}")
    what = "D / 2 + 4" if fp4 else "D + 4"
    _tensor(op, "kv_cache", kv_cache, ["uint8"], (None, None, 1, row + 4),
            f"[num_blocks, block_size, 1, {what}]")
    num_blocks, block_size = kv_cache.shape[:2]
    # DeepGEMM's layout in a (possibly strided) page pool: block i starts stride(0) bytes after block
    # i - 1 and holds block_size * D fp8 bytes (FP4: D / 2 packed bytes a token), then block_size
    # float32 scales (FP4: int32 scale words), 4-byte aligned.
    s = kv_cache.stride()
    block_bytes = block_size * (row + 4)
    bad = []
    if s[3] != 1 or (block_size > 1 and s[1] != row + 4):
        bad.append(f"stride(1) == {what} = {row + 4} and stride(3) == 1")
    if num_blocks > 1 and s[0] < block_bytes:
        bad.append(f"stride(0) >= block_size * ({what}) = {block_bytes} (blocks may not overlap)")
    if num_blocks > 1 and s[0] % 4:
        bad.append("stride(0) a multiple of 4 (for each block's 4-byte scales)")
    if (block_size * row) % 4:
        bad.append(f"block_size * {'D / 2' if fp4 else 'D'} = {block_size * row} a multiple of 4 (the 4-byte "
                   "scales follow the values)")
    if kv_cache.numel() and kv_cache.data_ptr() % 4:
        bad.append("a 4-byte aligned start")
    if bad:
        raise ValueError(f"{op}: kv_cache does not hold DeepGEMM's paged layout: it needs "
                         f"{'; '.join(bad)}; got shape {list(kv_cache.shape)}, strides {tuple(s)}, "
                         f"start address % 4 = {kv_cache.data_ptr() % 4}")
    _tensor(op, "weights", weights, ["float32"], (b * next_n, h), "[B * next_n, H]")
    if hasattr(context_lens, "dim") and context_lens.dim() == 2:
        _tensor(op, "context_lens", context_lens, ["int32"], (b, next_n), "[B] or [B, next_n]")
    else:
        _tensor(op, "context_lens", context_lens, ["int32"], (b,), "[B] or [B, next_n]")
    _tensor(op, "block_tables", block_tables, ["int32"], (b, None), "[B, max_blocks]")
    if not isinstance(max_context_len, int) or isinstance(max_context_len, bool):
        raise TypeError(f"{op}: max_context_len must be a non-negative int below 2**31; got {max_context_len!r}")
    if not 0 <= max_context_len < MAX_INT32:  # the kernels index positions in int32
        raise ValueError(f"{op}: max_context_len must be a non-negative int below 2**31; got {max_context_len!r}")
    if not isinstance(clean_logits, bool):
        raise TypeError(f"{op}: clean_logits must be a bool; got {type(clean_logits).__name__}")
    _same_device(op, {"q": q_dev, **({"q_sf": q[1]} if fp4 else {}), "kv_cache": kv_cache, "weights": weights,
                      "context_lens": context_lens, "block_tables": block_tables})
    wrong = schedule_problem(schedule, q_dev.device)
    if wrong:
        raise TypeError(f"{op}: {wrong}")
    if spec is not None:
        _serves_device(op, q_dev, spec, pair=FP4_PAIR if fp4 else None)
    if full and b:
        covered = block_tables.shape[1] * block_size
        longest = int(context_lens.max())
        if longest > covered:
            raise ValueError(f"{op}: context_lens up to {longest} exceed what block_tables covers "
                             f"({block_tables.shape[1]} blocks x {block_size} = {covered}) (MQA_VALIDATE=full)")
        if longest > max_context_len:
            raise ValueError(f"{op}: context_lens up to {longest} exceed max_context_len={max_context_len}")
        import torch

        pos = torch.arange(block_tables.shape[1], device=block_tables.device) * block_size
        lens = context_lens.max(dim=1).values if context_lens.dim() == 2 else context_lens
        used = pos[None, :] < lens[:, None]
        ids = block_tables[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
            raise ValueError(f"{op}: block_tables holds block ids outside [0, {num_blocks}) "
                             f"(min {int(ids.min())}, max {int(ids.max())}) (MQA_VALIDATE=full)")
    return Problem(b * next_n, max_context_len, h, d)


def _serves_device(op: str, q: "torch.Tensor", spec: ProviderSpec, k_dtype: str | None = None,
                   pair: tuple[str, str] | None = None) -> None:
    """The bound provider serves the tensors' arch and their (q, k) dtype pair there (paged: (q, q);
    ``pair``: the pair when it is not read off the dtypes, FP4's)."""
    from .arch import arch_of_device

    arch = arch_of_device(q.device)
    if not spec.serves_arch(arch):
        raise ValueError(f"{op}: provider {spec.name} serves {', '.join(sorted(spec.archs))}; "
                         f"the tensors are on {q.device} ({arch})")
    q_dtype = dtype_name(q.dtype)
    pair = pair or (q_dtype, k_dtype or q_dtype)
    declared = spec.pairs_for(arch)
    if pair not in declared:
        if pair == FP4_PAIR:
            raise TypeError(f"{op}: FP4 inputs (packed e2m1 with UE8M0 scales, group {FP4_GROUP}) on {arch}, "
                            f"but provider {spec.name} does not serve FP4 there (declares "
                            f"{format_pairs(declared) or 'nothing'} on {arch})")
        what = "q and k" if k_dtype is not None else "q (and the cache)"
        raise TypeError(f"{op}: {what} are ({pair[0]}, {pair[1]}), but provider {spec.name} declares "
                        f"{format_pairs(declared)} on {arch}")


_PACKED = ("int8", "uint8")


def _fp4_q(op: str, q: Any, dims: int) -> tuple[Any, Any]:
    """``q = (values, scales)``: packed FP4 values int8/uint8 ``[..., H, D / 2]`` (``dims`` dims) and
    int32 scales over the same leading dims; D a multiple of 32, at most 128 (four scales a word)."""
    shape = "[M, H, D / 2]" if dims == 3 else "[B, next_n, H, D / 2]"
    if len(q) != 2:
        raise TypeError(f"{op}: q must be a tensor (fp8) or (q, q_sf) (FP4: {FP4}); got a {type(q).__name__} "
                        f"of length {len(q)}")
    values, sf = q
    _tensor(op, "q (FP4 values, q[0])", values, _PACKED, (None,) * dims, shape)
    w = values.shape[-1]
    if values.shape[-2] == 0 or w == 0 or (2 * w) % FP4_GROUP or 2 * w > FP4_GROUP * FP4_MAX_GROUPS:
        raise ValueError(f"{op}: FP4 q must have H > 0 and D = 2 * {w} a positive multiple of {FP4_GROUP}, at "
                         f"most {FP4_GROUP * FP4_MAX_GROUPS} (one int32 of UE8M0 scales per head); got {_desc(values)}")
    _tensor(op, "q_sf (FP4 scales, q[1])", sf, ["int32"], tuple(values.shape[:-1]), shape.replace(", D / 2]", "]"))
    return values, sf


def _fp4_mqa_logits_args(op: str, q: Any, kv: Any, weights: Any, ks: Any, ke: Any, clean_logits: Any, *,
                         spec: ProviderSpec | None) -> Problem:
    """The prefill op with FP4 inputs: ``q = (values [M, H, D / 2], q_sf int32 [M, H])``, ``kv = (k [N,
    D / 2] packed, k_sf int32 [N])`` (no key scale: the UE8M0 scales are the values')."""
    values, sf = _fp4_q(op, q, 3)
    m, h, w = values.shape
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise TypeError(f"{op}: with FP4 q, kv must be a tuple (k [N, D / 2] packed, k_sf int32 [N]); "
                        f"got {type(kv).__name__}")
    k, k_sf = kv
    _tensor(op, "k (FP4 values, kv[0])", k, _PACKED, (None, w), "[N, D / 2]")
    n = k.shape[0]
    _tensor(op, "k_sf (FP4 scales, kv[1])", k_sf, ["int32"], (n,), "[N]")
    _tensor(op, "weights", weights, ["float32"], (m, h), "[M, H]")
    _tensor(op, "cu_seqlen_ks", ks, ["int32"], (m,), "[M]")
    _tensor(op, "cu_seqlen_ke", ke, ["int32"], (m,), "[M]")
    if not isinstance(clean_logits, bool):
        raise TypeError(f"{op}: clean_logits must be a bool; got {type(clean_logits).__name__}")
    _same_device(op, {"q": values, "q_sf": sf, "k": k, "k_sf": k_sf, "weights": weights,
                      "cu_seqlen_ks": ks, "cu_seqlen_ke": ke})
    if spec is not None:
        _serves_device(op, values, spec, pair=FP4_PAIR)
    return Problem(m, n, h, 2 * w)


def fp4_text(arch: str) -> str:
    """What FP4 inputs are, for the error a call gets where no provider serves them on ``arch``."""
    return (f"FP4 inputs ({FP4}: packed e2m1 with UE8M0 scales, group {FP4_GROUP}) are served on {arch} by no "
            "installed provider that can run here (FP4 is declared by the deepgemm provider on sm_100, and by "
            "torch_ref on the CPU)")
