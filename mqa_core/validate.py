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
from .spec import DTYPES, Problem, ProviderSpec, dtype_name, format_pairs

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
                    spec: ProviderSpec | None = None, full: bool = False) -> Problem:
    """Check the prefill op's arguments; return the problem sizes."""
    op = "fp8_mqa_logits"
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
                          spec: ProviderSpec | None = None, full: bool = False) -> Problem:
    """Check the paged (decode) op's arguments; return the problem sizes (M = B * next_n). A
    ``schedule`` is checked for its layout only (:mod:`mqa_core.schedule`: its values are a hint)."""
    op = "fp8_paged_mqa_logits"
    # Any fp8 flavour of the contract: a bound provider's pairs are judged once the device is known.
    _tensor(op, "q", q, DTYPES, (None, None, None, None), "[B, next_n, H, D]")
    b, next_n, h, d = q.shape
    if h == 0 or d == 0 or next_n == 0:
        raise ValueError(f"{op}: q must have next_n, H, D > 0; got {_desc(q)}")
    _tensor(op, "kv_cache", kv_cache, ["uint8"], (None, None, 1, d + 4),
            "[num_blocks, block_size, 1, D + 4]")
    num_blocks, block_size = kv_cache.shape[:2]
    # DeepGEMM's layout in a (possibly strided) page pool: block i starts stride(0) bytes after block
    # i - 1 and holds block_size * D fp8 bytes, then block_size float32 scales (4-byte aligned).
    s = kv_cache.stride()
    block_bytes = block_size * (d + 4)
    bad = []
    if s[3] != 1 or (block_size > 1 and s[1] != d + 4):
        bad.append(f"stride(1) == D + 4 = {d + 4} and stride(3) == 1")
    if num_blocks > 1 and s[0] < block_bytes:
        bad.append(f"stride(0) >= block_size * (D + 4) = {block_bytes} (blocks may not overlap)")
    if num_blocks > 1 and s[0] % 4:
        bad.append("stride(0) a multiple of 4 (for each block's float32 scales)")
    if (block_size * d) % 4:
        bad.append(f"block_size * D = {block_size * d} a multiple of 4 (the float32 scales follow "
                   "the fp8 values)")
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
    _same_device(op, {"q": q, "kv_cache": kv_cache, "weights": weights,
                      "context_lens": context_lens, "block_tables": block_tables})
    wrong = schedule_problem(schedule, q.device)
    if wrong:
        raise TypeError(f"{op}: {wrong}")
    if spec is not None:
        _serves_device(op, q, spec)
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


def _serves_device(op: str, q: "torch.Tensor", spec: ProviderSpec, k_dtype: str | None = None) -> None:
    """The bound provider serves the tensors' arch and their (q, k) dtype pair there (paged: (q, q))."""
    from .arch import arch_of_device

    arch = arch_of_device(q.device)
    if not spec.serves_arch(arch):
        raise ValueError(f"{op}: provider {spec.name} serves {', '.join(sorted(spec.archs))}; "
                         f"the tensors are on {q.device} ({arch})")
    q_dtype = dtype_name(q.dtype)
    pair = (q_dtype, k_dtype or q_dtype)
    declared = spec.pairs_for(arch)
    if pair not in declared:
        what = "q and k" if k_dtype is not None else "q (and the cache)"
        raise TypeError(f"{op}: {what} are ({pair[0]}, {pair[1]}), but provider {spec.name} declares "
                        f"{format_pairs(declared)} on {arch}")
