"""Deliberately wrong providers, each near-correct in one way an author could miss: the kit must fail
every one of them. Installed by the tests as a real distribution (package + dist-info entry point).

Each computes the op exactly in float32, then makes its one mistake.
"""

from __future__ import annotations

WRONG = {
    # name: (attribute in the kernels module, ops, what is wrong)
    "wrong_scale": ("SCALE", ("fp8_mqa_logits",), "ignores k_scale"),
    "wrong_edge": ("EDGE", ("fp8_mqa_logits",), "reads one key past each window's end"),
    "wrong_relu": ("RELU", ("fp8_mqa_logits",), "skips the relu"),
    "wrong_x104": ("X104", ("fp8_mqa_logits", "fp8_paged_mqa_logits"), "every logit x1.04"),
    "wrong_bf16": ("BF16", ("fp8_mqa_logits", "fp8_paged_mqa_logits"), "logits rounded to bf16"),
    "wrong_lens1d": ("LENS1D", ("fp8_mqa_logits", "fp8_paged_mqa_logits"),
                     "applies the 1-D context rule to 2-D context lengths"),
    "wrong_lastkey0": ("LASTKEY0", ("fp8_mqa_logits", "fp8_paged_mqa_logits"),
                       "writes the last key of each window as 0"),
    "wrong_bf16trunc": ("BF16TRUNC", ("fp8_mqa_logits", "fp8_paged_mqa_logits"),
                        "bf16 logits (logits_dtype) truncated toward zero, not rounded to nearest"),
}

KERNELS = '''
import torch


def _masked(out, lo, hi):
    cols = torch.arange(out.shape[1], device=out.device)[None, :]
    inside = (cols >= lo[:, None]) & (cols < hi[:, None])
    return out.masked_fill(~inside, float("-inf"))


def _as(out, logits_dtype, truncate):
    """Logits in the dtype asked for (they name logits_dtype): rounded to nearest, or truncated."""
    if logits_dtype is None or logits_dtype == torch.float32:
        return out
    if truncate:  # drop the low 16 bits of each float32: toward zero (-inf keeps its bits)
        out = (out.contiguous().view(torch.int32) & -65536).view(torch.float32)
    return out.to(logits_dtype)


class Wrong:
    def __init__(self, scale=True, edge=0, relu=True, factor=1.0, bf16=False, lens1d=False, lastkey0=False,
                 truncate=False):
        self.scale, self.edge, self.relu, self.factor = scale, edge, relu, factor
        self.bf16, self.lens1d, self.lastkey0, self.truncate = bf16, lens1d, lastkey0, truncate

    def _finish(self, out, lo, hi):
        out = _masked(out * self.factor, lo, hi)
        if self.bf16:
            out = out.bfloat16().float()
        if self.lastkey0:
            rows = (hi > lo).nonzero().reshape(-1)
            out[rows, hi[rows] - 1] = 0.0
        return out

    def _logits(self, q, k, w, k_scale):
        s = torch.einsum("mhd,nd->mhn", q.float(), k.float())
        if self.relu:
            s = s.clamp_min(0)
        out = torch.einsum("mhn,mh->mn", s, w.float())
        return out * k_scale.reshape(1, -1).float() if self.scale else out

    def fp8_mqa_logits(self, q, kv, w, ks, ke, *, clean_logits=True, logits_dtype=None):
        k, k_scale = kv
        n = k.shape[0]
        out = self._logits(q, k, w, k_scale)
        lo = ks.long().clamp(0, n)
        hi = (ke.long() + self.edge).clamp(0, n)
        return _as(self._finish(out, lo, hi), logits_dtype, self.truncate)

    def fp8_paged_mqa_logits(self, q, kv_cache, w, context_lens, block_tables, max_context_len, *,
                             clean_logits=True, logits_dtype=None):
        b, next_n, h, d = q.shape
        nb, bs = kv_cache.shape[:2]
        flat = kv_cache.reshape(nb, bs * (d + 4))
        values = flat[:, : bs * d].reshape(nb, bs, d).view(q.dtype)
        scales = flat[:, bs * d:].contiguous().view(torch.float32)
        covered = min(max_context_len, block_tables.shape[1] * bs)
        out = torch.zeros(b * next_n, max_context_len, device=q.device)
        pos = torch.arange(covered, device=q.device)
        for bi in range(b):
            blk = block_tables[bi, pos // bs].long()
            rows = slice(bi * next_n, (bi + 1) * next_n)
            out[rows, :covered] = self._logits(q[bi], values[blk, pos % bs], w[rows], scales[blk, pos % bs])
        j = torch.arange(next_n, device=q.device)[None, :]
        if context_lens.dim() == 2 and not self.lens1d:
            visible = context_lens.long()
        else:  # the 1-D rule: row j of sequence b sees lens[b] - next_n + j + 1 (wrong for 2-D lengths)
            last = context_lens.long() if context_lens.dim() == 1 else context_lens.long()[:, -1]
            visible = last[:, None] - next_n + j + 1
        hi = visible.reshape(-1).clamp(0, covered)
        return _as(self._finish(out, torch.zeros_like(hi), hi), logits_dtype, self.truncate)


SCALE, EDGE, RELU = Wrong(scale=False), Wrong(edge=1), Wrong(relu=False)
X104, BF16 = Wrong(factor=1.04), Wrong(bf16=True)
LENS1D, LASTKEY0 = Wrong(lens1d=True), Wrong(lastkey0=True)
BF16TRUNC = Wrong(truncate=True)
'''

