"""The kernel object ``ProviderSpec.load`` names: mqa-core's two ops mapped onto DeepGEMM's entries.

What the conversion adds to DeepGEMM's own calls (each reason, with file:line, in ``limits.py``):

prefill
- windows clamped to ``0 <= ks <= ke <= N`` (three [M] int32 ops): DeepGEMM reads them unsigned and
  sizes each block's key range from them, so the contract's negative starts, ends past N and empty
  windows would otherwise read or write out of bounds;
- k_scale [N, 1] passed as an [N] view; q, k, k_scale, weights copied only when not contiguous or not
  16-byte aligned (TMA), weights also when its rows are strided (its TMA descriptor assumes H);
- M = 0 or N = 0 returns at once (a TMA descriptor cannot be empty);
- the result is DeepGEMM's own [M, N] view (rows padded to ``align(N + 256, 256)`` floats, as the
  contract allows); its fused clean pass gives the -inf outside the windows.

paged (decode)
- context lengths always go in 2-D, clamped to [0, min(max_context_len, table width * block size)]:
  1-D lengths become ``lens[b] - next_n + j + 1``; 2-D ones whose last column is not the row's
  longest (DeepGEMM sizes a sequence's work by it) go in with it raised to the longest, and the
  cells that adds are cleaned with the true lengths; the schedule metadata is computed per call from
  them (it depends on the lengths' values, which engines update in place);
- the page pool is passed as it is (strided pools included) when its strides are what DeepGEMM and
  TMA take, else copied once;
- next_n above 2 runs in groups of 2 into one output (the only case with a copy of logits);
- with ``clean_logits`` the cells past each row's context are set to -inf by ``clean.fill_tail``, which
  writes only those cells; without it nothing is added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from mqa_core.arch import arch_of_device as _arch_of_device

from . import probe
from .clean import fill_tail
from .limits import BLOCK_SIZES, COMMON_BLOCK_SIZES, MAX_NEXT_N

#: TMA needs 16-byte aligned global addresses and strides.
TMA_ALIGN = 16


def _tma(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when contiguous and 16-byte aligned, else a contiguous aligned copy."""
    if t.is_contiguous() and t.data_ptr() % TMA_ALIGN == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _on(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """DeepGEMM launches on the current CUDA device: make it the tensors' one when it is not."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _empty(rows: int, cols: int, clean: bool, device: torch.device) -> torch.Tensor:
    if clean:
        return torch.full((rows, cols), float("-inf"), dtype=torch.float32, device=device)
    return torch.empty((rows, cols), dtype=torch.float32, device=device)


def _page_pool(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache as DeepGEMM takes it: stride(1) = D+4, stride(3) = 1, stride(0) a multiple of 16 bytes."""
    d4 = kv_cache.shape[3]
    s0, s1, s2, s3 = kv_cache.stride()
    if s1 != d4 or s3 != 1 or s0 % TMA_ALIGN or kv_cache.data_ptr() % TMA_ALIGN:
        return kv_cache.contiguous() if not kv_cache.is_contiguous() else kv_cache.clone()
    if s2 != d4:  # dim 2 has size 1: its stride addresses nothing, but the legacy API asserts it
        return kv_cache.as_strided(kv_cache.shape, (s0, s1, d4, 1))
    return kv_cache


class DeepGEMMKernel:
    """DeepGEMM's fp8 MQA-logits kernels behind mqa-core's ``fp8_mqa_logits`` and ``fp8_paged_mqa_logits``.

    :param arch_of_device: how the tensors' device maps to an arch; the default asks the device.
        Tests substitute it to run the argument handling against a stand-in DeepGEMM on the CPU.
    """

    def __init__(self, arch_of_device: Callable[[Any], str] | None = None) -> None:
        self._arch_of_device = arch_of_device or _arch_of_device
        #: (next_n, device) -> int32 [next_n] offsets 1-next_n .. 0, so 1-D lengths become 2-D in one op.
        self._offsets: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _api(self, device: torch.device) -> tuple[probe.Api, str]:
        arch = self._arch_of_device(device)
        if arch not in probe.ARCHS:
            raise RuntimeError(f"deepgemm: DeepGEMM's MQA-logits kernels run on {' and '.join(probe.ARCHS)} "
                               f"GPUs; the tensors are on {device} ({arch})")
        reason = probe.check(arch)
        if reason:
            raise RuntimeError(f"deepgemm cannot run on {arch}: {reason}")
        api, why = probe.load_api()
        if api is None:  # unreachable after a passing check, kept for a clear message
            raise RuntimeError(f"deepgemm cannot run on {arch}: {why}")
        return api, arch

    # -- prefill -----------------------------------------------------------------------------------
    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                       weights: torch.Tensor, cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                       *, clean_logits: bool = True) -> torch.Tensor:
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in the window."""
        fp4 = isinstance(q, tuple)  # FP4: (values, scales), kv likewise (mqa_core.spec.FP4)
        device = q[0].device if fp4 else q.device
        api, arch = self._api(device)
        k, k_scale = kv
        m, n = (q[0] if fp4 else q).shape[0], k.shape[0]
        if m == 0 or n == 0:
            return _empty(m, n, clean_logits, device)
        ks = cu_seqlen_ks.clamp(0, n)
        ke = cu_seqlen_ke.clamp(max=n)
        torch.maximum(ke, ks, out=ke)
        with _on(device):
            if fp4:
                entry = _fp4_entry(api, arch, api.fp8_fp4_mqa_logits)
                return entry((_tma(q[0]), _tma(q[1])), (_tma(k), _tma(k_scale)), _tma(weights), ks, ke,
                             bool(clean_logits))
            return api.mqa_logits(_tma(q), _tma(k), _tma(k_scale.reshape(n)), _tma(weights), ks, ke,
                                  bool(clean_logits))

    # -- decode (paged) ----------------------------------------------------------------------------
    def _lens_2d(self, lens: torch.Tensor, next_n: int, limit: int) -> torch.Tensor:
        """[B, next_n] int32, contiguous: what row (b, j) sees, clamped to [0, limit]."""
        if lens.dim() == 2:  # clamp keeps a transposed tensor's strides; DeepGEMM asserts contiguity
            return lens.clamp(0, limit).contiguous()
        if next_n == 1:
            return lens.clamp(0, limit).view(-1, 1)
        key = (next_n, lens.device)
        offsets = self._offsets.get(key)
        if offsets is None:
            offsets = self._offsets[key] = torch.arange(1 - next_n, 1, dtype=torch.int32, device=lens.device)
        return (lens[:, None] + offsets).clamp_(0, limit)

    def fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                             *, clean_logits: bool = True) -> torch.Tensor:
        """The decode variant over DeepGEMM's paged fp8 cache layout (FP4: q = (values, scales) over
        DeepGEMM's FP4 cache, on sm_100)."""
        fp4 = isinstance(q, tuple)
        api, arch = self._api(q[0].device if fp4 else q.device)
        if fp4:
            return self._paged_fp4(api, arch, q, kv_cache, weights, context_lens, block_tables, max_context_len,
                                   clean_logits)
        b, next_n, h, _ = q.shape
        block_size = kv_cache.shape[1]
        sizes = BLOCK_SIZES.get((api.generation, arch), COMMON_BLOCK_SIZES)
        if block_size not in sizes:
            raise ValueError(f"fp8_paged_mqa_logits: deepgemm ({api.generation} DeepGEMM {api.version}) takes "
                             f"kv_cache blocks of {' or '.join(map(str, sizes))} tokens on {arch}; got "
                             f"block_size={block_size} (kv_cache {list(kv_cache.shape)})")
        rows = b * next_n
        if rows == 0 or max_context_len == 0:
            return _empty(rows, max_context_len, clean_logits, q.device)
        lens = self._lens_2d(context_lens, next_n, min(max_context_len, block_tables.shape[1] * block_size))
        cache = _page_pool(kv_cache)
        tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
        with _on(q.device):
            num_sms = int(api.num_sms())
            if next_n <= MAX_NEXT_N:
                # 1-D lengths give rows whose last is the longest already; 2-D ones may not.
                work = _last_is_longest(lens) if context_lens.dim() == 2 and next_n > 1 else lens
                meta = api.paged_metadata(work, block_size, num_sms)
                out = api.paged_mqa_logits(_tma(q), cache, _tma(weights), work, tables, meta, max_context_len)
            else:
                out = self._grouped(api, q, cache, weights, lens, tables, max_context_len, block_size, num_sms)
        if clean_logits:
            fill_tail(out, lens.view(-1))
        return out

    def _paged_fp4(self, api: probe.Api, arch: str, q: tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                   weights: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
                   max_context_len: int, clean_logits: bool) -> torch.Tensor:
        """FP4 decode: DeepGEMM's fp8_fp4 paged entry with (values, scales), 2-D lengths as for fp8 (the
        fp8_fp4 generation takes any next_n on sm_100, so no groups)."""
        values, sf = q
        b, next_n = values.shape[:2]
        block_size = kv_cache.shape[1]
        rows = b * next_n
        if rows == 0 or max_context_len == 0:
            return _empty(rows, max_context_len, clean_logits, values.device)
        entry = _fp4_entry(api, arch, api.fp8_fp4_paged_mqa_logits)
        lens = self._lens_2d(context_lens, next_n, min(max_context_len, block_tables.shape[1] * block_size))
        work = _last_is_longest(lens) if context_lens.dim() == 2 and next_n > 1 else lens
        tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
        with _on(values.device):
            meta = api.paged_metadata(work, block_size, int(api.num_sms()))
            out = entry((_tma(values), _tma(sf)), _page_pool(kv_cache), _tma(weights), work, tables, meta,
                        max_context_len, False)
        if clean_logits:
            fill_tail(out, lens.view(-1))
        return out

    @staticmethod
    def _grouped(api: probe.Api, q: torch.Tensor, cache: torch.Tensor, weights: torch.Tensor,
                 lens: torch.Tensor, tables: torch.Tensor, max_context_len: int, block_size: int,
                 num_sms: int) -> torch.Tensor:
        """next_n > 2: groups of up to 2 draft tokens, each written into its rows of one output."""
        b, next_n, h, _ = q.shape
        out = torch.empty((b, next_n, max_context_len), dtype=torch.float32, device=q.device)
        w = weights.reshape(b, next_n, h)
        for j0 in range(0, next_n, MAX_NEXT_N):
            j1 = min(next_n, j0 + MAX_NEXT_N)
            part_lens = _last_is_longest(lens[:, j0:j1])
            meta = api.paged_metadata(part_lens, block_size, num_sms)
            part = api.paged_mqa_logits(q[:, j0:j1].contiguous(), cache, w[:, j0:j1].reshape(-1, h).contiguous(),
                                        part_lens, tables, meta, max_context_len)
            out[:, j0:j1].copy_(part.view(b, j1 - j0, max_context_len))
        return out.view(b * next_n, max_context_len)


def _fp4_entry(api: probe.Api, arch: str, entry: Callable[..., Any] | None) -> Callable[..., Any]:
    """DeepGEMM's fp8_fp4 entry for an FP4 call; a clear error where this DeepGEMM or arch has none
    (the spec declares FP4 on sm_100 only, so selection sends no other FP4 call here)."""
    if entry is None or arch != "sm_100":
        raise RuntimeError(f"deepgemm: FP4 inputs need DeepGEMM's fp8_fp4 entries on sm_100; this is {arch} "
                           f"with the {api.generation} DeepGEMM {api.version}")
    return entry


def _last_is_longest(lens: torch.Tensor) -> torch.Tensor:
    """A copy of [B, n] lengths whose last column is each row's longest. DeepGEMM sizes a sequence's
    work by its last column (and masks each row by its own length inside it), so a longer earlier
    row would be left unwritten; the last row's extra cells are then cleaned by ``fill_tail`` with the
    true lengths, or left as the contract allows without ``clean_logits``."""
    out = lens.clone()
    out[:, -1] = lens.amax(dim=1)
    return out


#: What ``load="mqa_provider_deepgemm.kernel:KERNEL"`` imports.
KERNEL = DeepGEMMKernel()
