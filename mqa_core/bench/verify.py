"""Correctness before speed: a provider's output against a reference, on the device, row chunk by chunk.

The metric and mask rule are the kit's (calc_diff < 1e-3 in-window, -inf mask identical with
clean_logits); done on the device in float64 sums so a 16k x 48k output needs no host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..testing.checks import TOLERANCE


@dataclass(frozen=True)
class Verdict:
    ok: bool
    calc_diff: float
    mask_identical: bool
    against: str
    detail: str = ""


def compare(out: torch.Tensor, ref: torch.Tensor, *, clean: bool, against: str,
            rows_per_chunk: int = 2048) -> Verdict:
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != torch.float32:
        return Verdict(False, float("inf"), False, against,
                       f"returned {out.dtype} {list(out.shape)}, expected float32 {list(ref.shape)}")
    xy = xxyy = 0.0
    stray = bad = 0
    for r0 in range(0, out.shape[0], rows_per_chunk):
        o, r = out[r0:r0 + rows_per_chunk], ref[r0:r0 + rows_per_chunk]
        inside = torch.isfinite(r)
        a, b = o.double().where(inside, 0.0), r.double().where(inside, 0.0)
        bad += int((inside & ~torch.isfinite(o)).sum())
        if clean:
            stray += int((~inside & (o != float("-inf"))).sum())
        if not bad:
            xy += float((a * b).sum())
            xxyy += float((a * a + b * b).sum())
    mask_ok = bad == 0 and stray == 0
    if bad:
        return Verdict(False, float("inf"), False, against, f"{bad} in-window cells are not finite")
    diff = 0.0 if xxyy == 0 else 1.0 - 2.0 * xy / xxyy
    detail = "" if mask_ok else f"{stray} out-of-window cells are not -inf"
    if diff >= TOLERANCE:
        detail = (detail + "; " if detail else "") + f"calc_diff {diff:.2e} >= {TOLERANCE:.0e}"
    return Verdict(mask_ok and diff < TOLERANCE, diff, mask_ok, against, detail)
