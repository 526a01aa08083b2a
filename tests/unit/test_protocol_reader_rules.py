"""The reader rules of docs/protocol.md §2.2 on odd input, as the reference reader keeps them:
trailing bytes, invalid UTF-8, repeated keys, extension types, keys that are not strings,
nesting.  Each test names the rule's words on the page, so page and reader change together."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgpack
import msgspec
import pytest

from protocol import ANY, Codec, DecodeError, ErrorCode
from protocol.messages import StatusRequest, Task
from tests.unit.test_protocol_docs import DOC

TASK = Codec(Task)
FIELDS: dict[str, Any] = {
    "type": "task",
    "v": 1,
    "id": "t1",
    "domain": "math",
    "prompt": [{"role": "user", "content": "x"}],
}


def pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def packed_map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A map from already packed keys and values (repeats and odd keys allowed)."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(key + value for key, value in pairs)


def task_with(*extra: tuple[bytes, bytes]) -> bytes:
    return packed_map([(pack(k), pack(v)) for k, v in FIELDS.items()] + list(extra))


def error_of(codec: Codec[Any], data: bytes) -> tuple[ErrorCode, str | None]:
    with pytest.raises(DecodeError) as caught:
        codec.decode(data)
    return caught.value.code, caught.value.field


BAD_UTF8 = b"\xa2\xff\xfe"  # str(2) holding bytes that are no UTF-8


# ---------------------------------------------------------------- rule 5: one value, first


@pytest.mark.parametrize(
    "data",
    [
        b"\x01\x02",  # an int, then a stray byte
        b"\xa1a\xa1b",  # a str, then another
        b"\x91\x01\x01",  # an array, then a stray byte
        task_with((pack("n"), pack("x"))) + b"\x01",  # a map that is wrong, then a byte
        pack({**FIELDS, "v": 2}) + b"\x01",  # another version, then a byte
    ],
)
def test_anything_followed_by_trailing_bytes_is_not_msgpack(data: bytes) -> None:
    assert "`01 02` (an int, then a stray byte) is `not_msgpack`, not `validation`" in DOC
    for codec in (ANY, TASK, Codec(StatusRequest)):
        assert error_of(codec, data) == (ErrorCode.NOT_MSGPACK, None)


@pytest.mark.parametrize("data", [b"\x01", b"\xa1a", b"\x91\x01"])
def test_one_value_that_is_not_a_map_is_a_validation_error(data: bytes) -> None:
    for codec in (ANY, TASK):
        assert error_of(codec, data) == (ErrorCode.VALIDATION, "$")


# ---------------------------------------------------------------- rule 7: UTF-8


def test_the_page_states_what_invalid_utf8_does() -> None:
    assert "A str that is not valid UTF-8 where the reader reads it" in DOC
    assert "invalid UTF-8 or an extension type under an unknown key is accepted and dropped" in DOC


@pytest.mark.parametrize(
    "extra",
    [
        (pack("domain"), BAD_UTF8),  # a field (repeated: read last)
        (pack("metadata"), packed_map([(pack("k"), BAD_UTF8)])),  # a value in an `any` map
        (pack("metadata"), packed_map([(BAD_UTF8, pack(1))])),  # a key in an `any` map
    ],
)
def test_invalid_utf8_where_the_reader_reads_is_not_msgpack(extra: tuple[bytes, bytes]) -> None:
    assert error_of(TASK, task_with(extra)) == (ErrorCode.NOT_MSGPACK, None)


@pytest.mark.parametrize("extra", [(pack("note"), BAD_UTF8), (BAD_UTF8, pack(1))])
def test_invalid_utf8_under_an_unknown_key_is_dropped(extra: tuple[bytes, bytes]) -> None:
    assert TASK.decode(task_with(extra)) == TASK.decode(pack(FIELDS))


# ---------------------------------------------------------------- rule 8: repeated keys


def test_a_repeated_field_keeps_the_last_and_checks_each() -> None:
    assert "keeps the **last**; in a `map` or `any`\n   field it keeps the last value too" in DOC
    assert TASK.decode(task_with((pack("domain"), pack("code")))).domain == "code"
    # Either occurrence failing is an error at its path, whichever comes last.
    assert error_of(TASK, task_with((pack("id"), pack(5)))) == (ErrorCode.VALIDATION, "$.id")
    first_bad = packed_map(
        [(pack("id"), pack(5))] + [(pack(k), pack(v)) for k, v in FIELDS.items()]
    )
    assert error_of(TASK, first_bad) == (ErrorCode.VALIDATION, "$.id")


def test_a_repeated_key_in_an_any_map_keeps_the_last() -> None:
    twice = packed_map([(pack("a"), pack(1)), (pack("a"), pack(2))])
    assert TASK.decode(task_with((pack("metadata"), twice))).metadata == {"a": 2}


# ---------------------------------------------------------------- rule 9: extension types

EXT = msgpack.ExtType(5, b"abc")


def test_the_page_states_what_extension_types_do() -> None:
    assert "In a typed field an\n   extension value is `validation` at that field" in DOC
    assert "(1.001234567 s comes back as 1.001235 s)" in DOC


@pytest.mark.parametrize("field", ["domain", "n", "created_at"])
def test_an_extension_value_in_a_typed_field_is_a_validation_error(field: str) -> None:
    data = pack({**FIELDS, field: EXT})
    assert error_of(TASK, data) == (ErrorCode.VALIDATION, f"$.{field}")


def test_an_extension_value_under_an_unknown_key_is_dropped() -> None:
    data = pack({**FIELDS, "note": EXT, "when": msgpack.Timestamp(1, 0)})
    assert TASK.decode(data) == TASK.decode(pack(FIELDS))


def test_an_extension_value_in_an_any_field_travels_on() -> None:
    data = pack({**FIELDS, "metadata": {"e": EXT, "t": msgpack.Timestamp(1, 1_234_567)}})
    task = TASK.decode(data)
    assert task.metadata["t"] == datetime(1970, 1, 1, 0, 0, 1, 1235, tzinfo=UTC)
    again = msgpack.unpackb(TASK.encode(task), raw=False)["metadata"]
    assert again["e"] == EXT
    assert again["t"] == msgpack.Timestamp(1, 1_235_000)


# ---------------------------------------------------------------- keys and nesting


@pytest.mark.parametrize("key", [pack(5), pack(b"id"), pack(EXT)])
def test_a_key_that_is_not_a_str_is_a_validation_error_at_the_map(key: bytes) -> None:
    assert "A key that is not a str\n   is `validation` at the path of the map" in DOC
    assert error_of(TASK, task_with((key, pack(1)))) == (ErrorCode.VALIDATION, "$")


def test_nesting_too_deep_is_a_validation_error_even_under_an_unknown_key() -> None:
    assert "Nesting deeper than the reader can follow is `validation` at `$`" in DOC
    deep = b"\x91" * 5000 + b"\xc0"
    assert error_of(TASK, task_with((pack("note"), deep))) == (ErrorCode.VALIDATION, "$")
    shallow = b"\x91" * 100 + b"\xc0"
    assert TASK.decode(task_with((pack("note"), shallow))) == TASK.decode(pack(FIELDS))


def test_a_missing_v_reads_as_one() -> None:
    assert "it treats a missing `v` as `1`" in DOC
    fields = {k: v for k, v in FIELDS.items() if k != "v"}
    assert TASK.decode(pack(fields)).v == 1
    assert msgspec.structs.asdict(TASK.decode(pack(fields))) == msgspec.structs.asdict(
        TASK.decode(pack(FIELDS))
    )
