"""Inputs for the DeepGEMM provider's tests, on the CPU (stand-in) and on an sm_90/sm_100 GPU (real).

Drawn by the conformance kit's generators; decode lengths follow DeepGEMM's own 1-D rule (row j of
sequence b sees lens[b] - next_n + j + 1), given 1-D or already expanded to [B, next_n], with the
short and block-edge lengths kernels get wrong in the first sequences.
"""

from __future__ import annotations

from typing import Any

import torch

from mqa_core import Problem
from mqa_core.testing.cases import short_context_lens
from mqa_core.testing.data import Inputs, PagedInputs, make_paged_inputs
from mqa_core.testing.runner import Draw, prefill_inputs


def prefill(m: int, n: int, h: int, d: int, window: str, seed: int, *, k_scale_2d: bool = False,
            device: Any = "cpu") -> Inputs:
    """Fresh prefill inputs with one of the kit's window kinds (causal ... edges, short, empty)."""
    return prefill_inputs(Draw.on(torch.device(device), seed), Problem(m, n, h, d), window=window,
                          k_scale_2d=k_scale_2d)


def paged(batch: int, next_n: int, h: int, d: int, ctx: int, *, seed: int, lens_2d: bool = False,
          block_size: int = 64, pool_pad: int = 0, device: Any = "cpu") -> PagedInputs:
    """Decode inputs; ``pool_pad`` > 0 leaves that many poisoned bytes after each block of the page pool."""
    lens = torch.randint(next_n, ctx + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    lens = short_context_lens(lens, next_n, ctx)
    if lens_2d:
        lens = lens[:, None] - next_n + torch.arange(1, next_n + 1, dtype=lens.dtype)[None, :]
    x = make_paged_inputs(batch, next_n, h, d, ctx, block_size=block_size, seed=seed, context_lens=lens,
                          pool_pad_bytes=pool_pad, device=device)
    assert x.kv_cache.is_contiguous() == (pool_pad == 0)
    return x