SPECS = f'''
from mqa_core import ProviderSpec, hookimpl

WRONG = {WRONG!r}


@hookimpl
def mqa_providers():
    return [ProviderSpec(name=name, ops=set(ops), archs={{"cpu", "sm_90"}}, dtypes={{"float8_e4m3fn"}},
                         priority=-100, load=f"wrong_providers.kernels:{{attr}}", description=what)
            for name, (attr, ops, what) in WRONG.items()]
'''


#: Providers whose every logit is exact, but which break the ops' other promises (issue 37): the kit
#: must fail each (and the core refuses the last two on every call).
UNSAFE = {
    "wrong_reuse": ("REUSE", "hands back one output buffer per shape, written again by every call"),
    "wrong_mutate": ("MUTATE", "clamps cu_seqlen_ks/ke in place; zeroes unused block-table entries"),
    "wrong_view": ("VIEW", "writes its result into an input's memory and returns a view of it"),
    "wrong_subclass": ("SUBCLASS", "returns a torch.Tensor subclass"),
}

UNSAFE_KERNELS = '''
import torch
from mqa_provider_torch_ref.kernels import KERNELS as REF


class Sub(torch.Tensor):
    pass


class Unsafe:
    def __init__(self, kind):
        self.kind, self.buffers = kind, {}

    def _finish(self, out, inputs):
        if self.kind == "reuse":  # a CUDA graph's static output, say
            buf = self.buffers.setdefault(tuple(out.shape), torch.empty_like(out))
            return buf.copy_(out)
        if self.kind == "view":
            big = max(inputs, key=lambda t: t.untyped_storage().nbytes())
            if big.untyped_storage().nbytes() >= out.numel() * 4:
                view = torch.empty(0, dtype=torch.float32, device=out.device)
                view.set_(big.untyped_storage(), 0, out.shape, (out.shape[1], 1))
                return view.copy_(out)
            return out
        if self.kind == "subclass":
            return out.as_subclass(Sub)
        return out

    def fp8_mqa_logits(self, q, kv, w, ks, ke, *, clean_logits=True):
        out = REF.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=clean_logits)
        if self.kind == "mutate":  # the contract clamps the windows anyway: the logits stay exact
            ks.clamp_(min=0)
            ke.clamp_(max=kv[0].shape[0])
        return self._finish(out, (q, kv[0], kv[1], w, ks, ke))

    def fp8_paged_mqa_logits(self, q, kv_cache, w, context_lens, block_tables, max_context_len, *,
                             clean_logits=True):
        out = REF.fp8_paged_mqa_logits(q, kv_cache, w, context_lens, block_tables, max_context_len,
                                       clean_logits=clean_logits)
        if self.kind == "mutate":  # entries past each sequence's context are never read
            lens = context_lens if context_lens.dim() == 1 else context_lens.max(dim=1).values
            bs = kv_cache.shape[1]
            used = torch.arange(block_tables.shape[1], device=q.device)[None, :] * bs < lens[:, None]
            block_tables.masked_fill_(~used, 0)
        return self._finish(out, (q, kv_cache, w, context_lens, block_tables))


REUSE, MUTATE, VIEW, SUBCLASS = Unsafe("reuse"), Unsafe("mutate"), Unsafe("view"), Unsafe("subclass")
'''

UNSAFE_SPECS = f'''
from mqa_core import ProviderSpec, hookimpl

UNSAFE = {UNSAFE!r}


@hookimpl
def mqa_providers():
    return [ProviderSpec(name=name, ops={{"fp8_mqa_logits", "fp8_paged_mqa_logits"}}, archs={{"cpu", "sm_90"}},
                         dtypes={{"float8_e4m3fn"}}, priority=-100, load=f"unsafe_providers.kernels:{{attr}}",
                         description=what)
            for name, (attr, what) in UNSAFE.items()]
'''


