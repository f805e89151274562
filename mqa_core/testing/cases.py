"""The kit's case tables: sizes per device, window patterns, the H/D grid, paged layouts.

Sizes are deliberately off every tile boundary a kernel is likely to use (16, 32, 64, 128, 256), tiny
on the CPU (a reference kernel must finish the whole kit in seconds) and larger on GPUs, where the
tiles are real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import Problem, ProviderSpec
from .data import windows as data_windows

#: Heads and head dims probed; each pair a spec's shape limits accept is computed and checked, each
#: pair it rejects must be rejected by selection.
HEADS = (1, 8, 16, 32, 64, 128)
HEAD_DIMS = (32, 64, 128, 256)
#: Pairs outside the usual grid: computed if the spec claims them, else rejected by selection.
PROBES = ((3, 48), (256, 128), (64, 512))
#: Where the single-shape cases run, first accepted wins: the sizes the indexers use.
PREFERRED_HD = ((32, 128), (64, 128), (16, 128), (128, 128), (8, 128), (64, 64), (32, 64))

#: Prefill window patterns: data.WINDOWS plus "edges" (every corner case in every row) and "empty".
WINDOW_KINDS = ("causal", "full", "chunk", "ragged", "edges", "empty")


@dataclass(frozen=True)
class Sizes:
    """(M, N) for each family of cases on one device type."""

    windows: tuple[int, int]
    grid: tuple[int, int]
    odd: tuple[tuple[int, int], ...]
    paged_context: int


SIZES = {
    "cpu": Sizes(windows=(29, 83), grid=(11, 37),
                 odd=((1, 1), (1, 70), (40, 7), (32, 128), (3, 129)), paged_context=150),
    "gpu": Sizes(windows=(271, 1331), grid=(67, 389),
                 odd=((1, 1), (1, 4099), (300, 17), (128, 1024), (257, 2049)), paged_context=2100),
}

#: (batch, next_n, lens 2-D, clean_logits) for the paged op.
PAGED_CASES = ((1, 1, False, True), (4, 1, False, True), (2, 2, False, True), (3, 2, True, True),
               (4, 2, True, False), (3, 1, False, False))
PAGED_BLOCK_SIZE = 64


def sizes_for(device: torch.device) -> Sizes:
    return SIZES["cpu" if device.type == "cpu" else "gpu"]


def accepts(spec: ProviderSpec, problem: Problem) -> bool:
    if spec.shape_limits is None:
        return True
    try:
        return spec.shape_limits(problem) is None
    except Exception:
        return False


def main_heads_dims(spec: ProviderSpec, m: int, n: int) -> tuple[int, int] | None:
    """The (H, D) the single-shape cases use: the first the spec accepts."""
    grid = [(h, d) for h in HEADS for d in HEAD_DIMS]
    for h, d in (*PREFERRED_HD, *grid):
        if accepts(spec, Problem(m, n, h, d)):
            return h, d
    return None


def edge_windows(m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows cycling through every corner: empty (ks == ke, ks > ke, all-negative, beyond N), ks < 0,
    ke > N, a single key, the last key, and spans starting and ending off tile boundaries."""
    pattern = [
        (0, n), (-7, 5), (n - 3, n + 9), (5, 5), (9, 2), (1, n - 1), (-100, -50), (n + 2, n + 10),
        (n - 1, n), (0, 1), (-1, n + 1), (n // 3, n // 3 + 1),
    ]
    ks, ke = [], []
    for i in range(m):
        if i < len(pattern):
            a, b = pattern[i]
        else:  # off-tile spans that drift across the key range
            a = (i * 17 + 3) % max(n, 1)
            b = a + 1 + (i * 29) % max(n - a + 5, 1)
        ks.append(a)
        ke.append(b)
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)


def make_windows(kind: str, m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ks, ke) int32 [M] on the CPU for one of :data:`WINDOW_KINDS`."""
    if kind == "edges":
        return edge_windows(m, n)
    if kind == "empty":
        g = torch.Generator().manual_seed(seed)
        ks = torch.randint(-5, n + 5, (m,), generator=g, dtype=torch.int32)
        return ks, ks - torch.randint(0, 3, (m,), generator=g, dtype=torch.int32)
    return data_windows(kind, m, n, torch.Generator().manual_seed(seed))


def short_context_lens(lens: torch.Tensor, next_n: int, max_context_len: int) -> torch.Tensor:
    """Overwrite the first sequences' lengths with the short and block-edge ones kernels get wrong:
    1 (with next_n = 2 the first row sees nothing), one block exactly, one block plus one."""
    lens = lens.clone()
    for b, value in enumerate((1, PAGED_BLOCK_SIZE, PAGED_BLOCK_SIZE + 1)):
        if b < lens.shape[0]:
            lens[b] = min(value, max_context_len)
    return lens
