"""Exact e4m3fn -> e4m3fnuz conversion, for gfx942 (whose MFMA reads fp8 as e4m3fnuz).

Both formats have 3 mantissa bits; fnuz has exponent bias 8 instead of 7, so the same byte read as
fnuz is exactly half its e4m3fn value (subnormals included). Re-labelling the bytes and doubling the
scale is therefore exact, whereas a value cast would saturate everything above 240. Only two special
cases need new bytes: e4m3fn's -0 (0x80 is fnuz's NaN) becomes +0, and e4m3fn's NaNs (0x7f, 0xff,
which fnuz reads as +-240) become 0x80.
"""

from __future__ import annotations

from typing import TypeVar

import torch

__all__ = ["FNUZ_ARCHS", "conversions", "e4m3fn_to_e4m3fnuz", "served_pairs", "wants_fnuz"]

#: Archs whose fp8 MMA reads e4m3fnuz rather than OCP e4m3fn.
FNUZ_ARCHS = frozenset({"gfx942"})

S = TypeVar("S", torch.Tensor, float)


def wants_fnuz(arch: str) -> bool:
    """Whether fp8 tensors for ``arch`` must be e4m3fnuz."""
    return arch in FNUZ_ARCHS


def served_pairs(arch: str) -> frozenset[tuple[str, str]]:
    """The (q, k) dtype names the Triton kernel serves on ``arch``: the spec's table; e4m3fn alone
    for an arch the table does not list."""
    from . import DTYPE_PAIRS, FN

    return DTYPE_PAIRS.get(arch, frozenset({(FN, FN)}))


def conversions(arch: str, q_dtype: torch.dtype, k_dtype: torch.dtype) -> tuple[bool, bool]:
    """Whether q and k must be relabelled e4m3fn -> e4m3fnuz before the kernel runs on ``arch``.

    Only where the MMA reads fnuz and the operand is e4m3fn; an operand already in the kernel's
    format is never touched. Raises TypeError, naming the pair, for a pair ``arch`` is not served.
    """
    pair = (str(q_dtype).removeprefix("torch."), str(k_dtype).removeprefix("torch."))
    served = served_pairs(arch)
    if pair not in served:
        raise TypeError(f"the Triton kernel does not take (q, k) = ({pair[0]}, {pair[1]}) on {arch}; there it serves "
                        + ", ".join(f"({q}, {k})" for q, k in sorted(served)))
    fnuz = wants_fnuz(arch)
    return fnuz and q_dtype == torch.float8_e4m3fn, fnuz and k_dtype == torch.float8_e4m3fn


def e4m3fn_to_e4m3fnuz(x: torch.Tensor, scale: S) -> tuple[torch.Tensor, S]:
    """``(x_fnuz, 2 * scale)`` with ``x_fnuz * 2 == x`` exactly (NaN stays NaN, -0 becomes +0).

    ``scale`` is whatever multiplies ``x`` downstream: k_scale for k, and for q the weights (the
    op is linear in each q[m, h] up to relu, and relu(x / 2) == relu(x) / 2).
    """
    if x.dtype != torch.float8_e4m3fn:
        raise TypeError(f"expected float8_e4m3fn, got {x.dtype}")
    bits = x.view(torch.uint8)
    nan = (bits & 0x7F) == 0x7F
    out = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    out = torch.where(nan, torch.full_like(bits, 0x80), out)
    return out.view(torch.float8_e4m3fnuz), scale * 2