#: Top-k providers, each near-correct in one way (issue 34): the kit's top-k cases must fail each. Their
#: logits are the float64 oracle's rounded once to float32 (within every bound); the selection errs.
TOPK_WRONG = {
    # name: (attribute, ops, claims, what is wrong)
    "wrong_ties": ("TIES", ("fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row"), ("deterministic",),
                   "breaks ties to the larger position"),
    "wrong_lastkey": ("LASTKEY", ("fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row"), ("deterministic",),
                      "never selects the last key of a window"),
    "wrong_bf16select": ("BF16SEL", ("fp8_mqa_topk", "fp8_paged_mqa_topk", "topk_per_row"), ("deterministic",),
                         "selects on logits rounded to bf16 (returns the float32 values)"),
    "wrong_batch": ("BATCH", ("fp8_mqa_topk", "fp8_paged_mqa_topk"), ("deterministic", "batch_invariant"),
                    "claims batch_invariant, but with more than 4 rows rounds its logits toward zero"),
}

TOPK_KERNELS = '''
import torch
from mqa_core.reference import fp8_mqa_logits_ref, fp8_paged_mqa_logits_ref, visible_lengths


def _to_f32(x64, truncate):
    """float64 -> float32: to nearest, or toward zero (one ulp at most either way: inside every bound)."""
    f = x64.float()
    if truncate:
        away = f.double().abs() > x64.abs()
        f = torch.where(away & torch.isfinite(f), torch.nextafter(f, torch.zeros_like(f)), f)
    return f


class WrongTopk:
    def __init__(self, ties_high=False, drop_last=False, bf16=False, batch=False):
        self.ties_high, self.drop_last, self.bf16, self.batch = ties_high, drop_last, bf16, batch

    def _select(self, logits, ks, ke, topk, positions, return_values):
        m, n = logits.shape
        out = torch.full((m, topk), -1, dtype=torch.int32, device=logits.device)
        vals = torch.full((m, topk), float("-inf"), dtype=torch.float32, device=logits.device)
        lo_all, hi_all = ks.long().clamp(0, n).tolist(), ke.long().clamp(0, n).tolist()
        for r in range(m):
            lo, hi = lo_all[r], hi_all[r]
            if hi <= lo:
                continue
            seg = logits[r, lo:hi].double().cpu()
            if self.drop_last:
                seg = seg[:-1]
            key = seg.to(torch.bfloat16).double() if self.bf16 else seg
            nan = key.isnan()
            key = key.masked_fill(nan, float("-inf"))
            if self.ties_high:
                order = seg.numel() - 1 - torch.sort(key.flip(0), descending=True, stable=True).indices
            else:
                order = torch.sort(key, descending=True, stable=True).indices
            order = order[torch.sort(nan[order].to(torch.int8), stable=True).indices]
            pick = order[:topk].sort().values
            k = pick.numel()
            out[r, :k] = (pick + (0 if positions == "relative" else lo)).int().to(out.device)
            vals[r, :k] = seg[pick].float().to(vals.device)
        return out, (vals if return_values else None)

    def topk_per_row(self, logits, ks, ke, topk, *, positions="relative", return_values=False,
                     workspace_bytes=None):
        return self._select(logits, ks, ke, topk, positions, return_values)

    def fp8_mqa_topk(self, q, kv, w, ks, ke, topk, *, positions="relative", return_values=False,
                     workspace_bytes=None):
        k, k_scale = kv
        exact = fp8_mqa_logits_ref(q.double(), k.double(), k_scale.reshape(-1), w, ks, ke)
        logits = _to_f32(exact, self.batch and q.shape[0] > 4)
        return self._select(logits, ks, ke, topk, positions, return_values)

    def fp8_paged_mqa_topk(self, q, kv_cache, w, context_lens, block_tables, max_context_len, topk, *,
                           schedule=None, return_values=False, workspace_bytes=None):
        b, next_n = q.shape[:2]
        exact = fp8_paged_mqa_logits_ref(q, kv_cache, w, context_lens, block_tables, max_context_len,
                                         fp8_dtype=q.dtype)
        logits = _to_f32(exact, self.batch and b * next_n > 4)
        covered = min(max_context_len, block_tables.shape[1] * kv_cache.shape[1])
        ke = visible_lengths(context_lens, next_n).clamp(0, covered)
        return self._select(logits, torch.zeros_like(ke), ke, topk, "relative", return_values)


TIES, LASTKEY = WrongTopk(ties_high=True), WrongTopk(drop_last=True)
BF16SEL, BATCH = WrongTopk(bf16=True), WrongTopk(batch=True)
'''

TOPK_SPECS = f'''
from mqa_core import ProviderSpec, hookimpl

TOPK_WRONG = {TOPK_WRONG!r}


@hookimpl
def mqa_providers():
    return [ProviderSpec(name=name, ops=set(ops), archs={{"cpu", "sm_90"}}, dtypes={{"float8_e4m3fn"}},
                         priority=-100, load=f"wrong_topk_providers.kernels:{{attr}}", claims=set(claims),
                         description=what)
            for name, (attr, ops, claims, what) in TOPK_WRONG.items()]
'''
