"""Correctness before speed: a provider's output against a reference, on the device, row chunk by chunk.

The metric and mask rule are the kit's (calc_diff < 1e-3 in-window, -inf mask identical with
clean_logits); done on the device in float64 sums so a 16k x 48k output needs no host copy. A top-k
op's positions are checked as a selection over the reference logits (:func:`check_selection`).
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


def check_selection(idx: torch.Tensor, ref: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                    against: str, rows_per_chunk: int = 2048) -> Verdict:
    """A top-k op's positions (int32 ``[M, topk]``, absolute, -1 padding) against reference logits
    (``[M, N]``, -inf outside the windows): accepted when every row picks ``min(topk, width)``
    distinct in-window keys and no unpicked in-window key beats a picked one by more than ``1e-5``
    of the row's largest finite magnitude (the provider scored them itself, in fp32). The exact tie
    rule is the kit's to check (``mqa check``), on inputs where it is decidable."""
    m, n = ref.shape
    if tuple(idx.shape) != (m, topk) or idx.dtype != torch.int32:
        return Verdict(False, float("nan"), False, against,
                       f"returned {idx.dtype} {list(idx.shape)}, expected int32 [{m}, {topk}]")
    bad_rows: list[int] = []
    for r0 in range(0, m, rows_per_chunk):
        sel, logits = idx[r0:r0 + rows_per_chunk].long(), ref[r0:r0 + rows_per_chunk]
        lo = ks[r0:r0 + rows_per_chunk].long().clamp(0, n)[:, None]
        hi = ke[r0:r0 + rows_per_chunk].long().clamp(0, n)[:, None]
        valid = sel >= 0
        bad = valid.sum(1) != (hi - lo).clamp(min=0).clamp(max=topk)[:, 0]
        safe = sel.clamp(min=0)
        bad |= (valid & ((safe < lo) | (safe >= hi))).any(1)
        order = torch.sort(torch.where(valid, safe, -1 - torch.arange(topk, device=sel.device)), 1).values
        bad |= (order[:, 1:] == order[:, :-1]).any(1)
        got = logits.gather(1, safe).masked_fill(~valid, float("inf"))
        rest = logits.clone()
        rest.scatter_(1, safe, float("-inf"))  # padding points at key 0: only where every key is picked
        tol = 1e-5 * logits.masked_fill(logits.isinf(), 0).abs().amax(1)
        bad |= got.min(1).values < rest.max(1).values - tol
        bad_rows += (bad.nonzero().flatten() + r0).tolist()
    if bad_rows:
        return Verdict(False, float("nan"), False, against,
                       f"{len(bad_rows)} of {m} rows break the selection rule (first: row {bad_rows[0]})")
    return Verdict(True, float("nan"), True, against)
