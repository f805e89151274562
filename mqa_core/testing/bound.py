"""The error each logit may carry: a per-cell bound derived from the contract, not tuned to a kernel.

Every fp8 x fp8 product is exact in float32 (4-bit significands give 8-bit products, and the
exponents stay in range), so the only error a correct kernel makes is in its sums. With ``A[m,h,n] =
sum_d |q[m,h,d] * k[n,d]|`` and ``T[m,n] = k_scale[n] * sum_h |w[m,h]| * A[m,h,n]`` (everything
that enters cell (m, n), in magnitude), a kernel that sums in float32 in any order is within

    |got - exact| <= SAFETY * (u * D  +  u * (H + 2)) * T[m, n],     u = 2**-24

(Higham's bound for recursive summation, gamma_n <= n*u/(1 - n*u), for the D-term dot product,
then one rounding for each weight product, H - 1 for the head sum and one for k_scale; relu is
exact and cannot grow an error). SAFETY = 2 covers the second-order terms and the kernels that
fold k_scale into the weights or sum in another grouping.

GPU matrix units do not sum fp8 products in float32: Hopper's fp8 MMA keeps 13 fraction bits of
the running sum (an e8m13 accumulator, truncating), one truncation per instruction step; on the
H200 the gluon kernel measures calc_diff ~8e-9 against float64, a relative error of ~1.3e-4. The
``fp8-mma`` model allows that: one error of 2**-13 of the partial sum per 16 products (the
instruction sums 32), plus float32 for the rest. It is the default on GPUs; ``fp32`` is the CPU's.

The bound is per cell, so a kernel that is wrong in one cell in a million fails, and one that is
off by a constant factor (x1.04), or rounds its output through bf16 (2**-9 relative), fails where
the cell's own size dominates its error budget: everywhere on the CPU, and on GPUs in the kit's
positive-data cases, where T[m, n] equals the logit itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .data import exact

#: float32's unit roundoff.
U32 = 2.0 ** -24
#: Headroom over the first-order bound.
SAFETY = 2.0


@dataclass(frozen=True)
class Accumulation:
    """How a kernel sums its fp8 products: one rounding of relative size ``unit`` per ``block`` terms."""

    name: str
    unit: float
    block: int
    about: str

    def __post_init__(self) -> None:
        if not (0 < self.unit < 1 and self.block >= 1):
            raise ValueError(f"accumulation {self.name!r}: unit must be in (0, 1) and block >= 1")

    def factor(self, h: int, d: int) -> float:
        """The bound divided by T[m, n] for H heads of dimension D."""
        return SAFETY * (self.unit * math.ceil(max(d, 1) / self.block) + U32 * (h + 2))

    def text(self, h: int, d: int) -> str:
        steps = math.ceil(max(d, 1) / self.block)
        return (f"{SAFETY:g} * ({self.unit:.3g} * {steps} + 2^-24 * {h + 2}) * T "
                f"= {self.factor(h, d):.3g} * T ({self.name} accumulation)")


FP32 = Accumulation("fp32", U32, 1, "float32 sums in any order (the CPU, CUDA cores)")
FP8_MMA = Accumulation("fp8-mma", 2.0 ** -13, 16,
                       "fp8 matrix instructions that keep 13 fraction bits of the running sum (Hopper)")
ACCUMULATIONS = {a.name: a for a in (FP32, FP8_MMA)}


def default_accumulation(device: torch.device) -> Accumulation:
    """fp32 on the CPU; on GPUs the fp8 matrix units' model (their kernels use them)."""
    return FP32 if device.type == "cpu" else FP8_MMA


def magnitudes(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """T [M, N] float64: ``k_scale[n] * sum_h |w[m,h]| * sum_d |q[m,h,d] * k[n,d]|``, on q's device."""
    a = torch.einsum("mhd,nd->mhn", exact(q).abs(), exact(k).abs())
    return torch.einsum("mhn,mh->mn", a, weights.double().abs()) * k_scale.double().abs().reshape(1, -1)


def _rows_of(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``exact(t[index])``; fp8 is gathered as bytes (every device indexes uint8)."""
    if t.element_size() == 1 and t.dtype.is_floating_point:
        return exact(t.view(torch.uint8)[index].view(t.dtype))
    return t[index].double()


def at_cells(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
             rows: torch.Tensor, cols: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact logit, T) float64 at the cells (rows[i], cols[i]) only, for outputs too large to form.

    ``q`` [M, H, D] and ``k`` [N, D] are indexed by ``rows`` and ``cols``; done in chunks of cells.
    """
    exact_parts, t_parts = [], []
    scale = k_scale.reshape(-1)
    for i in range(0, rows.numel(), chunk):
        r, c = rows[i:i + chunk], cols[i:i + chunk]
        qs, ks = _rows_of(q, r), _rows_of(k, c)  # [S, H, D], [S, D]
        dots = torch.einsum("shd,sd->sh", qs, ks)
        a = torch.einsum("shd,sd->sh", qs.abs(), ks.abs())
        w, s = weights[r].double(), scale[c].double()
        exact_parts.append((dots.clamp_min(0) * w).sum(dim=1) * s)
        t_parts.append((a * w.abs()).sum(dim=1) * s.abs())
    empty = torch.zeros(0, dtype=torch.float64, device=q.device)
    return (torch.cat(exact_parts) if exact_parts else empty), (torch.cat(t_parts) if t_parts else empty)
