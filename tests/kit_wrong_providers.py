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
