"""A TMA descriptor's L2 promotion, chosen instead of triton's.

Why: triton 3.6 encodes every tensor descriptor with ``CU_TENSOR_MAP_L2_PROMOTION_L2_128B`` (its
``fill_tma_descriptor``), and offers no other. The promotion is the granule an L2 miss of a TMA load
fetches from DRAM; DeepGEMM encodes its paged cache's descriptors with 256 bytes. A kernel that only
streams a cache through TMA may read DRAM better with the wider granule (a launch setting: the
results are the same bits either way).

How: the descriptor triton built (a ``PyCUtensorMap``, which holds the 128-byte ``CUtensorMap`` at
offset 128 of the object) is encoded again with ``cuTensorMapEncodeTiled`` from the driver, from the
same arguments triton derived it from. First with triton's own promotion: only when those bytes
equal the object's (the layout and the arguments are what this module assumes) is the object
rewritten with the chosen promotion. Otherwise it is left as triton built it, and
:func:`promote` says why.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["PROMOTIONS", "TRITON_PROMOTION", "encode_args", "promote"]

#: ``CUtensorMapL2promotion``, by name.
PROMOTIONS = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
#: What triton 3.6 encodes.
TRITON_PROMOTION = PROMOTIONS["128B"]
#: Where ``PyCUtensorMapObject`` keeps its ``CUtensorMap``: after the object header, 128-byte aligned.
_MAP_OFFSET = 128
_MAP_BYTES = 128


def encode_args(meta: dict[str, Any], shape: Sequence[int], strides: Sequence[int]) -> tuple[Any, ...]:
    """The arguments of ``cuTensorMapEncodeTiled`` after the map and the address, as triton 3.6's
    ``fill_tma_descriptor`` derives them from a descriptor's metadata (swizzle, element size and type,
    block) and its shape and strides (in elements, outermost first): (data type, rank, dims, byte
    strides, box, element strides, swizzle). The driver takes dimensions innermost first, and the
    rank - 1 strides of the outer dimensions in bytes."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    block = list(meta["block_size"])
    rank = len(block)
    if len(shape) != rank or len(strides) != rank or strides[-1] != 1:
        raise ValueError(f"descriptor of rank {rank} with shape {list(shape)}, strides {list(strides)}")
    size = int(meta["elem_size"])
    dims = [int(shape[rank - 1 - i]) for i in range(rank)]
    if meta.get("fp4_padded"):
        dims[0] *= 2
    byte_strides = [size * int(strides[rank - 2 - i]) for i in range(rank - 1)]
    return (TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], rank, dims, byte_strides,
            [int(block[rank - 1 - i]) for i in range(rank)], [1] * rank, int(meta["swizzle"]))


@functools.cache
def _encoder() -> Any:
    """The driver's ``cuTensorMapEncodeTiled`` (raises OSError without a CUDA driver)."""
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    return fn


def _encode(out: int, address: int, args: tuple[Any, ...], promotion: int, padding: int) -> int:
    """``cuTensorMapEncodeTiled`` into the 64-byte aligned 128 bytes at ``out``: its CUresult."""
    dtype, rank, dims, strides, box, elem_strides, swizzle = args
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    return _encoder()(ctypes.c_void_p(out), ctypes.c_int(dtype), u32(rank), ctypes.c_void_p(address),
                      (u64 * rank)(*dims), (u64 * max(rank - 1, 1))(*strides), (u32 * rank)(*box),
                      (u32 * rank)(*elem_strides), ctypes.c_int(0), ctypes.c_int(swizzle), ctypes.c_int(promotion),
                      ctypes.c_int(padding))


def _map_address(tensor_map: Any) -> int:
    """Where a ``PyCUtensorMap`` holds its ``CUtensorMap`` (CPython: ``id`` is the object's address)."""
    return id(tensor_map) + _MAP_OFFSET


def promote(tensor_map: Any, desc: Any, meta: dict[str, Any], promotion: int) -> str | None:
    """Re-encode ``tensor_map`` (the ``PyCUtensorMap`` triton's ``make_tensordesc_arg`` built for the
    host descriptor ``desc`` with launcher metadata ``meta``) with L2 ``promotion``. None when done
    (or nothing to do), else why it was left as triton built it."""
    if promotion == TRITON_PROMOTION:
        return None
    if type(tensor_map).__name__ != "PyCUtensorMap":
        return f"not a triton PyCUtensorMap: {type(tensor_map).__name__}"
    try:
        args = encode_args(meta, desc.shape, desc.strides)
        scratch = ctypes.create_string_buffer(_MAP_BYTES + 64)
        at = (ctypes.addressof(scratch) + 63) // 64 * 64
        address = desc.base.data_ptr()
        padding = 1 if getattr(desc, "padding", "zero") == "nan" else 0
        held = _map_address(tensor_map)
        if _encode(at, address, args, TRITON_PROMOTION, padding) != 0:
            return "cuTensorMapEncodeTiled refused triton's own arguments"
        if ctypes.string_at(at, _MAP_BYTES) != ctypes.string_at(held, _MAP_BYTES):
            return "the descriptor triton built is not the one its arguments encode (another layout or triton)"
        if _encode(at, address, args, promotion, padding) != 0:
            return f"cuTensorMapEncodeTiled refused L2 promotion {promotion}"
        ctypes.memmove(held, at, _MAP_BYTES)
    except (OSError, AttributeError, KeyError, ValueError, TypeError, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
