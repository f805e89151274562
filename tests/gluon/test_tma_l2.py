"""tma_l2: the driver's arguments as triton derives them, and a descriptor rewritten only once its
bytes are proven to be triton's (a fake encoder stands in for the CUDA driver, absent here)."""

from __future__ import annotations

import ctypes

import pytest

pytest.importorskip("triton")

from mqa_provider_gluon import tma_l2  # noqa: E402


class PyCUtensorMap:  # the name triton's type has; its bytes live in a ctypes buffer here
    def __init__(self) -> None:
        self.raw = ctypes.create_string_buffer(128)


class Desc:
    def __init__(self, shape, strides) -> None:
        self.shape, self.strides, self.padding = shape, strides, "zero"
        self.base = type("T", (), {"data_ptr": lambda self: 0x7000_0000})()


META = {"swizzle": 3, "elem_size": 1, "elem_type": 1, "block_size": [1, 64, 128], "fp4_padded": False}


def test_arguments_are_triton_s_innermost_first_with_byte_strides():
    # a strided page pool's values: [blocks, block_size, D] with a block stride of 8704 bytes
    dtype, rank, dims, strides, box, elem_strides, swizzle = tma_l2.encode_args(META, [300, 64, 128], [8704, 128, 1])
    assert (rank, dims, strides, box, elem_strides, swizzle) == (3, [128, 64, 300], [128, 8704], [128, 64, 1],
                                                                 [1, 1, 1], 3)
    f32 = {**META, "elem_size": 4, "elem_type": 7, "block_size": [1, 64]}
    assert tma_l2.encode_args(f32, [300, 2176], [2176, 1])[2:4] == ([2176, 300], [8704])
    with pytest.raises(ValueError):
        tma_l2.encode_args(META, [300, 64, 128], [8704, 1, 128])  # inner stride must be 1


@pytest.fixture
def fake_driver(monkeypatch):
    """An encoder whose 128 bytes are a function of every argument, the promotion included."""
    calls = []

    def encode(out, address, args, promotion, padding):
        calls.append(promotion)
        blob = repr((address, args, promotion, padding)).encode()[:128].ljust(128, b"\0")
        ctypes.memmove(out, blob, 128)
        return 0

    monkeypatch.setattr(tma_l2, "_encode", encode)
    monkeypatch.setattr(tma_l2, "_map_address", lambda m: ctypes.addressof(m.raw))
    return calls


def _as_triton_built(desc) -> PyCUtensorMap:
    m = PyCUtensorMap()
    scratch = ctypes.create_string_buffer(128)
    tma_l2._encode(ctypes.addressof(scratch), desc.base.data_ptr(),
                   tma_l2.encode_args(META, desc.shape, desc.strides), tma_l2.TRITON_PROMOTION, 0)
    m.raw.raw = scratch.raw
    return m


def test_a_map_triton_built_is_rewritten_with_the_promotion(fake_driver):
    desc = Desc([300, 64, 128], [8704, 128, 1])
    m = _as_triton_built(desc)
    assert tma_l2.promote(m, desc, META, tma_l2.PROMOTIONS["256B"]) is None
    want = ctypes.create_string_buffer(128)
    tma_l2._encode(ctypes.addressof(want), 0x7000_0000, tma_l2.encode_args(META, desc.shape, desc.strides), 3, 0)
    assert m.raw.raw == want.raw


def test_a_map_of_other_arguments_is_left_as_it_is(fake_driver):
    desc = Desc([300, 64, 128], [8704, 128, 1])
    m = _as_triton_built(Desc([300, 64, 128], [8960, 128, 1]))  # built from another stride
    before = m.raw.raw
    note = tma_l2.promote(m, desc, META, 3)
    assert note and "not the one" in note and m.raw.raw == before


def test_triton_s_own_promotion_and_foreign_objects_are_not_touched(fake_driver):
    desc = Desc([300, 64, 128], [8704, 128, 1])
    assert tma_l2.promote(object(), desc, META, tma_l2.TRITON_PROMOTION) is None and fake_driver == []
    assert "not a triton PyCUtensorMap" in tma_l2.promote(object(), desc, META, 3)
