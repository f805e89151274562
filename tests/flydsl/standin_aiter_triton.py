"""STAND-IN for AMD AITER's Triton/Gluon MQA-logits entries, for CPU tests of the ``aiter`` provider.

The tests install it twice in a stand-in ``amd-aiter`` (``conftest.py``), as
``aiter/ops/triton/attention/fp8_mqa_logits.py`` and ``.../pa_mqa_logits.py`` (the layout since
ROCm/aiter#1638), each module exporting its entry. It has the real entries' signatures and host
checks (ROCm/aiter ``e4048607a5``) and reproduces what the kernels do to memory, computing the
arithmetic in torch (float64) so the adapter is checked numerically:

- ``fp8_mqa_logits``: H and D powers of two (asserted); on gfx942 each e4m3fn operand is converted
  to e4m3fnuz of half the value with ``kv_scales`` doubled (the host code does this); the kernels
  read the bytes as the arch's fp8 (gfx942 e4m3fnuz, gfx950 OCP e4m3fn: fnuz bytes there come out
  wrong, silently, as on hardware). Rows 256-aligned, -inf filled with ``clean_logits`` (NaN
  otherwise: ``torch.empty``); windows clamped to [0, N); only in-window cells written.
- ``deepgemm_fp8_paged_mqa_logits``: the host asserts (``block_Size == KVBlockSize``, ChunkK and
  KVBlockSize dividing one another, Preshuffle needing KVBlockSize % 16 == 0) and the cache
  ``view(-1, KVBlockSize * (D + 4))`` (raises for a strided pool, as torch does there). The Gluon
  kernels: without Preshuffle they page per token, so KVBlockSize > 1 is refused here (upstream it
  reads wrong keys or faults); with Preshuffle the values are read in the 16 x 16-byte tiled order
  at D = 128. 1-D ``context_lens`` only (``context_len_ptr + pid_batch``); row j of a sequence sees
  ``p <= len - next_n + j``; q and the cache bytes are read as the arch's fp8; each row is written
  over [0, align(len, 16)): values where visible, -inf elsewhere, past ``max_model_len`` too, so the
  caller's rows must be wide enough (checked: the real kernel would write into the next row).

The arch comes from ``MQA_TEST_AITER_GFX`` (default gfx942). ``CALLS`` records each call.
"""

from __future__ import annotations

import os
from typing import Any

import torch

CALLS: list[dict[str, Any]] = []
FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def _gfx() -> str:
    return os.environ.get("MQA_TEST_AITER_GFX", "gfx942")


def _read(x: torch.Tensor, arch: str) -> torch.Tensor:
    """float64 of the bytes of ``x`` as ``arch``'s fp8 matrix instructions read them."""
    raw = x.contiguous().view(torch.uint8)
    return raw.view(FNUZ if arch == "gfx942" else FN).double()


def fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True):
    seq_len, num_heads, head_size = Q.shape
    seq_len_kv = KV.shape[0]
    assert num_heads & (num_heads - 1) == 0, "num q. heads should be power of 2."
    assert head_size & (head_size - 1) == 0, "head size should be power of 2."
    arch = _gfx()
    CALLS.append({"op": "prefill", "arch": arch, "q": Q.dtype, "kv": KV.dtype, "kv_scales": kv_scales.shape,
                  "clean_logits": clean_logits})
    aligned = (seq_len_kv + 255) // 256 * 256
    logits = torch.full((seq_len, aligned), float("-inf") if clean_logits else float("nan"),
                        dtype=torch.float32)[:, :seq_len_kv]
    scale = kv_scales.double()
    if arch == "gfx942":  # the host converts each e4m3fn operand (values halved, the scale doubled)
        if Q.dtype != FNUZ:
            Q, scale = (Q.to(torch.float32) * 0.5).to(FNUZ), scale * 2.0
        if KV.dtype != FNUZ:
            KV, scale = (KV.to(torch.float32) * 0.5).to(FNUZ), scale * 2.0
    q, k = _read(Q, arch), _read(KV, arch)
    dots = torch.einsum("mhd,nd->mhn", q, k) * scale[None, None, :]
    values = torch.einsum("mhn,mh->mn", dots.clamp_min(0), weights.double()).float()
    cols = torch.arange(seq_len_kv)[None, :]
    inside = (cols >= cu_starts.long().clamp(min=0)[:, None]) & (cols < cu_ends.long().clamp(max=seq_len_kv)[:, None])
    logits[inside] = values[inside]
    return logits


