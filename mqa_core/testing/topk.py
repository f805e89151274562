"""The kit's top-k cases (kit v3): inputs, the oracle's selection, the checks, and the claims.

The three top-k ops (``fp8_mqa_topk``, ``fp8_paged_mqa_topk``, ``topk_per_row``) are judged two ways:

- **Accepted selection** on random fp8 inputs, whose logits a kernel computes only to within the
  per-cell bound of :mod:`.bound`: a row's selection is accepted when every selected key's exact logit
  plus its bound is at least every unselected in-window key's exact logit minus its bound (a kernel
  whose computed logits are within the bounds can only have chosen so). Positions must ascend, hold
  no duplicate, lie inside the window, and ``-1`` must fill exactly the slots past the window's size;
  values (``return_values=True``) within their cell's bound, ``-inf`` in the padding.
- **Exact inputs**: small integer fp8 q and k, power-of-two key scales and weights, so every logit is
  exact in float32 whatever the summation order (and in a Hopper fp8 MMA's 14-bit accumulator); keys
  repeat with a period that is no tile size, so equal logits straddle every 64/128/2048 border and
  every chunk border. The selection must then *equal* the oracle's, tie rule included, and the values
  the exact logits. ``topk_per_row`` takes its logits given, so it is always judged this way.

The oracle (:func:`oracle_select`) is a plain per-row stable sort, written apart from every provider.
Like :mod:`.runner`, this module needs no pytest: a failure is an ``AssertionError`` naming the case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..provider import Provider
from ..spec import Problem, ProviderSpec
from .bound import Accumulation
from .cases import accepts, main_heads_dims, make_windows
from .checks import Case, Untouched, Windows
from .data import Inputs, PagedInputs, paged_cache
from .poison import nan_fill
from .runner import Draw, expected, expected_paged, paged_inputs, paged_named, prefill_inputs, prefill_named

TOPK, PAGED_TOPK, PER_ROW = "fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row"
TOPK_OPS = (TOPK, PAGED_TOPK, PER_ROW)
#: (H, D) the top-k cases prefer, first accepted wins: small, so Triton's interpreter keeps up.
TOPK_HD = ((16, 64), (32, 128), (16, 128), (64, 128), (32, 64))
#: The period of the repeated keys in exact inputs: no tile size and no divisor of one.
TIE_PERIOD = 40
#: Kinds of given logits for ``topk_per_row``.
LOGITS_KINDS = ("random", "ties", "close", "infnan", "bf16", "strided")


@dataclass(frozen=True)
class TopkSizes:
    """Sizes of the top-k cases on one device type."""

    #: (M, N) and topk of the window cases: windows shorter and longer than topk.
    windows: tuple[int, int]
    topk: int
    #: topk values of the size cases, each over N = topk + ``past`` keys, ``rows`` rows.
    topks: tuple[int, ...]
    past: int
    rows: int
    #: (M, N) of the claims' cases (batch invariance wants a real batch).
    claims: tuple[int, int]
    #: Decode: the context and the topk of the paged cases.
    paged_context: int
    paged_topk: int
    #: (M, N) of the long cases at topk 2048 (the GPU's are the engines' sizes).
    long: tuple[tuple[int, int], ...]


TOPK_SIZES = {
    "cpu": TopkSizes(windows=(29, 211), topk=37, topks=(1, 512, 2048, 4096), past=37, rows=4,
                     claims=(29, 211), paged_context=300, paged_topk=64, long=((3, 2**13 + 71),)),
    "gpu": TopkSizes(windows=(271, 3001), topk=512, topks=(1, 512, 2048, 4096), past=1331, rows=67,
                     claims=(271, 5003), paged_context=4100, paged_topk=2048,
                     long=((64, 65536 + 13), (8, 2**20 + 7))),
}


def topk_sizes(device: torch.device) -> TopkSizes:
    return TOPK_SIZES["cpu" if device.type == "cpu" else "gpu"]


def topk_heads_dims(spec: ProviderSpec, m: int, n: int) -> tuple[int, int] | None:
    """The (H, D) of the top-k cases: the first of :data:`TOPK_HD` the spec accepts, else the kit's usual."""
    for h, d in TOPK_HD:
        if accepts(spec, Problem(m, n, h, d)):
            return h, d
    return main_heads_dims(spec, m, n)


