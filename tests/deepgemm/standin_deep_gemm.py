"""STAND-IN for DeepGEMM's attention entries (``import deep_gemm``), for CPU tests only.

The tests install this file as ``deep_gemm/_standin.py`` of a stand-in distribution; its ``__init__``
exports one API generation's names. It has the real entries' signatures and checks (DeepGEMM 54e2261
``csrc/apis/attention.hpp``; the legacy generation as vLLM/SGLang shipped it) and reproduces what the
kernels do to memory, computing values with mqa-core's float64 oracle:

- prefill: windows are read as uint32; each block of ``128 / H`` rows computes every key of the
  range [min ks, max ke) rounded out to 256 (values for keys outside a row's window too); weights are
  read with row stride H whatever their strides (the TMA descriptor's); output rows are padded to
  ``align(N + 256, 256)`` floats and start as NaN; the clean pass writes -inf outside [ks, ke) and, like
  the real one, past N when ke > N; a block whose key range underflows, or an empty descriptor, raises
  (the real kernel would fault).
- paged: only the last column of 2-D context lengths sizes a sequence's work; every row of it gets
  values up to that length rounded up to 256, positions past the sequence's blocks reading physical
  block 0 (the kernel's fallback), nothing beyond (NaN); no clean pass with 2-D lengths; the schedule
  metadata must be the one computed from the same lengths.

The arch it pretends to run on comes from ``MQA_TEST_DEEPGEMM_ARCH`` (default sm_90).
``CALLS`` records each call's arguments so tests can check what the adapter passed.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mqa_core.reference import (
    fp4_mqa_logits_ref,
    fp4_paged_mqa_logits_ref,
    fp8_mqa_logits_ref,
    fp8_paged_mqa_logits_ref,
)

CALLS: list[dict[str, Any]] = []
NUM_SMS = 132
UINT32 = 2**32


class DGError(RuntimeError):
    """What DG_HOST_ASSERT raises (a RuntimeError carrying the failed condition)."""


def _assert(cond: bool, text: str) -> None:
    if not cond:
        raise DGError(f"Assertion error (csrc/apis/attention.hpp): {text}")


def _arch() -> str:
    return os.environ.get("MQA_TEST_DEEPGEMM_ARCH", "sm_90")


def _heads() -> tuple[int, ...]:
    return (32, 64) if _arch() == "sm_90" else (8, 16, 32, 64)


def _align(x: int, y: int) -> int:
    return -(-x // y) * y


def _tma(name: str, t: torch.Tensor) -> None:
    _assert(t.data_ptr() % 16 == 0, f"TMA: {name} base address must be 16-byte aligned")


def _unsigned(t: torch.Tensor) -> torch.Tensor:
    return t.long() % UINT32


def get_num_sms() -> int:
    return NUM_SMS


# -- prefill -------------------------------------------------------------------------------------

def _prefill(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
             ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool, max_seqlen_k: int,
             generation: str) -> torch.Tensor:
    kv_fp, kv_sf = kv
    m, h, d = q.shape
    _assert(h in _heads(), f"num_heads {h} in {_heads()} on {_arch()}")
    _assert(d in (32, 64, 128), "head_dim == 32 or 64 or 128")
    _assert(q.is_contiguous() and q.dtype == torch.float8_e4m3fn, "q contiguous e4m3fn")
    _assert(kv_fp.dim() == 2 and kv_fp.shape[1] == d, "kv [N, D]")
    n = kv_fp.shape[0]
    _assert(kv_fp.is_contiguous() and kv_fp.dtype == torch.float8_e4m3fn, "kv contiguous e4m3fn")
    _assert(kv_sf.dim() == 1 and kv_sf.shape[0] == n, "kv_sf [N] (get_shape<1>)")
    _assert(kv_sf.is_contiguous() and kv_sf.dtype == torch.float32, "kv_sf contiguous float32")
    _assert(tuple(weights.shape) == (m, h) and weights.stride(1) == 1, "weights [M, H], stride(1) == 1")
    _assert(weights.dtype == torch.float32, "weights float32")
    for name, t in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        _assert(t.shape[0] == m and t.is_contiguous() and t.dtype == torch.int32, f"{name} [M] contiguous int32")
    _assert(max_seqlen_k == 0, "stand-in: compressed logits are not modelled")
    for name, t in (("q", q), ("kv", kv_fp), ("kv_sf", kv_sf), ("weights", weights)):
        _tma(name, t)
    if m == 0 or n == 0:
        raise DGError("cuTensorMapEncodeTiled failed: a tensor map dimension is 0")
    CALLS.append({"op": "prefill", "generation": generation, "q": q, "k": kv_fp, "k_scale": kv_sf,
                  "weights": weights, "ks": ks.clone(), "ke": ke.clone(), "clean_logits": clean_logits})

    block_q, block_kv = 128 // h, 256
    stride = _align(n + block_kv, 256)
    logits = torch.full((_align(m, block_q), stride), float("nan"), dtype=torch.float32)
    # The weights TMA descriptor uses H as its row stride, whatever the tensor's strides are.
    flat = torch.as_strided(weights, (m, h), (h, 1))
    full = torch.zeros(m, dtype=torch.int32), torch.full((m,), n, dtype=torch.int32)
    values = fp8_mqa_logits_ref(q, kv_fp, kv_sf, flat, *full).float()  # every key of every row
    uks, uke = _unsigned(ks), _unsigned(ke)
    for r0 in range(0, m, block_q):
        rows = slice(r0, min(m, r0 + block_q))
        start = int(uks[rows].clamp(max=n).min()) // 4 * 4
        end = int(uke[rows].clamp(max=n).max())
        if end < start:
            raise DGError(f"CUDA error: an illegal memory access (rows {r0}..: key range [{start}, {end}) "
                          "underflows as uint32)")
        stop = start + -(-(end - start) // block_kv) * block_kv
        cols = slice(start, min(stop, n))
        logits[rows, cols] = values[rows, cols]
        if stop > n:  # keys past N: TMA fills zeros, so the kernel writes 0 there
            logits[rows, n:stop] = 0.0
    if clean_logits:
        cols = torch.arange(n)
        for i in range(m):
            a, b = int(uks[i]), int(uke[i])
            for edge in (a, b):  # its scalar loops write -inf from an edge to the edge rounded to 4
                if edge > stride and edge % 4:
                    raise DGError(f"CUDA error: the clean pass writes -inf at column {edge} of row {i}, "
                                  f"past its row of {stride}")
            logits[i, :n][(cols < a) | (cols >= b)] = float("-inf")
            logits[i, b:_align(b, 4)] = float("-inf")
    return logits[:m, :n]


def fp8_fp4_mqa_logits(q: Any, kv: Any, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor,
                       cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True, max_seqlen_k: int = 0,
                       logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    _assert(isinstance(q, tuple) and len(q) == 2, "q is a tuple (q_fp, q_sf)")
    q_fp, q_sf = q
    _assert(logits_dtype == torch.float32, "stand-in: float32 logits only")
    if q_sf is not None:
        return _prefill_fp4(q_fp, q_sf, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                            max_seqlen_k)
    return _prefill(q_fp, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k,
                    "fp8_fp4")


def _prefill_fp4(q: torch.Tensor, q_sf: torch.Tensor, kv: Any, weights: torch.Tensor, ks: torch.Tensor,
                 ke: torch.Tensor, clean_logits: bool, max_seqlen_k: int) -> torch.Tensor:
    """FP4 (attention.hpp:88-118): sm_100 only, packed int8 q [M, H, D / 2] and kv [N, D / 2], int32
    scales [M, H] and [N], all contiguous. Values in every row's window (the stand-in does not model
    the block over-compute here), -inf outside with clean_logits, NaN otherwise; rows as the fp8 ones."""
    kv_fp, kv_sf = kv
    m, h, w = q.shape
    d = 2 * w
    _assert(_arch() == "sm_100", "arch_major == 10")
    _assert(h in (8, 16, 32, 64), "num_heads == 8 or 16 or 32 or 64")
    _assert(d in (64, 128), "head_dim == 64 or 128")
    _assert(q.is_contiguous() and q.dtype == torch.int8, "q contiguous kPackedFP4 (int8)")
    _assert(tuple(q_sf.shape) == (m, h) and q_sf.is_contiguous() and q_sf.dtype == torch.int32, "q_sf [M, H] int32")
    _assert(kv_fp.dim() == 2 and 2 * kv_fp.shape[1] == d, "kv [N, D / 2]")
    n = kv_fp.shape[0]
    _assert(kv_fp.is_contiguous() and kv_fp.dtype == torch.int8, "kv contiguous kPackedFP4 (int8)")
    _assert(tuple(kv_sf.shape) == (n,) and kv_sf.is_contiguous() and kv_sf.dtype == torch.int32, "kv_sf [N] int32")
    _assert(tuple(weights.shape) == (m, h) and weights.stride(1) == 1 and weights.dtype == torch.float32,
            "weights [M, H] float32")
    _assert(max_seqlen_k == 0, "stand-in: compressed logits are not modelled")
    CALLS.append({"op": "prefill", "generation": "fp8_fp4", "fp4": True, "q": q, "q_sf": q_sf, "k": kv_fp,
                  "k_scale": kv_sf, "weights": weights, "ks": ks.clone(), "ke": ke.clone(),
                  "clean_logits": clean_logits})
    logits = torch.full((m, _align(n + 256, 256)), float("nan"), dtype=torch.float32)
    ref = fp4_mqa_logits_ref(q, q_sf, kv_fp, kv_sf, weights, ks, ke).float()
    inside = torch.isfinite(ref)
    logits[:, :n][inside] = ref[inside]
    if clean_logits:
        logits[:, :n][~inside] = float("-inf")
    return logits[:, :n]


def fp8_mqa_logits(q: torch.Tensor, kv: Any, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor,
                   cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True, max_seqlen_k: int = 0
                   ) -> torch.Tensor:
    return _prefill(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k,
                    GENERATION)


# -- paged ---------------------------------------------------------------------------------------

#: Which generation's rules the legacy-named entries follow; the stand-in's __init__ sets it.
GENERATION = "fp8_fp4"


def _lens_ok(context_lens: torch.Tensor) -> None:
    _assert(context_lens.dtype == torch.int32 and context_lens.is_contiguous(), "context_lens contiguous int32")
    if GENERATION == "fp8_fp4":
        _assert(context_lens.dim() == 2, "context_lens.dim() == 2 (only 2D context lens is supported)")


def _last_column(context_lens: torch.Tensor) -> torch.Tensor:
    return context_lens[:, -1] if context_lens.dim() == 2 else context_lens


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: Any = None) -> torch.Tensor:
    _lens_ok(context_lens)
    if _arch() == "sm_90" or GENERATION == "legacy":
        _assert(block_kv == 64, "block_kv == 64")
    else:
        _assert(block_kv in (32, 64), "block_kv == 64 or block_kv == 32")
    # Not DeepGEMM's schedule, but a function of the same input: the work per sequence, prefix-summed.
    splits = (-(-_unsigned(_last_column(context_lens)) // 256)).cumsum(0)
    meta = torch.zeros((num_sms + 1, 2), dtype=torch.int32)
    meta[: min(num_sms + 1, splits.numel()), 0] = splits[: num_sms + 1].to(torch.int32)
    meta[:, 1] = int(splits[-1]) if splits.numel() else 0
    return meta


def _paged(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
           block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int, clean_logits: bool,
           q_sf: torch.Tensor | None = None) -> torch.Tensor:
    b, next_n, h, d = q.shape
    row = d  # bytes a token's values take in the cache
    _assert(next_n >= 1, "next_n >= 1")
    if q_sf is not None:  # FP4 (attention.hpp:255-296): sm_100, packed int8 q, int32 scales, D / 2 + 4 bytes
        d = 2 * row
        _assert(_arch() == "sm_100", "arch_major == 10")
        _assert(h in (8, 16, 32, 64) and d in (64, 128), "FP4: num_heads in 8..64, head_dim 64 or 128")
        _assert(q.is_contiguous() and q.dtype == torch.int8, "q contiguous kPackedFP4 (int8)")
        _assert(tuple(q_sf.shape) == (b, next_n, h) and q_sf.is_contiguous() and q_sf.dtype == torch.int32,
                "q_sf [B, next_n, H] int32")
    else:
        _assert(h in _heads(), f"num_heads {h} in {_heads()} on {_arch()}")
        _assert(d in (32, 64, 128), "head_dim == 32 or 64 or 128")
        _assert(q.is_contiguous() and q.dtype == torch.float8_e4m3fn, "q contiguous e4m3fn")
    num_blocks, block_kv, heads_kv, d4 = kv_cache.shape
    blocks_ok = (64,) if (_arch() == "sm_90" or GENERATION == "legacy") else (32, 64)
    _assert(block_kv in blocks_ok, f"block_kv in {blocks_ok}")
    _assert(heads_kv == 1 and d4 == row + 4, "kv_cache [num_blocks, block_kv, 1, D + 4] (FP4: D / 2 + 4)")
    _assert(kv_cache.stride(1) == d4 and kv_cache.stride(3) == 1, "kv_cache stride(1) == D + 4, stride(3) == 1")
    if GENERATION == "legacy":
        _assert(kv_cache.stride(2) == d4, "kv_cache stride(2) == D + 4")
    _assert(kv_cache.stride(0) % 4 == 0, "kv_cache_stride_bytes % sizeof(float) == 0")
    _assert(kv_cache.stride(0) % 16 == 0, "TMA: kv_cache stride(0) must be a multiple of 16 bytes")
    _assert(kv_cache.dtype == torch.uint8, "kv_cache uint8")
    _assert(weights.is_contiguous() and tuple(weights.shape) == (b * next_n, h), "weights contiguous [B*next_n, H]")
    _assert(weights.dtype == torch.float32, "weights float32")
    _assert(block_table.shape[0] == b and block_table.stride(1) == 1 and block_table.dtype == torch.int32,
            "block_table [B, max_blocks], stride(1) == 1, int32")
    _lens_ok(context_lens)
    if context_lens.dim() == 2:
        _assert(tuple(context_lens.shape) == (b, next_n), "context_lens [B, next_n]")
    else:
        _assert(tuple(context_lens.shape) == (b,), "context_lens [B]")
    _assert(tuple(schedule_meta.shape) == (NUM_SMS + 1, 2) and schedule_meta.is_contiguous()
            and schedule_meta.dtype == torch.int32, "schedule_meta [num_sms + 1, 2] int32")
    if _arch() == "sm_90" or GENERATION == "legacy":
        _assert(next_n in (1, 2), "next_n == 1 or next_n == 2")
    if clean_logits:
        _assert(context_lens.dim() == 1, "not is_context_lens_2d (clean_logits)")
    for name, t in (("q", q), ("kv_cache", kv_cache), ("weights", weights)):
        _tma(name, t)
    expected = get_paged_mqa_logits_metadata(context_lens, block_kv, NUM_SMS)
    if not torch.equal(schedule_meta, expected):
        raise DGError("stand-in: schedule_meta was not computed from these context_lens (the kernel "
                      "would mis-schedule)")
    CALLS.append({"op": "paged", "generation": GENERATION, "fp4": q_sf is not None, "q": q, "q_sf": q_sf,
                  "kv_cache": kv_cache, "weights": weights,
                  "context_lens": context_lens.clone(), "block_table": block_table,
                  "max_context_len": max_context_len, "clean_logits": clean_logits})

    split_kv = 256
    stride = _align(max_context_len, split_kv)
    if GENERATION == "fp8_fp4":  # rows 1024-byte aligned
        stride = _align(stride, 256)
    logits = torch.full((b * next_n, stride), float("nan"), dtype=torch.float32)
    last = _unsigned(_last_column(context_lens))
    per_split = split_kv // block_kv
    for bi in range(b):
        num_kv = -(-int(last[bi]) // block_kv)
        if num_kv > block_table.shape[1]:
            raise DGError(f"CUDA error: an illegal memory access (sequence {bi} needs {num_kv} blocks, "
                          f"block_table has {block_table.shape[1]})")
        blocks = -(-num_kv // per_split) * per_split  # whole splits of 256 positions
        if blocks * block_kv > stride:
            raise DGError(f"CUDA error: sequence {bi} writes {blocks * block_kv} positions into rows of {stride}")
        if blocks == 0:
            continue
        # Past the sequence's blocks the kernel reads physical block 0.
        table = torch.zeros((1, blocks), dtype=torch.int32)
        table[0, :num_kv] = block_table[bi, :num_kv]
        seen = torch.full((1, next_n), blocks * block_kv, dtype=torch.int32)
        rows = slice(bi * next_n, (bi + 1) * next_n)
        if q_sf is None:
            vals = fp8_paged_mqa_logits_ref(q[bi:bi + 1], kv_cache, weights[rows], seen, table, blocks * block_kv)
        else:
            vals = fp4_paged_mqa_logits_ref(q[bi:bi + 1], q_sf[bi:bi + 1], kv_cache, weights[rows], seen, table,
                                            blocks * block_kv)
        logits[rows, : blocks * block_kv] = vals.float()
    if clean_logits:  # legacy generation, 1-D lengths: row b*next_n+j keeps positions < lens[b]-next_n+j+1
        seen = context_lens.long()[:, None] - next_n + torch.arange(1, next_n + 1)[None, :]
        cols = torch.arange(stride)
        logits[cols[None, :] >= seen.reshape(-1, 1)] = float("-inf")
    return logits[:, :max_context_len]


def fp8_fp4_paged_mqa_logits(q: Any, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                             block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                             clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
                             indices: Any = None) -> torch.Tensor:
    _assert(isinstance(q, tuple) and len(q) == 2, "q is a tuple (q_fp, q_sf)")
    _assert(indices is None and logits_dtype == torch.float32, "stand-in: no varlen, float32 logits")
    return _paged(q[0], kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                  clean_logits, q[1])


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor,
                         max_context_len: int, clean_logits: bool = False) -> torch.Tensor:
    return _paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits)
