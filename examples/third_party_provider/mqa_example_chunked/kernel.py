"""The kernel: fp8 MQA logits one block of keys at a time, all heads of all rows in one matmul.

Structure, not speed, is the point. Each key block finds the rows whose windows reach it (for a
causal prefill a suffix of the rows, so about half the work is skipped), computes their scores for
every head at once, and reduces over heads; the temporaries stay under a fixed budget.
"""

from __future__ import annotations

import torch

#: Bytes the per-block scores [rows * H, block] may take.
SCORE_BUDGET = 64 * 2**20


def key_block(m: int, h: int) -> int:
    """Keys per block: as many as the budget allows for all M * H score rows, 16 to 1024."""
    fit = SCORE_BUDGET // max(1, m * h * 4)
    return max(16, min(1024, fit // 16 * 16))


class ChunkedKernel:
    """The object named by ``SPEC.load``: one method per declared op, with the op's signature."""

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                       weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                       *, clean_logits: bool = True) -> torch.Tensor:
        k, k_scale = kv
        m, h, d = q.shape
        n = k.shape[0]
        # Every cell starts as -inf: outside the windows that is the answer (and never garbage).
        out = torch.full((m, n), float("-inf"), dtype=torch.float32, device=q.device)
        if m == 0 or n == 0:
            return out
        flat = q.float().reshape(m * h, d)  # row r, head j is flat[r * h + j]
        scale = k_scale.reshape(-1).float()  # k_scale arrives as [N] or [N, 1]
        ks = cu_seqlen_ks.long().clamp(0, n)  # windows may start below 0 and end past N
        ke = cu_seqlen_ke.long().clamp(0, n)
        cols = torch.arange(n, device=q.device)
        block = key_block(m, h)
        for c0 in range(0, n, block):
            c1 = min(n, c0 + block)
            reach = ((ks < c1) & (ke > c0)).nonzero()
            if reach.numel() == 0:  # no window touches these keys
                continue
            r0, r1 = int(reach[0]), int(reach[-1]) + 1
            scores = (flat[r0 * h: r1 * h] @ k[c0:c1].float().T).clamp_min_(0)
            logits = torch.einsum("rjc,rj->rc", scores.view(r1 - r0, h, c1 - c0), weights[r0:r1])
            logits.mul_(scale[c0:c1])
            c = cols[None, c0:c1]
            logits.masked_fill_((c < ks[r0:r1, None]) | (c >= ke[r0:r1, None]), float("-inf"))
            out[r0:r1, c0:c1] = logits
        return out


KERNEL = ChunkedKernel()