# -- inputs ----------------------------------------------------------------------------------------

def _pow2(shape: tuple[int, ...], g: torch.Generator, lo: int = -2, hi: int = 1, signed: bool = False) -> torch.Tensor:
    out = torch.exp2(torch.randint(lo, hi + 1, shape, generator=g).double())
    if signed:
        out = out * (torch.randint(0, 2, shape, generator=g).double() * 2 - 1)
    return out.float()


def _ints(shape: tuple[int, ...], g: torch.Generator, spread: int) -> torch.Tensor:
    return torch.randint(-spread, spread + 1, shape, generator=g).float()


def exact_prefill(draw: Draw, problem: Problem, *, window: str = "edges", ties: bool = True) -> Inputs:
    """Prefill inputs whose logits are exact in float32: integer q and k, power-of-two scales and
    weights. ``ties``: |x| <= 3, signed weights, the keys (and scales) repeating every
    :data:`TIE_PERIOD` positions; otherwise q and k in 1..8 and positive weights, every key its own, so
    the logits are large and close (dozens to a bf16 value): a selection on rounded logits shows."""
    g = torch.Generator().manual_seed(draw.seed)
    m, n, h, d = problem.m, problem.n, problem.h, problem.d
    q_dtype, k_dtype = draw.dtypes
    if ties:
        q = _ints((m, h, d), g, 3)
        base, scales = _ints((TIE_PERIOD, d), g, 3), _pow2((TIE_PERIOD,), g)
        pick = torch.arange(n) % TIE_PERIOD
        k, k_scale = base[pick], scales[pick]
        weights = _pow2((m, h), g, signed=True)
    else:  # positive, so nothing cancels: logits in the tens of thousands, a few apart
        q = torch.randint(1, 9, (m, h, d), generator=g).float()
        k, k_scale = torch.randint(1, 9, (n, d), generator=g).float(), _pow2((n,), g, -1, 0)
        weights = _pow2((m, h), g)
    ks, ke = make_windows(window, m, n, draw.seed)
    dev = draw.device
    return Inputs(q.to(q_dtype).to(dev), k.to(k_dtype).to(dev), k_scale.to(dev), weights.to(dev),
                  ks.to(dev), ke.to(dev))


def random_prefill(draw: Draw, problem: Problem, *, window: str) -> Inputs:
    """The kit's usual random fp8 inputs (:func:`.runner.prefill_inputs`)."""
    return prefill_inputs(draw, problem, window=window)


