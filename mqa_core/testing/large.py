"""Large-index cases: offsets past 2**31 elements or bytes, where int32 index arithmetic overflows.

Three shapes, each with windows at and around the crossing:

- ``keys``: N * D past 2**bits (the key matrix's byte offset n * D), a few rows;
- ``rows``: M * N past 2**bits (the output's offset m * row_stride), short diagonal windows;
- ``paged``: B * next_n * max_context_len past 2**bits, one sequence seeing the whole context so its
  blocks also lie past 2**bits bytes into the page pool (block_id * block_bytes).

On GPUs bits = 31; on the CPU the same builders run with fewer bits, which proves the cases and the
sampled check themselves. Outputs this large are never formed in float64: the check computes the
exact value and the bound at chosen cells (every row's first and last key, all cells of the rows
and keys around each crossing, a random sample) and checks the -inf mask on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .bound import at_cells
from .cases import LargeSizes
from .checks import Windows
from .data import Inputs, PagedInputs

KINDS = ("keys", "rows")


def _random_fp8(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, device: torch.device,
                positive: bool = False, chunk_rows: int = 1 << 20) -> torch.Tensor:
    """Random fp8 made on the device in row chunks (a 2**31-byte tensor never exists in float32)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    for r0 in range(0, shape[0], chunk_rows):
        r1 = min(shape[0], r0 + chunk_rows)
        x = torch.randn((r1 - r0, *shape[1:]), generator=g, device=device) * 1.5
        out[r0:r1] = (x.abs() + 0.05 if positive else x).to(dtype)
    return out


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(frozen=True)
class Sampled:
    """A large case: its inputs, the cells whose values are checked, and every row's window."""

    inputs: Inputs | PagedInputs
    rows: torch.Tensor
    cols: torch.Tensor
    windows: Windows
    what: str


def _cells_of_windows(lo: torch.Tensor, hi: torch.Tensor, rows: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((int(hi[r] - lo[r]),), r), torch.arange(int(lo[r]), int(hi[r]))) for r in rows if hi[r] > lo[r]]


