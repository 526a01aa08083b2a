"""Packed little-endian arrays: the layout other languages must reproduce byte for byte."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from protocol import (
    f32_list,
    i32_list,
    pack_f32,
    pack_i32,
    pack_u8,
    unpack_f32,
    unpack_i32,
    unpack_u8,
)
from protocol.packed import count_i32


def test_int32_layout_is_little_endian() -> None:
    assert pack_i32([1]) == b"\x01\x00\x00\x00"
    assert pack_i32([-1]) == b"\xff\xff\xff\xff"
    assert pack_i32([151644, 2]) == b"\x5c\x50\x02\x00\x02\x00\x00\x00"
    assert pack_i32([2**31 - 1, -(2**31)]) == struct.pack("<2i", 2**31 - 1, -(2**31))


def test_float32_layout_is_little_endian() -> None:
    assert pack_f32([-1.0]) == b"\x00\x00\x80\xbf"
    assert pack_f32([0.5, -0.25]) == struct.pack("<2f", 0.5, -0.25)


def test_uint8_mask_layout() -> None:
    assert pack_u8([1, 0, 1, 1]) == b"\x01\x00\x01\x01"


@pytest.mark.parametrize("ids", [[], [0], [1, 2, 3], [-(2**31), 2**31 - 1, 151_645]])
def test_int32_round_trip(ids: list[int]) -> None:
    data = pack_i32(ids)
    assert len(data) == 4 * len(ids) == 4 * count_i32(data)
    assert unpack_i32(data).tolist() == i32_list(data) == ids


@pytest.mark.parametrize("values", [[], [0.0], [-0.5, -1.25, -30.0], [float("-inf")]])
def test_float32_round_trip(values: list[float]) -> None:
    data = pack_f32(values)
    assert len(data) == 4 * len(values)
    assert unpack_f32(data).tolist() == f32_list(data) == values


def test_float32_rounds_float64_input() -> None:
    (value,) = f32_list(pack_f32([0.1]))
    assert value == float(np.float32(0.1))


def test_uint8_round_trip() -> None:
    assert unpack_u8(pack_u8([0, 1, 1, 0])).tolist() == [0, 1, 1, 0]


def test_numpy_input_of_any_dtype_and_order() -> None:
    big_endian = np.array([1, 2, 3], dtype=">i8")
    assert pack_i32(big_endian) == pack_i32([1, 2, 3])
    assert pack_f32(np.array([0.5], dtype=np.float64)) == pack_f32([0.5])


def test_bytes_input_passes_through_when_whole() -> None:
    data = b"\x01\x00\x00\x00\x02\x00\x00\x00"
    assert pack_i32(data) is data
    assert pack_f32(data) is data
    assert pack_u8(b"\x01") == b"\x01"


@pytest.mark.parametrize("length", [1, 2, 3, 5, 7])
def test_bytes_input_with_bad_length(length: int) -> None:
    with pytest.raises(ValueError, match=f"{length} bytes"):
        pack_i32(b"\x00" * length)
    with pytest.raises(ValueError):
        pack_f32(b"\x00" * length)


def test_unpack_is_zero_copy_and_read_only() -> None:
    data = pack_i32(range(1000))
    for array in (unpack_i32(data), unpack_f32(data), unpack_u8(data)):
        assert np.shares_memory(array, np.frombuffer(data, dtype=np.uint8))
        assert not array.flags.writeable
        assert array.dtype.byteorder in ("<", "|", "=")
    assert unpack_i32(data).dtype == np.dtype("<i4")
    assert unpack_f32(data).dtype == np.dtype("<f4")


def test_unpack_memoryview_slice_is_zero_copy() -> None:
    data = pack_i32([5, 6, 7, 8])
    view = memoryview(data)[4:12]
    array = unpack_i32(view)  # type: ignore[arg-type]
    assert array.tolist() == [6, 7]
    assert np.shares_memory(array, np.frombuffer(data, dtype=np.uint8))
