"""docs/protocol.schema.json is what the message types say, packed fields included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol import MESSAGE_TYPES, messages
from protocol.messages import ErrorEvent, SandboxExec
from protocol.schema import PACKED, PACKED_KEYWORD, schema
from tests.golden import make_schema

SCHEMA = json.loads(make_schema.SCHEMA.read_text(encoding="utf-8"))
#: Bytes fields that hold opaque bytes (input, rejected payloads), not packed arrays.
OPAQUE: set[tuple[type[msgspec.Struct], str]] = {(SandboxExec, "stdin"), (ErrorEvent, "original")}


def structs() -> list[type[msgspec.Struct]]:
    return [*MESSAGE_TYPES.values(), *messages.Record.__subclasses__()]


def test_the_committed_schema_is_what_the_code_generates() -> None:
    assert make_schema.SCHEMA.read_text(encoding="utf-8") == make_schema.schema_text(), (
        "run python tests/golden/make_schema.py"
    )


def test_every_message_type_is_in_the_union_by_its_tag() -> None:
    mapping = SCHEMA["discriminator"]["mapping"]
    assert SCHEMA["discriminator"]["propertyName"] == "type"
    assert mapping == {tag: f"#/$defs/{cls.__name__}" for tag, cls in MESSAGE_TYPES.items()}
    for tag, cls in MESSAGE_TYPES.items():
        definition = SCHEMA["$defs"][cls.__name__]
        assert definition["properties"]["type"]["enum"] == [tag]
        assert definition["properties"]["type"]["default"] == tag
        assert definition["properties"]["v"]["const"] == 1


def test_every_bytes_field_is_declared_packed_or_opaque() -> None:
    for cls in structs():
        for field in msgspec.structs.fields(cls):
            if field.type is bytes:
                assert ((cls, field.name) in PACKED) != ((cls, field.name) in OPAQUE), (
                    f"{cls.__name__}.{field.name}: add it to protocol.schema.PACKED or OPAQUE here"
                )


@pytest.mark.parametrize("key", list(PACKED), ids=lambda key: f"{key[0].__name__}.{key[1]}")
def test_packed_fields_name_element_type_and_byte_order(key: tuple[type[Any], str]) -> None:
    cls, name = key
    prop = SCHEMA["$defs"][cls.__name__]["properties"][name]
    layout = prop[PACKED_KEYWORD]
    assert prop["contentEncoding"] == "base64"
    assert layout["dtype"] == PACKED[key].dtype.str
    assert layout["itemSize"] == PACKED[key].dtype.itemsize
    assert layout["byteOrder"] in {"little", "none"}
    assert layout["element"] in {"int32", "float32", "uint8"}


def test_opaque_bytes_fields_carry_no_layout() -> None:
    for cls, name in OPAQUE:
        assert PACKED_KEYWORD not in SCHEMA["$defs"][cls.__name__]["properties"][name]


def test_schema_is_a_2020_12_document() -> None:
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_check_mode_reports_a_stale_file_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "protocol.schema.json"
    path.write_text("{}\n")
    assert make_schema.main(["--check"], path) == 1
    assert path.read_text() == "{}\n"
    assert make_schema.main([], path) == 0
    assert path.read_text() == make_schema.schema_text()
    assert make_schema.main(["--check"], path) == 0


def test_patterns_are_ecma_regexes() -> None:
    # JSON Schema patterns are ECMA-262: Python's \Z would there match a literal "Z".
    text = make_schema.SCHEMA.read_text(encoding="utf-8")
    assert "\\\\Z" not in text
    assert '"pattern": "^[A-Za-z0-9][A-Za-z0-9_\\\\-]{0,127}$"' in text
