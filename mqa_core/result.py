"""What a kernel returned, checked against the op's contract before the caller sees it.

The cheap check runs on every call: a few attribute reads (type, dtype, shape, device, strides), no
device sync; and the output must not overlap any input in memory (pointer arithmetic: a kernel that
hands back a view of an input, or writes its result into one, is refused). With ``MQA_VALIDATE=full``
the values are checked too: every cell inside a window must be finite, and with ``clean_logits``
every cell outside must be ``-inf``. A mismatch raises
:class:`~mqa_core.errors.ProviderResultError` naming the provider and its distribution.

Imported only once a provider is loaded (it imports torch; ``import mqa_core`` must not).
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import ProviderResultError
from .names import printable
from .reference import visible_lengths
from .spec import ProviderSpec

_Tensor = torch.Tensor
_F32 = torch.float32


def _who(spec: ProviderSpec, op: str) -> str:
    return (f"provider {spec.name} ({spec.distribution or '?'}=={spec.version or '?'}) returned a wrong "
            f"result from {op}")


def _fail(spec: ProviderSpec, op: str, text: str) -> ProviderResultError:
    return ProviderResultError(f"{_who(spec, op)}: {text}", spec.name, spec.distribution)


def check_logits(out: Any, spec: ProviderSpec, op: str, m: int, n: int, device: torch.device,
                 dtype: torch.dtype = _F32) -> None:
    """Type exactly torch.Tensor (a subclass can override anything it is asked), dtype ``dtype``
    (float32 unless the call asked for other logits), shape [m, n], on ``device``, last dim
    contiguous, row stride >= n. Raises ProviderResultError saying what was expected and what came
    back."""
    if type(out) is _Tensor:
        if out.dtype is dtype and out.shape == (m, n) and out.device == device:
            s0, s1 = out.stride()
            if (s1 == 1 or n <= 1) and (s0 >= n or m <= 1):
                return
    raise _mismatch(out, spec, op, m, n, device, dtype)


def conform_logits(out: Any, spec: ProviderSpec, op: str, m: int, n: int, device: torch.device, dtype: str,
                   round_here: bool) -> torch.Tensor:
    """The logits of a call that asked for ``dtype`` (a torch name: ``"bfloat16"``), checked as
    :func:`check_logits` does. ``round_here``: the kernel does not write that dtype itself (its op
    function does not name ``logits_dtype``), so its float32 logits, once they pass the float32 check,
    are rounded to ``dtype`` here (round to nearest even; -inf stays -inf), a copy of [m, n]."""
    want = getattr(torch, dtype)
    if round_here:
        check_logits(out, spec, op, m, n, device)
        return out.to(want)
    check_logits(out, spec, op, m, n, device, want)
    return out


def _mismatch(out: Any, spec: ProviderSpec, op: str, m: int, n: int, device: torch.device,
              dtype: torch.dtype = _F32) -> ProviderResultError:
    name = str(dtype).removeprefix("torch.")
    expected = f"a {name} torch.Tensor [{m}, {n}] on {device}, last dim contiguous, row stride >= {n}"
    if not isinstance(out, _Tensor):
        return _fail(spec, op, f"expected {expected}; got {_type_name(out)}")
    if type(out) is not _Tensor:
        return _fail(spec, op, f"expected {expected}; got a subclass of it, {_type_name(out)} (a result must "
                               "be exactly torch.Tensor)")
    wrong = []
    if out.dtype != dtype:
        wrong.append(f"dtype {str(out.dtype).removeprefix('torch.')} (expected {name})")
    if tuple(out.shape) != (m, n):
        wrong.append(f"shape {list(out.shape)} (expected [{m}, {n}])")
    if out.device != device:
        wrong.append(f"device {out.device} (expected {device}, q's)")
    if out.dim() == 2 and tuple(out.shape) == (m, n):
        s0, s1 = out.stride()
        if not (s1 == 1 or n <= 1):
            wrong.append(f"strides {(s0, s1)}: last dim not contiguous")
        elif not (s0 >= n or m <= 1):
            wrong.append(f"strides {(s0, s1)}: rows overlap (row stride < {n})")
    return _fail(spec, op, f"expected {expected}; got " + "; ".join(wrong))


def extent(t: torch.Tensor) -> int:
    """The bytes ``t`` spans from its first element's address (0 when it has no element); torch's
    strides are never negative, so every element lies in ``[t.data_ptr(), t.data_ptr() + extent(t))``."""
    if t.is_contiguous():  # the common case, in two C++ calls
        return t.nbytes
    if t.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()


def overlap(out: torch.Tensor, inputs: tuple[torch.Tensor | None, ...]) -> int | None:
    """The index of the first of ``inputs`` whose memory overlaps ``out``'s, or None: pointer
    arithmetic on start addresses and extents (same device: the argument checks made sure)."""
    size = extent(out)
    if not size:
        return None
    lo = out.data_ptr()
    hi = lo + size
    for i, t in enumerate(inputs):
        if t is None:  # an optional input the call did not pass
            continue
        e = extent(t)
        p = t.data_ptr()
        if e and p < hi and lo < p + e:
            return i
    return None


def check_disjoint(out: torch.Tensor, inputs: tuple[torch.Tensor | None, ...], names: tuple[str, ...],
                   spec: ProviderSpec, op: str) -> None:
    """ProviderResultError when the output overlaps an input in memory: a view of an input, or a
    result written into the caller's memory (the ops mutate nothing; see docs/hooks.md)."""
    i = overlap(out, inputs)
    if i is not None:
        hit = inputs[i]
        assert hit is not None  # overlap() skips absent inputs
        raise _fail(spec, op, f"the output overlaps input {names[i]} in memory (it starts at "
                              f"{out.data_ptr():#x}, {names[i]} at {hit.data_ptr():#x}): a result must "
                              "be memory of its own, never a view of an input or written into one")


