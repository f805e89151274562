"""The ``aiter`` provider's kernel object: the ops' contract mapped onto AMD AITER's Triton/Gluon
entries (``aiter_probe`` says which; ``aiter_limits`` which shapes).

prefill: ``fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits)`` takes the
contract's arguments almost as they are. Added here: kv split into k and its [N] scale (k_scale may
be [N, 1]); q, k, scales, weights and windows contiguous, float32/int32 (no-ops when they are); q and
k pass with their dtypes (gfx942: AITER converts each e4m3fn operand itself, so converting here would
convert twice; gfx950: e4m3fn only); M = 0 or N = 0 returns at once; the result is AITER's own view
(rows 256-aligned).

decode: ``deepgemm_fp8_paged_mqa_logits(q, kv_cache, weights, out_logits, context_lens, kv_indices,
max_model_len, Preshuffle, KVBlockSize, ChunkK, ...)`` differs from the op in four ways, each
bridged here:

- layout: its Gluon kernels read either per-token pages (``KVBlockSize=1``) or blocks whose values are
  preshuffled in 16-token x 16-byte tiles (``Preshuffle=True``, what vLLM's ROCm cache holds); the op
  hands DeepGEMM's row-major blocks. So each call gathers the blocks the batch can see (its block
  table's first ``ceil(covered / block_size)`` columns, covered = min(max_context_len, table width *
  block size)) into a compact pool in AITER's layout, with a fresh table 0..B*blocks-1. That copy
  reads and writes about B * covered * (D + 4) bytes: the price of meeting a DeepGEMM-layout cache.
  Strided page pools cost nothing extra (the gather reads through the strides).
- dtypes: it views the cache as the arch's fp8 (e4m3fnuz on gfx942) and converts nothing; an
  e4m3fn call on gfx942 is relabelled exactly in the gathered copy (values halved, their scales
  doubled) and q likewise (halved; the weights doubled), as mqa_provider_gluon.fp8 does.
- lengths: it takes 1-D ``context_lens`` with the 1-D rule (row j sees ``p <= len - next_n + j``).
  Every call goes in as next_n = 1 over the B * next_n rows (q viewed [B * next_n, 1, H, D], each
  row's visible length from the op's rule, 1-D or 2-D, clamped to covered): the kernel's grid is one
  program per (row, split) either way, so nothing is shared that this loses, and 2-D lengths of any
  values work.
- memory: it writes the caller's ``out_logits`` (float32), whole ChunkK tiles past a row's context
  in some paths; the output here has rows of ``align(max_context_len, 256) + 256`` floats, -inf
  filled when ``clean_logits``, and the [rows, max_context_len] view is returned. Block ids outside
  the pool are replaced by 0 before the gather (never read) and their positions set to -inf after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mqa_core.arch import arch_of_device as _arch_of_device
from mqa_core.reference import visible_lengths

from . import aiter_probe, probe
from .aiter_limits import CHUNK_K, block_size_ok

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
#: What the provider declares, for the refusal on another arch.
_CLAIM = f"AITER's MQA-logits kernels are declared for {' and '.join(aiter_probe.ARCHS)}"
#: (q, k) dtypes each arch takes (the spec's DECLARED, as torch dtypes). Prefill: AITER converts on
#: gfx942; decode: converted here (the cache is bytes of q's flavour).
PAIRS = {"gfx942": frozenset({(FNUZ, FNUZ), (FN, FNUZ), (FN, FN), (FNUZ, FN)}), "gfx950": frozenset({(FN, FN)})}
#: The fp8 flavour each arch's matrix instructions read (what AITER views the cache as).
NATIVE = {"gfx942": FNUZ, "gfx950": FN}
#: The preshuffled tile: 16 tokens x 16 bytes.
TILE = 16


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _refuse(arch: str, q: torch.dtype, k: torch.dtype) -> TypeError:
    said = ", ".join(f"({_name(a)}, {_name(b)})" for a, b in sorted(PAIRS.get(arch, ()), key=str)) or "nothing"
    return TypeError(f"aiter: AITER's MQA-logits kernels on {arch} take (q, k) dtypes {said}; got "
                     f"({_name(q)}, {_name(k)})")


def preshuffle(values: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size, D] bytes in AITER's preshuffled order: per block, tiles of 16 tokens,
    each D / 16 sub-tiles of 16 tokens x 16 bytes (token-major inside a sub-tile)."""
    blocks, bs, d = values.shape
    tiles = values.view(blocks, bs // TILE, TILE, d // TILE, TILE)
    return tiles.permute(0, 1, 3, 2, 4).reshape(blocks, bs, d)


def compact_pool(kv_cache: torch.Tensor, tables: torch.Tensor, blocks: int, native: torch.dtype,
                 relabel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool [B * blocks, block_size, 1, D + 4] uint8 in AITER's layout, valid [B, blocks] bool): the
    first ``blocks`` blocks each sequence's table names, gathered (ids outside the pool read block
    0; ``valid`` says which were in range); values preshuffled when block_size > 1; with ``relabel``,
    e4m3fn bytes rewritten as e4m3fnuz of half the value and their scales doubled."""
    nb, bs, _, d4 = kv_cache.shape
    d = d4 - 4
    stride = kv_cache.stride(0) if nb > 1 else bs * d4
    start = kv_cache.storage_offset()
    values = kv_cache.as_strided((nb, bs, d), (stride, d, 1), start)
    scales = kv_cache.as_strided((nb, bs * 4), (stride, 1), start + bs * d).view(torch.float32)
    ids = tables[:, :blocks].long()
    valid = (ids >= 0) & (ids < nb)
    ids = torch.where(valid, ids, 0).reshape(-1)
    v, s = values[ids], scales[ids]  # [B * blocks, bs, D], [B * blocks, bs]
    if relabel:
        v = (v.view(FN).float() * 0.5).to(FNUZ).view(torch.uint8)
        s = s * 2.0
    if bs > 1:
        v = preshuffle(v)
    pool = torch.cat((v.reshape(len(ids), bs * d), s.contiguous().view(torch.uint8).reshape(len(ids), bs * 4)), 1)
    return pool.view(len(ids), bs, 1, d4), valid


class AiterKernel:
    """AITER's Triton/Gluon MQA-logits kernels behind both ops.

    :param arch_of_device: how the tensors' device maps to an arch; the default asks the device.
        Tests substitute it to run the argument handling against a stand-in AITER on the CPU.
    """

    def __init__(self, arch_of_device: Callable[[Any], str] | None = None) -> None:
        self._arch_of_device = arch_of_device or _arch_of_device

    def _entries(self, device: torch.device) -> tuple[aiter_probe.Entries, str]:
        arch = self._arch_of_device(device)
        return probe.ready("aiter", arch, device, _CLAIM, aiter_probe.ARCHS, aiter_probe.check,
                           aiter_probe.load_entries), arch

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                       clean_logits: bool = True) -> torch.Tensor:
        """logits[m, n] = k_scale[n] * sum_h weights[m, h] * relu(q[m, h] . k[n]) in the window."""
        entries, arch = self._entries(q.device)
        k, k_scale = kv
        if (q.dtype, k.dtype) not in PAIRS[arch]:
            raise _refuse(arch, q.dtype, k.dtype)
        m, n = q.shape[0], k.shape[0]
        if m == 0 or n == 0:
            return torch.full((m, n), float("-inf"), dtype=torch.float32, device=q.device)
        out = entries.prefill(q.contiguous(), k.contiguous(), k_scale.reshape(n).float().contiguous(),
                              weights.float().contiguous(), cu_seqlen_ks.to(torch.int32).contiguous(),
                              cu_seqlen_ke.to(torch.int32).contiguous(), clean_logits=bool(clean_logits))
        return out if tuple(out.shape) == (m, n) else out[:m, :n]

    def fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int, *,
                             clean_logits: bool = True) -> torch.Tensor:
        """The decode op over DeepGEMM's paged layout, through AITER's layout (see the module)."""
        entries, arch = self._entries(q.device)
        b, next_n, h, d = q.shape
        nb, bs = kv_cache.shape[:2]
        if (q.dtype, q.dtype) not in PAIRS[arch]:
            raise _refuse(arch, q.dtype, q.dtype)
        if not block_size_ok(bs):
            raise ValueError(f"aiter: block_size {bs} is neither 1 nor a multiple of 16 dividing ChunkK={CHUNK_K}")
        if bs > 1 and not {"Preshuffle", "KVBlockSize"} <= entries.paged_params:
            raise RuntimeError(f"aiter: this AITER's {aiter_probe.PAGED} pages per token only (no Preshuffle/"
                               f"KVBlockSize); block_size {bs} needs a newer amd-aiter")
        rows = b * next_n
        width = -(-max_context_len // 256) * 256 + 256
        out = (torch.full if clean_logits else torch.empty)(
            (rows, width), *((float("-inf"),) if clean_logits else ()), dtype=torch.float32, device=q.device)
        out = out[:, :max_context_len]
        covered = min(max_context_len, block_tables.shape[1] * bs)
        if rows == 0 or covered == 0 or nb == 0:
            return out.fill_(float("-inf")) if rows and max_context_len else out
        blocks = -(-covered // bs)
        relabel = arch == "gfx942" and q.dtype == FN
        pool, valid = compact_pool(kv_cache, block_tables, blocks, NATIVE[arch], relabel)
        qq, w = q, weights.float()
        if relabel:  # q as e4m3fnuz of half its value; the weights (q's per-head scale) doubled
            qq, w = (q.float() * 0.5).to(FNUZ), w * 2.0
        qq = qq.reshape(rows, 1, h, d).contiguous()
        lens = visible_lengths(context_lens, next_n).clamp(0, covered).to(torch.int32)
        table = (torch.arange(b * blocks, dtype=torch.int32, device=q.device).view(b, 1, blocks)
                 .expand(b, next_n, blocks).reshape(rows, blocks))
        kw: dict[str, Any] = {"ChunkK": CHUNK_K}
        if {"Preshuffle", "KVBlockSize"} <= entries.paged_params:
            kw.update(Preshuffle=bs > 1, KVBlockSize=bs)
        entries.paged(qq, pool, w.contiguous(), out, lens, table, max_context_len, **kw)
        # positions of blocks outside the pool: -inf (the gather read block 0 there); no host sync
        bad = (~valid)[:, None, :, None].expand(b, next_n, blocks, bs).reshape(rows, blocks * bs)[:, :covered]
        out[:, :covered].masked_fill_(bad, float("-inf"))
        return out


#: What ``load="mqa_provider_flydsl.aiter_kernel:KERNEL"`` imports.
KERNEL = AiterKernel()
