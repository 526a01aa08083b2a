"""The golden fixtures' JSON form (docs/protocol.md §12.1) says what their bytes hold."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
import pytest

from protocol import ANY, MESSAGE_TYPES, AnyMessage
from tests.golden.examples import examples
from tests.golden.fixture_json import fixture_json_text, resolve, wire_value
from tests.golden.make_fixtures import FIXTURES, write_json

EXAMPLES = examples()
TAGS = sorted(path.stem for path in FIXTURES.glob("*.msgpack"))


def document(tag: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{tag}.json").read_text(encoding="utf-8"))
    return loaded


def fixture(tag: str) -> bytes:
    return (FIXTURES / f"{tag}.msgpack").read_bytes()


def holds_bytes(value: Any) -> bool:
    if isinstance(value, dict):
        return any(holds_bytes(item) for item in value.values())
    if isinstance(value, list):
        return any(holds_bytes(item) for item in value)
    return isinstance(value, bytes)


def test_every_fixture_has_its_json_and_nothing_else_does() -> None:
    assert sorted(path.stem for path in FIXTURES.glob("*.json")) == TAGS == sorted(MESSAGE_TYPES)


@pytest.mark.parametrize("tag", TAGS)
def test_json_is_made_from_the_fixture_bytes(tag: str) -> None:
    assert (FIXTURES / f"{tag}.json").read_text(encoding="utf-8") == fixture_json_text(
        tag, fixture(tag)
    )


@pytest.mark.parametrize("tag", TAGS)
def test_json_gives_the_wire_bytes_back(tag: str) -> None:
    # Lossless: bins restored, a plain msgpack writer reproduces the fixture byte for byte.
    assert msgpack.packb(wire_value(document(tag)), use_bin_type=True) == fixture(tag)


@pytest.mark.parametrize("tag", TAGS)
def test_json_decodes_to_the_example_with_the_codec(tag: str) -> None:
    decoded = ANY.decode(msgpack.packb(wire_value(document(tag)), use_bin_type=True))
    assert decoded == ANY.decode(fixture(tag)) == EXAMPLES[tag]
    assert msgspec.convert(wire_value(document(tag)), MESSAGE_TYPES[tag]) == EXAMPLES[tag]


@pytest.mark.parametrize("tag", TAGS)
def test_value_reads_as_schema_typed_json(tag: str) -> None:
    # In typed fields a base64 string is bytes, as the schema says (contentEncoding base64).
    text = json.dumps(document(tag)["value"]).encode()
    typed = msgspec.json.decode(text, type=AnyMessage)
    assert msgspec.to_builtins(typed) == msgspec.to_builtins(ANY.decode(fixture(tag)))


@pytest.mark.parametrize("tag", TAGS)
def test_bin_pointers_name_exactly_the_bins(tag: str) -> None:
    plain = msgpack.unpackb(fixture(tag), raw=False)
    pointers = document(tag)["bin"]
    for where in pointers:
        container, key = resolve(plain, where)
        assert isinstance(container[key], bytes), where
        container[key] = base64.b64encode(container[key]).decode()
    assert not holds_bytes(plain), "a bin that no pointer names"


@pytest.mark.parametrize("tag", TAGS)
def test_packed_values_are_the_unpacked_bins(tag: str) -> None:
    doc = document(tag)
    plain = msgpack.unpackb(fixture(tag), raw=False)
    assert set(doc["packed"]) <= set(doc["bin"])
    for where, layout in doc["packed"].items():
        container, key = resolve(plain, where)
        assert np.frombuffer(container[key], dtype=layout["dtype"]).tolist() == layout["values"]


def test_packed_arrays_are_listed_where_messages_carry_them() -> None:
    assert set(document("rollout")["packed"]) == {
        "/tokens",
        "/logprobs",
        "/loss_mask",
        "/task/prompt_tokens",
    }
    assert "/items/1/rollout/tokens" in document("batch")["packed"]
    assert document("rollout")["packed"]["/tokens"]["values"][0] == 151644


def test_write_json_fills_gaps_and_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "task.msgpack").write_bytes(fixture("task"))
    (tmp_path / "error.msgpack").write_bytes(fixture("error"))
    (tmp_path / "error.json").write_text("keep")
    written, skipped = write_json(tmp_path)
    assert [p.name for p in written] == ["task.json"]
    assert [p.name for p in skipped] == ["error.json"]
    assert (tmp_path / "error.json").read_text() == "keep"
    assert (tmp_path / "task.json").read_text() == fixture_json_text("task", fixture("task"))