def _dedup(parts: list[tuple[torch.Tensor, torch.Tensor]], n: int, device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.cat([p[0].long() for p in parts])
    cols = torch.cat([p[1].long() for p in parts])
    key = torch.unique(rows * n + cols)
    return (key // n).to(device), (key % n).to(device)


def _edges(lo: torch.Tensor, hi: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every non-empty row's first and last key."""
    rows = (hi > lo).nonzero().reshape(-1)
    return [(rows, lo[rows]), (rows, hi[rows] - 1)]


def prefill_case(kind: str, sizes: LargeSizes, h: int, d: int, dtypes: tuple[torch.dtype, torch.dtype],
                 device: torch.device, seed: int, m_keys: int = 8) -> Sampled:
    """The ``keys`` or ``rows`` prefill case (see the module doc)."""
    g = _generator(device, seed)
    cpu = torch.Generator().manual_seed(seed)
    if kind == "keys":
        n = sizes.keys_past(d)
        m = m_keys
        c = -(-(2 ** sizes.bits) // d)  # the first key whose byte offset n * D is past 2**bits
        spans = [(0, 257), (n - 300, n), (c - 150, c + 150), (0, n), (n - 1, n), (c, c + 1), (c - 1, c), (n, n + 5)]
        ks = torch.tensor([s[0] for s in spans][:m], dtype=torch.int32)
        ke = torch.tensor([s[1] for s in spans][:m], dtype=torch.int32)
        full = 3
        what = f"N*D={n * d} past 2^{sizes.bits} (keys at the crossing n={c})"
    elif kind == "rows":
        m, n = sizes.rows_cols_past()
        rows = torch.arange(m)
        ks = rows * (n - 65) // m
        ke = ks + 1 + (rows * 7) % 64
        ks[-4:], ke[-4:] = n - 70, n
        ks[-1], ke[-1] = 0, n
        ks, ke = ks.to(torch.int32), ke.to(torch.int32)
        full = m - 1
        c = -(-(2 ** sizes.bits) // n)  # the first row whose offset m * N is past 2**bits
        what = f"M*N={m * n} past 2^{sizes.bits} (rows from {c} on)"
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    q = _random_fp8((m, h, d), dtypes[0], g, device)
    k = _random_fp8((n, d), dtypes[1], g, device)
    k_scale = torch.rand(n, generator=g, device=device) * 0.9 + 0.1
    weights = torch.randn(m, h, generator=g, device=device) * h ** -0.5
    x = Inputs(q, k, k_scale, weights, ks.to(device), ke.to(device))
    wins = Windows.prefill(ks, ke, n)
    lo, hi = wins.lo, wins.hi
    parts = _edges(lo, hi)
    if kind == "keys":
        parts += _cells_of_windows(lo, hi, [r for r in range(m) if r != full])
        span, spread = (512, 4096) if sizes.bits > 24 else (128, 512)
        around = torch.cat([torch.arange(0, span), torch.arange(n - span, n), torch.arange(c - span, c + span),
                            torch.randint(0, n, (spread,), generator=cpu)]).clamp(0, n - 1)
        parts.append((torch.full_like(around, full), around))
    else:
        crossing = list(range(max(0, c - 3), m))
        sample = torch.randint(0, m, (256 if sizes.bits > 24 else 32,), generator=cpu).tolist()
        parts += _cells_of_windows(lo, hi, crossing + sample)
    rows_t, cols_t = _dedup(parts, n, device)
    return Sampled(x, rows_t, cols_t, wins, what)


def paged_case(sizes: LargeSizes, h: int, d: int, dtype: torch.dtype, device: torch.device, seed: int,
               block_size: int) -> Sampled:
    """The ``paged`` case: short sequences, then one that sees the whole context, its blocks
    scattered over a pool past 2**bits bytes whose unused blocks hold NaN keys and scales."""
    g = _generator(device, seed)
    cpu = torch.Generator().manual_seed(seed)
    batch, next_n, ctx = sizes.paged()
    max_blocks = -(-ctx // block_size)
    short = torch.randint(1, 3 * block_size, (batch - 1,), generator=cpu)
    short_blocks = int((-(-short // block_size)).sum())
    block_bytes = block_size * (d + 4)
    past = -(-(2 ** sizes.bits) // block_bytes)  # the first block whose byte offset is past 2**bits
    num_blocks = max(max_blocks + short_blocks, past + 1) + 7
    pool = torch.full((num_blocks, block_bytes), 0xFF, dtype=torch.uint8, device=device)
    ids = torch.randperm(num_blocks, generator=g, device=device)
    tables = torch.full((batch, max_blocks), num_blocks - 1, dtype=torch.int32, device=device)
    tables[-1] = ids[:max_blocks].to(torch.int32)
    used = [ids[:max_blocks]]
    start = max_blocks
    for b, length in enumerate(short.tolist()):
        nb = -(-length // block_size)
        tables[b, :nb] = ids[start:start + nb].to(torch.int32)
        used.append(ids[start:start + nb])
        start += nb
    blocks = torch.cat(used)
    for i in range(0, blocks.numel(), 1 << 14):  # fill the used blocks with keys and scales
        sel = blocks[i:i + (1 << 14)]
        keys = _random_fp8((sel.numel(), block_size * d), dtype, g, device)
        scales = torch.rand(sel.numel(), block_size, generator=g, device=device) * 0.9 + 0.1
        pool[sel] = torch.cat([keys.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    lens = torch.cat([short, torch.tensor([ctx])]).to(torch.int32)
    q = _random_fp8((batch, next_n, h, d), dtype, g, device)
    weights = torch.randn(batch * next_n, h, generator=g, device=device) * h ** -0.5
    x = PagedInputs(q, pool.view(num_blocks, block_size, 1, d + 4), weights, lens.to(device), tables, ctx)
    covered = min(ctx, max_blocks * block_size)
    wins = Windows.prefix(x.visible().clamp(max=covered), ctx)
    lo, hi = wins.lo, wins.hi
    long_rows = list(range((batch - 1) * next_n, batch * next_n))
    parts = _edges(lo, hi) + _cells_of_windows(lo, hi, list(range((batch - 1) * next_n)))
    span, spread = (512, 8192) if sizes.bits > 24 else (128, 512)
    around = torch.cat([torch.arange(0, span), torch.arange(ctx - span, ctx),
                        torch.randint(0, ctx, (spread,), generator=cpu)])
    for r in long_rows:
        keep = around[around < hi[r]]
        parts.append((torch.full_like(keep, r), keep))
    rows_t, cols_t = _dedup(parts, ctx, device)
    return Sampled(x, rows_t, cols_t, wins,
                   f"B*next_n*max_context_len={batch * next_n * ctx} past 2^{sizes.bits}, "
                   f"pool {num_blocks * block_bytes} bytes (blocks from {past} on lie past 2^{sizes.bits})")


def paged_keys_at(x: PagedInputs, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [S, D] fp8, scales [S] float32) that cells (rows[i], cols[i]) read through the tables."""
    nb, bs, _, d4 = x.kv_cache.shape
    d = d4 - 4
    flat = x.kv_cache.reshape(nb, bs * d4)
    values = flat[:, : bs * d].reshape(nb, bs, d)
    scales = flat[:, bs * d:].view(torch.float32)
    next_n = x.q.shape[1]
    blk = x.block_tables[rows // next_n, cols // bs].long()
    off = cols % bs
    return values[blk, off].view(x.q.dtype), scales[blk, off]


def exact_at(case: Sampled) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact value, T) float64 at the case's cells."""
    x = case.inputs
    if isinstance(x, Inputs):
        return at_cells(x.q, x.k, x.k_scale, x.weights, case.rows, case.cols)
    keys, scales = paged_keys_at(x, case.rows, case.cols)
    b, next_n, h, d = x.q.shape
    idx = torch.arange(case.rows.numel(), device=case.rows.device)
    return at_cells(x.q.reshape(b * next_n, h, d), keys, scales, x.weights, case.rows, idx)