def _type_name(out: Any) -> str:
    """``module.Qualname`` of what a kernel returned, as printable text (its class is the plugin's)."""
    return printable(f"{type(out).__module__}.{type(out).__qualname__}")


def _check_windows(out: torch.Tensor, inside: torch.Tensor, clean: bool, spec: ProviderSpec, op: str) -> None:
    bad = inside & ~torch.isfinite(out)
    if bool(bad.any()):
        r, c = (int(i) for i in bad.nonzero()[0])
        raise _fail(spec, op, f"{int(bad.sum())} non-finite value(s) inside the windows, where every value "
                              f"is finite; first at [{r}, {c}]: {float(out[r, c])} (MQA_VALIDATE=full)")
    if clean:
        bad = ~inside & ~torch.isneginf(out)
        if bool(bad.any()):
            r, c = (int(i) for i in bad.nonzero()[0])
            raise _fail(spec, op, f"{int(bad.sum())} value(s) outside the windows are not -inf although "
                                  f"clean_logits=True; first at [{r}, {c}]: {float(out[r, c])} (MQA_VALIDATE=full)")


def check_mqa_values(out: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, clean: bool,
                     spec: ProviderSpec) -> None:
    """Finite inside each query's window [max(ks, 0), min(ke, N)); -inf outside when ``clean``."""
    n = out.shape[1]
    cols = torch.arange(n, device=out.device)[None, :]
    inside = (cols >= ks.long().clamp(min=0)[:, None]) & (cols < ke.long().clamp(max=n)[:, None])
    _check_windows(out, inside, clean, spec, "fp8_mqa_logits")


def check_paged_values(out: torch.Tensor, context_lens: torch.Tensor, next_n: int, clean: bool,
                       spec: ProviderSpec) -> None:
    """Finite at each row's visible positions; -inf beyond them when ``clean``."""
    n = out.shape[1]
    lens = visible_lengths(context_lens, next_n).clamp(0, n)
    inside = torch.arange(n, device=out.device)[None, :] < lens[:, None]
    _check_windows(out, inside, clean, spec, "fp8_paged_mqa_logits")