def _unshuffle(values: torch.Tensor) -> torch.Tensor:
    """[blocks, bs, 128] bytes laid out in AITER's preshuffled order -> row-major tokens."""
    blocks, bs, d = values.shape
    assert d == 128, "the CDNA preshuffled kernel addresses 16-token tiles as 16 x 128 bytes"
    return values.reshape(blocks, bs // 16, d // 16, 16, 16).permute(0, 1, 3, 2, 4).reshape(blocks, bs, d)


def deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len,
                                  Preshuffle=False, KVBlockSize=1, ChunkK=256, TotalCuCount=None, WavePerEU=2,
                                  VarCtxSchedule=None):
    batch_size, next_n, heads, hidden_dim = q_fp8.size()
    _, block_size, _, index_dim = kv_cache.size()
    _, max_block_len = kv_indices.size()
    assert ChunkK % KVBlockSize == 0 or KVBlockSize % ChunkK == 0
    assert block_size == KVBlockSize
    if Preshuffle:
        assert KVBlockSize % 16 == 0, f"Preshuffle mode only supports KVBlockSize aligned to 16. Got {KVBlockSize}"
    else:
        assert KVBlockSize == 1, ("stand-in: the non-preshuffled Gluon kernel pages per token; with "
                                  "KVBlockSize > 1 it reads the wrong keys (upstream faults or pollutes)")
    flat = kv_cache.view(-1, KVBlockSize * index_dim)  # raises for a strided pool, as AITER's view does
    arch = _gfx()
    assert out_logits.dtype == torch.float32
    assert context_lens.dim() == 1 and context_lens.shape[0] == batch_size and context_lens.dtype == torch.int32
    CALLS.append({"op": "paged", "arch": arch, "q": q_fp8.dtype, "next_n": next_n, "Preshuffle": Preshuffle,
                  "KVBlockSize": KVBlockSize, "ChunkK": ChunkK, "kv_cache": tuple(kv_cache.shape),
                  "context_lens": context_lens.clone(), "kv_indices": kv_indices.clone(),
                  "max_model_len": max_model_len, "out_stride": out_logits.stride(0)})
    num_block = flat.shape[0]
    values = flat[:, : KVBlockSize * hidden_dim].reshape(num_block, KVBlockSize, hidden_dim)
    if Preshuffle:
        values = _unshuffle(values)
    scales = flat[:, KVBlockSize * hidden_dim:].contiguous().view(torch.float32).double()  # [blocks, bs]
    q = _read(q_fp8, arch)
    for b in range(batch_size):
        ctx = int(context_lens[b])
        if ctx <= 0:
            continue
        pos = torch.arange(ctx)
        ids = kv_indices[b, pos // KVBlockSize].long()
        assert bool(((ids >= 0) & (ids < num_block)).all()), "stand-in: a block id outside the pool (a fault)"
        k = _read(values[ids, pos % KVBlockSize], arch) * scales[ids, pos % KVBlockSize][:, None]
        span = -(-ctx // 16) * 16
        for j in range(next_n):
            row = b * next_n + j
            end = out_logits.storage_offset() + row * out_logits.stride(0) + span
            assert end <= out_logits.untyped_storage().nbytes() // 4, "stand-in: the kernel writes past the output"
            assert row == batch_size * next_n - 1 or span <= out_logits.stride(0), \
                "stand-in: the kernel writes whole 16-position tiles past the row's end into the next row"
            s = (q[b, j] @ k.T).clamp_min(0)  # [H, ctx]
            vals = torch.full((span,), float("-inf"), dtype=torch.float64)
            vals[:ctx] = weights[row].double() @ s
            vals[max(0, ctx - next_n + j + 1):] = float("-inf")
            out_logits.as_strided((span,), (1,), out_logits.storage_offset() + row * out_logits.stride(0)).copy_(vals)
    return "stand-in-cache-key"
