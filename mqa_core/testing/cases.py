"""The kit's case tables: sizes per device, window patterns, the H/D grid, paged layouts.

Sizes are deliberately off every tile boundary a kernel is likely to use (16, 32, 64, 128, 256), tiny
on the CPU (a reference kernel must finish the whole kit in seconds) and larger on GPUs, where the
tiles are real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import FP4_PAIR, Problem, ProviderSpec, parse_dtypes
from .data import windows as data_windows

#: (q dtype name, k dtype name), as torch spells them without the prefix.
Pair = tuple[str, str]

#: Heads and head dims probed; each pair a spec's shape limits accept is computed and checked, each
#: pair it rejects must be rejected by selection.
HEADS = (1, 8, 16, 32, 64, 128)
HEAD_DIMS = (32, 64, 128, 256)
#: Pairs outside the usual grid: computed if the spec claims them, else rejected by selection.
PROBES = ((3, 48), (256, 128), (64, 512))
#: Where the single-shape cases run, first accepted wins: the sizes the indexers use.
PREFERRED_HD = ((32, 128), (64, 128), (16, 128), (128, 128), (8, 128), (64, 64), (32, 64))

#: Prefill window patterns: data.WINDOWS plus "edges" (every corner case in every row), "short"
#: (one to three keys: each row's first and last key are most of its cells) and "empty".
WINDOW_KINDS = ("causal", "full", "chunk", "ragged", "edges", "short", "empty")


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

#: (batch, next_n, lens 2-D, clean_logits) for the paged op. 2-D lengths are arbitrary per row (not
#: the 1-D rule lens[b] - next_n + j + 1): zero, the whole context, block edges, decreasing in j.
PAGED_CASES = ((1, 1, False, True), (4, 1, False, True), (2, 2, False, True), (3, 2, True, True),
               (4, 2, True, False), (3, 1, False, False), (5, 3, True, True), (2, 1, True, True))
PAGED_BLOCK_SIZE = 64


@dataclass(frozen=True)
class LargeSizes:
    """The large-index cases: sizes past 2**bits elements or bytes (31 on GPUs: where int32 offsets
    overflow; fewer on the CPU, same structure and windows, to prove the cases themselves)."""

    bits: int

    def keys_past(self, d: int) -> int:
        """N with N * D past 2**bits: keys after the crossing as well as before."""
        return -(-(2 ** self.bits) // d) + 1531

    def rows_cols_past(self) -> tuple[int, int]:
        """(M, N) with M * N past 2**bits and N off every tile."""
        n = 2 ** (self.bits // 2) + 11
        return -(-(2 ** self.bits) // n) + 29, n

    def paged(self) -> tuple[int, int, int]:
        """(batch, next_n, max_context_len) with B * next_n * max_context_len past 2**bits; the last
        sequence sees the whole context, so its blocks also lie past 2**bits bytes into the pool."""
        batch = 64 if self.bits > 24 else 8
        return batch, 2, -(-(2 ** self.bits) // (batch * 2)) + 1531


LARGE = {"cpu": LargeSizes(bits=18), "gpu": LargeSizes(bits=31)}


def large_sizes(device: torch.device) -> LargeSizes:
    return LARGE["cpu" if device.type == "cpu" else "gpu"]


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


def short_windows(m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One to three keys per row, anywhere including the first and last keys: boundaries everywhere."""
    g = torch.Generator().manual_seed(seed)
    ks = torch.randint(0, max(n, 1), (m,), generator=g)
    ks[: min(m, 2)] = torch.tensor([0, max(n - 1, 0)])[: min(m, 2)]
    ke = torch.clamp(ks + torch.randint(1, 4, (m,), generator=g), max=max(n, 1))
    return ks.to(torch.int32), ke.to(torch.int32)


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
    if kind == "short":
        return short_windows(m, n, seed)
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


def arbitrary_lens(batch: int, next_n: int, max_context_len: int, seed: int) -> torch.Tensor:
    """[B, next_n] int32 lengths with nothing in common with the 1-D rule: each row its own, in
    [0, max_context_len]; the first rows pinned to 0, the whole context, a block, a block plus one,
    and one longer row before a shorter one in the same sequence."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_context_len + 1, (batch, next_n), generator=g)
    pinned = [0, max_context_len, PAGED_BLOCK_SIZE, PAGED_BLOCK_SIZE + 1, 1]
    flat = lens.view(-1)
    for i, v in enumerate(pinned[: flat.numel()]):
        flat[i] = min(v, max_context_len)
    if next_n > 1 and batch > 1:
        lens[-1] = torch.arange(next_n, 0, -1) * max(1, max_context_len // (next_n + 1))
    return lens.to(torch.int32)


def declared_pairs(spec: ProviderSpec, arch: str) -> list[Pair]:
    """Every fp8 (q, k) dtype pair the spec accepts on ``arch`` (``spec.pairs_for``); on an arch it does
    not serve, its ``dtypes`` as same-flavour pairs, so the kit still lists the cases that say why.
    The FP4 pair is not among them: the kit's inputs are fp8 (FP4's arithmetic has its own oracle
    tests, tests/test_fp4.py)."""
    fp8 = {p for p in spec.pairs_for(arch) if p != FP4_PAIR}
    return sorted(fp8 or {(d, d) for d in spec.dtypes})


def parse_pair(text: str) -> Pair:
    """``--mqa-dtype``: ``Q`` (q and k alike) or ``Q,K`` (``spec.parse_dtypes``) as a (q, k) pair."""
    names = parse_dtypes(text)
    return (names[0], names[-1])


def pair_id(pair: Pair) -> str:
    q, k = (p.removeprefix("float8_") for p in pair)
    return q if q == k else f"{q}.{k}"