def decode_inputs(draw: Draw, batch: int, next_n: int, h: int, d: int, context: int, *, lens_2d: bool,
                  exact: bool) -> PagedInputs:
    """Decode inputs (the kit's lengths: short and block-edge 1-D ones, arbitrary 2-D ones); ``exact``:
    integer q and keys, power-of-two scales and weights, each sequence's keys repeating every
    :data:`TIE_PERIOD` positions (ties across every block and tile border)."""
    x = paged_inputs(draw, batch, next_n, h, d, context, lens_2d=lens_2d)
    if not exact:
        return x
    g = torch.Generator().manual_seed(draw.seed + 1)
    blocks, bs = x.kv_cache.shape[0], x.kv_cache.shape[1]
    dtype = draw.dtypes[0]
    values, scales = _ints((blocks, bs, d), g, 3), _pow2((blocks, bs), g)
    base, base_scales = _ints((TIE_PERIOD, d), g, 3), _pow2((TIE_PERIOD,), g)
    tables = x.block_tables.cpu().long()
    pos = torch.arange(tables.shape[1] * bs)
    for b in range(batch):
        pick = (pos + 7 * b) % TIE_PERIOD
        blk, off = tables[b, pos // bs], pos % bs
        values[blk, off] = base[pick]
        scales[blk, off] = base_scales[pick]
    cache = paged_cache(values.to(dtype), scales, device=draw.device)
    q = _ints(tuple(x.q.shape), g, 3).to(dtype).to(draw.device)
    weights = _pow2(tuple(x.weights.shape), g, signed=True).to(draw.device)
    return replace(x, q=q, kv_cache=cache, weights=weights)


def given_logits(kind: str, m: int, n: int, seed: int, device: torch.device) -> torch.Tensor:
    """Logits for ``topk_per_row``: ``random`` float32; ``ties`` small integers (ties everywhere);
    ``close`` 1024 plus multiples of 1/8 (distinct in float32, dozens to a bf16 value: a selection on
    rounded logits shows);
    ``infnan`` rows of -inf, of NaN, of -inf and NaN mixed with a few values, -0.0 beside 0.0, +inf;
    ``bf16`` bfloat16 (rounding makes ties); ``strided`` float32 rows wider than N (row stride N + 19,
    the gap NaN)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        out = _ints((m, n), g, 3)
    elif kind == "close":
        out = 1024 + torch.randint(0, 512, (m, n), generator=g).float() / 8
    elif kind == "infnan":
        out = _ints((m, n), g, 2)
        inf, nan = float("inf"), float("nan")
        cell = torch.rand(m, n, generator=g)
        out = torch.where(cell < 0.2, -inf, out)
        out = torch.where((cell >= 0.2) & (cell < 0.35), nan, out)
        out = torch.where((cell >= 0.35) & (cell < 0.45), -0.0, out)
        for r in range(m):
            kind_r = r % 5
            if kind_r == 0:
                out[r] = -inf
            elif kind_r == 1:
                out[r] = nan
            elif kind_r == 2:
                out[r] = torch.where(torch.arange(n) % 2 == 0, -inf, nan)
            elif kind_r == 3:
                out[r] = torch.where(torch.arange(n) % 2 == 0, -0.0, 0.0)
        if m > 4 and n > 3:
            out[4, n // 2] = inf
    else:
        out = torch.randn(m, n, generator=g)
    if kind == "bf16":
        return out.to(torch.bfloat16).to(device)
    if kind == "strided":
        wide = torch.full((m, n + 19), float("nan"))
        wide[:, :n] = out
        return wide.to(device)[:, :n]
    return out.to(device)


# -- the oracle ------------------------------------------------------------------------------------

def oracle_select(row: torch.Tensor, topk: int) -> torch.Tensor:
    """Positions (ascending, int64) of the ``topk`` largest of ``row`` (a window's logits, float64 on
    the CPU): by value, ``-0.0 == 0.0``, ``-inf`` an ordinary value, NaN below everything, ties to the
    smaller position. Two stable sorts: by value (NaN as -inf), then NaN last."""
    nan = row.isnan()
    order = torch.sort(row.masked_fill(nan, float("-inf")), descending=True, stable=True).indices
    order = order[torch.sort(nan[order].to(torch.int8), stable=True).indices]
    return order[:topk].sort().values


# -- the checks ------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:.9g}"


def check_topk(idx: Any, values: Any, want: torch.Tensor, bound: torch.Tensor | None, wins: Windows, topk: int,
               positions: str, case: Case) -> None:
    """The contract on one top-k result (see the module docstring). ``want``: exact logits (float64,
    CPU; for given logits, their values); ``bound``: each cell's bound, or None for exact inputs (the
    selection must then equal the oracle's and the values the exact logits)."""
    rows = want.shape[0]
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int32 and tuple(idx.shape) == (rows, topk), \
        f"{case}: indices must be int32 [{rows}, {topk}]; got {getattr(idx, 'dtype', type(idx))} " \
        f"{list(getattr(idx, 'shape', []))}"
    got = idx.long().cpu()
    vals = None if values is None else values.double().cpu()
    for r in range(rows):
        lo, hi = int(wins.lo[r]), int(wins.hi[r])
        width = max(hi - lo, 0)
        k = min(topk, width)
        where = f"row {r} sees keys [{lo}, {hi}) ({width} keys), topk {topk}"
        row = got[r]
        tail = (row[k:] != -1).nonzero()
        assert tail.numel() == 0, (f"{case}: {where}: slots {k}.. must be -1 (the window holds {width} keys); "
                                   f"slot {k + int(tail[0])} holds {int(row[k + int(tail[0])])}")
        head = row[:k]
        top = width if positions == "relative" else hi
        base = 0 if positions == "relative" else lo
        outside = ((head < base) | (head >= top)).nonzero()
        if outside.numel():
            slot = int(outside[0])
            early = " (-1 before the window is used up)" if int(head[slot]) == -1 else ""
            raise AssertionError(f"{case}: {where}: slot {slot} holds position {int(head[slot])}, outside "
                                 f"[{base}, {top}) ({positions} positions){early}")
        if k > 1:
            down = (head[1:] <= head[:-1]).nonzero()
            assert down.numel() == 0, (f"{case}: {where}: positions must strictly ascend (no duplicates); slot "
                                       f"{int(down[0]) + 1} holds {int(head[int(down[0]) + 1])} after "
                                       f"{int(head[int(down[0])])}")
        cols = head + (lo if positions == "relative" else 0)
        exact_row = want[r]
        if bound is None:
            expect = oracle_select(exact_row[lo:hi], k) + lo
            if not torch.equal(cols, expect):
                extra = sorted(set(cols.tolist()) - set(expect.tolist()))
                missing = sorted(set(expect.tolist()) - set(cols.tolist()))
                a, b = extra[0], missing[0]
                va, vb = float(exact_row[a]), float(exact_row[b])
                tie = " (a tie: ties go to the smaller position)" if va == vb or (va != va and vb != vb) else ""
                raise AssertionError(
                    f"{case}: {where}: {len(extra)} selected key(s) differ from the oracle's on exact inputs; "
                    f"selects key {a} (logit {_fmt(va)}) but not key {b} (logit {_fmt(vb)}){tie}")
        elif k and k < width:
            inside = torch.zeros(width, dtype=torch.bool)
            inside[cols - lo] = True
            seg, b_seg = exact_row[lo:hi], bound[r, lo:hi]
            low = torch.where(inside, seg + b_seg, torch.inf)
            high = torch.where(inside, -torch.inf, seg - b_seg)
            s, u = int(low.argmin()), int(high.argmax())
            assert float(low[s]) >= float(high[u]), (
                f"{case}: {where}: selects key {lo + s} (exact logit {_fmt(float(seg[s]))}, bound "
                f"{float(b_seg[s]):.3g}) but not key {lo + u} (exact logit {_fmt(float(seg[u]))}, bound "
                f"{float(b_seg[u]):.3g}): no logits within the cells' bounds rank them so")
        if vals is None:
            continue
        v = vals[r]
        pad = (v[k:] != -torch.inf).nonzero()
        assert pad.numel() == 0, f"{case}: {where}: values slot {k + int(pad[0])} must be -inf (padding); got " \
                                 f"{float(v[k + int(pad[0])])}"
        exact_v = exact_row[cols]
        if bound is None:
            same = (v[:k] == exact_v) | (v[:k].isnan() & exact_v.isnan())
            bad = (~same).nonzero()
            assert bad.numel() == 0, (f"{case}: {where}: values slot {int(bad[0])} (key {int(cols[int(bad[0])])}) "
                                      f"is {float(v[int(bad[0])])}, the logit is {_fmt(float(exact_v[int(bad[0])]))}")
        else:
            err = (v[:k] - exact_v).abs()
            over = (~(err <= bound[r, cols])).nonzero()
            assert over.numel() == 0, (
                f"{case}: {where}: values slot {int(over[0])} (key {int(cols[int(over[0])])}) is "
                f"{float(v[int(over[0])])}, the exact logit {_fmt(float(exact_v[int(over[0])]))}, beyond its "
                f"bound {float(bound[r, cols[int(over[0])]]):.3g}")


def _split(out: Any, return_values: bool, case: Case) -> tuple[torch.Tensor, torch.Tensor | None]:
    if return_values:
        assert isinstance(out, tuple) and len(out) == 2, f"{case}: return_values=True must return (indices, values)"
        return out[0], out[1]
    assert isinstance(out, torch.Tensor), f"{case}: return_values=False must return the indices tensor"
    return out, None


# -- calls -----------------------------------------------------------------------------------------

def call_topk(provider: Provider, op: str, args: tuple[Any, ...], topk: int, *, positions: str = "relative",
              return_values: bool = False, workspace_bytes: int | None = None) -> Any:
    """One top-k call on the provider as an engine gets it (its arguments and result checked by the core)."""
    fn = getattr(provider, op)
    if op == PAGED_TOPK:
        return fn(*args, topk, return_values=return_values, workspace_bytes=workspace_bytes)
    return fn(*args, topk, positions=positions, return_values=return_values, workspace_bytes=workspace_bytes)


def poisoned_topk(call: Callable[[], Any], named: dict[str, torch.Tensor], case: Case, device: torch.device,
                  return_values: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``call()`` with every new tensor starting as poison (NaN; integers their maximum), inputs checked
    untouched after it."""
    untouched = Untouched(named)
    with nan_fill():
        out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    untouched.check(case)
    return _split(out, return_values, case)


def bounds(t: torch.Tensor, accumulation: Accumulation, h: int, d: int) -> torch.Tensor:
    return accumulation.factor(h, d) * t


def run_prefill_topk(provider: Provider, draw: Draw, x: Inputs, topk: int, *, positions: str, return_values: bool,
                     exact: bool, what: str, workspace_bytes: int | None = None) -> torch.Tensor:
    """One poisoned ``fp8_mqa_topk`` call on ``x``, checked; returns the indices."""
    m, h, d = x.q.shape
    n = x.k.shape[0]
    case = draw.case(provider.name, TOPK, f"{what} topk={topk} positions={positions} return_values={return_values}"
                     + (f" workspace_bytes={workspace_bytes}" if workspace_bytes else ""), Problem(m, n, h, d))
    idx, vals = poisoned_topk(lambda: call_topk(provider, TOPK, x.args(), topk, positions=positions,
                                                return_values=return_values, workspace_bytes=workspace_bytes),
                              prefill_named(x), case, draw.device, return_values)
    want, t = expected(x)
    check_topk(idx, vals, want.cpu(), None if exact else bounds(t, draw.accumulation, h, d).cpu(),
               Windows.prefill(x.ks, x.ke, n), topk, positions, case)
    return idx


def run_paged_topk(provider: Provider, draw: Draw, x: PagedInputs, topk: int, *, return_values: bool, exact: bool,
                   what: str, workspace_bytes: int | None = None) -> torch.Tensor:
    """One poisoned ``fp8_paged_mqa_topk`` call on ``x``, checked; returns the indices."""
    b, next_n, h, d = x.q.shape
    case = draw.case(provider.name, PAGED_TOPK,
                     f"{what} context_lens={'[B, next_n]' if x.context_lens.dim() == 2 else '[B]'}="
                     f"{x.context_lens.tolist()} topk={topk} return_values={return_values}",
                     Problem(b * next_n, x.max_context_len, h, d))
    idx, vals = poisoned_topk(lambda: call_topk(provider, PAGED_TOPK, x.args(), topk, return_values=return_values,
                                                workspace_bytes=workspace_bytes),
                              paged_named(x), case, draw.device, return_values)
    want, t, wins = expected_paged(x)
    check_topk(idx, vals, want.cpu(), None if exact else bounds(t, draw.accumulation, h, d).cpu(), wins, topk,
               "relative", case)
    return idx


def run_topk_per_row(provider: Provider, draw: Draw, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor,
                     topk: int, *, positions: str, return_values: bool, what: str) -> torch.Tensor:
    """One poisoned ``topk_per_row`` call, checked exactly against the oracle over the given logits."""
    m, n = logits.shape
    case = draw.case(provider.name, PER_ROW, f"{what} logits={str(logits.dtype).removeprefix('torch.')} strides="
                     f"{tuple(logits.stride())} topk={topk} positions={positions} return_values={return_values}",
                     Problem(m, n, 1, 1))
    idx, vals = poisoned_topk(lambda: call_topk(provider, PER_ROW, (logits, ks, ke), topk, positions=positions,
                                                return_values=return_values),
                              {"logits": logits, "cu_seqlen_ks": ks, "cu_seqlen_ke": ke}, case, draw.device,
                              return_values)
    check_topk(idx, vals, logits.double().cpu(), None, Windows.prefill(ks, ke, n), topk, positions, case)
    return idx


# -- claims ----------------------------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32).cpu() if t.element_size() == 4 else t.contiguous().view(torch.int16).cpu()


def check_same(first: tuple[torch.Tensor, torch.Tensor | None], second: tuple[torch.Tensor, torch.Tensor | None],
               case: Case, what: str, rows: Any = slice(None)) -> None:
    """Indices equal and values bitwise equal (``rows`` of ``first`` against all of ``second``)."""
    a, b = first[0].cpu()[rows], second[0].cpu()
    if not torch.equal(a, b):
        r, c = (a != b).nonzero()[0].tolist()
        raise AssertionError(f"{case}: {what}: indices differ; first at row {r} slot {c}: {int(a[r, c])} vs "
                             f"{int(b[r, c])}")
    fv, sv = first[1], second[1]
    if fv is not None and sv is not None:
        va, vb = fv.cpu()[rows], sv.cpu()
        if not torch.equal(_bits(va), _bits(vb)):
            r, c = (_bits(va) != _bits(vb)).nonzero()[0].tolist()
            fa, fb = va[r, c].item(), vb[r, c].item()
            raise AssertionError(f"{case}: {what}: values differ in their bits; first at row {r} slot {c}: "
                                 f"{fa!r} vs {fb!r}")


def appended_keys(x: Inputs, extra: int, seed: int) -> Inputs:
    """``x`` with ``extra`` random keys appended after its N (every window already ends by N)."""
    g = torch.Generator().manual_seed(seed)
    k_more = (torch.randn(extra, x.k.shape[1], generator=g) * 4).to(x.k.dtype).to(x.k.device)
    s_more = (torch.rand(extra, generator=g) + 1).to(x.k_scale.device).reshape(-1, *x.k_scale.shape[1:])
    return replace(x, k=torch.cat([x.k, k_more]), k_scale=torch.cat([x.k_scale, s_more]))


def appended_blocks(x: PagedInputs, blocks: int) -> PagedInputs:
    """``x`` with ``blocks`` more block-table columns (other sequences' blocks) and a longer
    ``max_context_len``: every row's length is unchanged, so it sees the same keys."""
    bs = x.kv_cache.shape[1]
    more = x.block_tables.flip(0)[:, :blocks]
    if more.shape[1] < blocks:
        more = torch.zeros(x.block_tables.shape[0], blocks, dtype=x.block_tables.dtype, device=x.block_tables.device)
    return replace(x, block_tables=torch.cat([x.block_tables, more], dim=1).contiguous(),
                   max_context_len=x.max_context_len + blocks * bs)


def inside_windows(x: Inputs) -> Inputs:
    """``x`` with every window ending by N (so keys appended after N are outside every window)."""
    n = x.k.shape[0]
    return replace(x, ke=x.ke.clamp(max=n), ks=x.ks.clamp(max=n))


def sample_rows(m: int) -> list[int]:
    return sorted({0, m // 2, m - 1} - {-1})
