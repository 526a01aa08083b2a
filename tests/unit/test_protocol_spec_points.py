"""Points of docs/protocol.md a client could otherwise guess at, held against the schema
and the code: the tag table, every field's type and default, ``type`` on read, the task's
message id, resubmission, and the JSON form's ints and floats.

The decoder's behaviour on odd input is in test_protocol_reader_rules.py; what a running
service does (reply headers, resubmission against real streams) in
tests/integration/test_protocol_spec_points.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema  # through kubernetes-validate, a dev dependency
import msgpack
import msgspec
import pytest

from protocol import ANY, MESSAGE_TYPES, Codec, DecodeError, ErrorCode, headers_size
from protocol.client import task_msg_id
from protocol.messages import ChatMessage, Segment, StatusRequest, Task, rollout_id
from tests.golden import make_schema
from tests.golden.make_fixtures import FIXTURES
from tests.unit.test_protocol_docs import CELL, DOC, RECORDS, section

SCHEMA: dict[str, Any] = json.loads(make_schema.SCHEMA.read_text(encoding="utf-8"))
DEFS: dict[str, Any] = SCHEMA["$defs"]
STRUCTS = [*MESSAGE_TYPES.values(), *RECORDS]
FIXTURE_TAGS = sorted(path.stem for path in FIXTURES.glob("*.msgpack"))
TOKEN = "^[A-Za-z0-9][A-Za-z0-9_\\-]{0,127}$"
#: Packed layouts as the page writes them after ``bin``.
LAYOUTS = {("int32", "little"): "int32 LE", ("float32", "little"): "float32 LE"}


def rows(text: str) -> list[list[str]]:
    """The cells of every table row of ``text`` that starts with a code span."""
    return [
        [cell.strip() for cell in CELL.split(line)[1:-1]]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def field_rows(name: str) -> dict[str, list[str]]:
    return {cells[0].strip("`"): cells for cells in rows(section(name))}


# ---------------------------------------------------------------- the tag table


def tag_table() -> dict[str, str]:
    start = DOC.index("| tag | message | carried on |")
    table = DOC[start : DOC.index("\n\n", start)]
    return {cells[0].strip("`"): cells[1] for cells in rows(table)}


def test_the_tag_table_lists_every_message_tag_and_every_fixture() -> None:
    table = tag_table()
    assert table == {tag: cls.__name__ for tag, cls in MESSAGE_TYPES.items()}
    assert sorted(table) == FIXTURE_TAGS


# ---------------------------------------------------------------- field types and defaults


def schema_type(prop: dict[str, Any]) -> str:
    """A schema property in the page's notation (docs/protocol.md §2.2 and §4)."""
    if "anyOf" in prop:
        [inner] = [option for option in prop["anyOf"] if option != {"type": "null"}]
        return f"{schema_type(inner)} | nil"
    if "$ref" in prop:
        name = prop["$ref"].rpartition("/")[2]
        return name if "properties" in DEFS[name] else f"enum {name}"
    if "enum" in prop:
        return "str: " + " | ".join(sorted(prop["enum"]))
    kind = prop["type"]
    if kind == "string":
        return _string(prop)
    if kind in ("integer", "number"):
        return _number("int" if kind == "integer" else "float", prop)
    if kind == "array":
        return f"array<{schema_type(prop['items'])}>"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"map<str, {schema_type(values) if values else 'any'}>"
    return {"boolean": "bool"}[kind]


def _string(prop: dict[str, Any]) -> str:
    if "contentEncoding" in prop:
        layout = prop.get("x-temper-packed")
        if layout is None:
            return "bin"
        return f"bin ({LAYOUTS.get((layout['element'], layout['byteOrder']), layout['element'])})"
    pattern = prop.get("pattern")
    if pattern is None:
        return "str"
    return "str (token)" if pattern == TOKEN else "str (token or empty)"


def _number(base: str, prop: dict[str, Any]) -> str:
    low, above = prop.get("minimum"), prop.get("exclusiveMinimum")
    high, below = prop.get("maximum"), prop.get("exclusiveMaximum")
    if (base, low, below, high, above) == ("int", 0, 4, None, None):
        return "int (tier)"
    if low is not None and high is not None:
        return f"{base} {low}..{high}"
    if above is not None and high is not None:
        return f"{base} ({above}, {high}]"
    if low is not None:
        return f"{base} ≥ {low}"
    if above is not None:
        return f"{base} > {above}"
    assert high is None and below is None, prop
    return base


def page_type(cell: str) -> str:
    """A type cell in the same notation: escapes and code spans gone, enum values sorted,
    and a note on an opaque bin (``bin (PNG)``) dropped."""
    text = cell.replace("\\|", "|").replace("`", "")
    nil = text.endswith(" | nil")
    text = text.removesuffix(" | nil")
    if text.startswith("str: "):
        text = "str: " + " | ".join(sorted(v.strip() for v in text[5:].split("|")))
    note = re.fullmatch(r"bin \((.+)\)", text)
    if note and note.group(1) not in LAYOUTS.values() and note.group(1) != "uint8":
        text = "bin"
    return text + (" | nil" if nil else "")


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda cls: cls.__name__)
def test_every_fields_type_on_the_page_is_its_type_in_the_schema(cls: type[Any]) -> None:
    documented = field_rows(cls.__name__)
    for name, prop in DEFS[cls.__name__]["properties"].items():
        if name not in ("type", "v"):
            assert page_type(documented[name][1]) == schema_type(prop), f"{cls.__name__}.{name}"


def page_default(cell: str) -> object:
    if cell.startswith("`"):
        return json.loads(cell.strip("`"))
    return {"nil": None, "empty": ""}[cell]


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda cls: cls.__name__)
def test_every_default_on_the_page_is_the_schemas(cls: type[Any]) -> None:
    definition = DEFS[cls.__name__]
    documented = field_rows(cls.__name__)
    for name, prop in definition["properties"].items():
        if name in ("type", "v"):
            continue
        cell = documented[name][2]
        if cell == "required":
            assert name in definition.get("required", []), name
        elif cell.startswith("all "):
            # A record made by a default factory: every field of it has a default.
            record = prop["$ref"].rpartition("/")[2]
            assert not DEFS[record].get("required"), record
        else:
            wanted = page_default(cell)
            assert prop["default"] == wanted and type(prop["default"]) is type(wanted), name


def test_segment_kind_is_the_same_enum_on_the_page_and_in_the_schema() -> None:
    assert field_rows("Segment")["kind"][1] == "str: `gen` \\| `tool`"
    assert DEFS["Segment"]["properties"]["kind"]["enum"] == ["gen", "tool"]
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"start": 0, "end": 1, "kind": "model"}, Segment)


# ---------------------------------------------------------------- `type` on read


def wire_value(tag: str) -> dict[str, Any]:
    document = json.loads((FIXTURES / f"{tag}.json").read_text(encoding="utf-8"))
    value: dict[str, Any] = document["value"]
    return value


def test_the_page_says_who_needs_type() -> None:
    assert "a reader of one type accepts a map without it (reader\nrule 4 below)" in DOC
    assert "dispatches on\n   `type` and requires it" in DOC
    assert "its top level (any message) requires `type`, while no\nmessage's own" in DOC


def untyped_fixture(tag: str) -> bytes:
    fixture = msgpack.unpackb((FIXTURES / f"{tag}.msgpack").read_bytes(), raw=False)
    return msgpack.packb({k: v for k, v in fixture.items() if k != "type"}, use_bin_type=True)


def test_a_reader_of_one_type_accepts_a_map_without_type() -> None:
    task = ANY.decode((FIXTURES / "task.msgpack").read_bytes())
    assert Codec(Task).decode(untyped_fixture("task")) == task
    assert Codec(StatusRequest).decode(msgpack.packb({})) == StatusRequest()


def test_a_reader_of_several_types_requires_type() -> None:
    with pytest.raises(DecodeError) as caught:
        ANY.decode(untyped_fixture("task"))
    assert (caught.value.code, caught.value.field) == (ErrorCode.VALIDATION, "$.type")


def test_the_schema_requires_type_at_its_top_level_only() -> None:
    assert SCHEMA["required"] == ["type"]
    for tag, cls in MESSAGE_TYPES.items():
        definition = DEFS[cls.__name__]
        assert "type" not in definition.get("required", []), tag
        assert definition["properties"]["type"]["default"] == tag


@pytest.mark.parametrize("tag", FIXTURE_TAGS)
def test_a_fixture_without_type_is_valid_for_its_type_alone(tag: str) -> None:
    anything = jsonschema.Draft202012Validator(SCHEMA)
    alone = jsonschema.Draft202012Validator(
        {"$ref": f"#/$defs/{MESSAGE_TYPES[tag].__name__}", "$defs": DEFS}
    )
    value = wire_value(tag)
    untyped = {k: v for k, v in value.items() if k != "type"}
    anything.validate(value)
    alone.validate(value)
    alone.validate(untyped)
    assert not anything.is_valid(untyped)


# ---------------------------------------------------------------- the task's message id


def test_the_page_gives_the_clients_message_id_wherever_it_says_one() -> None:
    form = "task:<task id>:<attempt>"
    assert (
        task_msg_id(
            Task(id="ID", domain="d", prompt=[ChatMessage(role="user", content="x")], attempt=3)
        )
        == "task:ID:3"
    )
    assert f"sets `Nats-Msg-Id` to **`{form}`**" in DOC  # §7, the rule
    assert f"| Task | `{form}` | the reference client, `temper submit` |" in DOC  # §7, the table
    assert f"`Nats-Msg-Id: {form}`" in DOC  # §13, step by step
    assert 'fmt.Sprintf("task:%s:%d", taskID, 0)' in DOC  # §13, the Go client
    assert "msgId ?? `task:${task.id}:${task.attempt ?? 0}`" in DOC  # §15, the JS client
    # What the page said before in places: the bare task id.
    for stale in ("Nats-Msg-Id: <task id>`", "to the task id", '"Nats-Msg-Id", taskID)'):
        assert stale not in DOC, stale


def test_the_size_example_adds_up_with_the_message_id_a_client_sends() -> None:
    example = Task(id="task-0001", domain="d", prompt=[ChatMessage(role="user", content="x")])
    block = {
        "Nats-Msg-Id": task_msg_id(example),
        "Temper-Trace-Id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "Temper-Version": "1",
    }
    assert f"`Nats-Msg-Id: {task_msg_id(example)}`" in DOC
    assert f"= {headers_size(block)} bytes." in DOC
    assert "10 + 31 + 51 + 19 + 2 = 113 bytes" in DOC


def test_only_a_new_attempt_is_a_new_message_with_new_rollouts() -> None:
    first = Task(id="t", domain="d", prompt=[ChatMessage(role="user", content="x")])
    again = msgspec.structs.replace(first, attempt=1)
    assert task_msg_id(first) == task_msg_id(msgspec.structs.replace(first, n=4))
    assert task_msg_id(again) != task_msg_id(first)
    assert rollout_id(again.id, 0, again.attempt) != rollout_id(first.id, 0, first.attempt)
    assert "**A task gives new results\nonly with a new `attempt`**" in DOC  # §7
    assert "To run a task again, submit it with a higher `attempt`" in DOC  # §13
    assert "Resubmitting a task gives new results only with a higher `attempt`" in DOC  # §5.1


# ---------------------------------------------------------------- the JSON form's numbers


class _FloatText(float):
    """A JSON number written with a fraction or an exponent."""


def _aligned(wire: Any, read: Any, where: str) -> None:
    if isinstance(wire, dict):
        assert list(wire) == list(read), where
        for key in wire:
            _aligned(wire[key], read[key], f"{where}/{key}")
    elif isinstance(wire, list):
        for index, (item, other) in enumerate(zip(wire, read, strict=True)):
            _aligned(item, other, f"{where}/{index}")
    elif isinstance(wire, float):
        assert isinstance(read, _FloatText) and read == wire, where
    elif isinstance(wire, int) and not isinstance(wire, bool):
        assert type(read) is int and read == wire, where


def test_the_page_states_the_int_and_float_rule() -> None:
    assert "A msgpack float is always written with a fraction or an exponent" in DOC
    assert "a msgpack int never is" in DOC


@pytest.mark.parametrize("tag", FIXTURE_TAGS)
def test_the_json_form_writes_floats_with_a_fraction_and_ints_without(tag: str) -> None:
    text = (FIXTURES / f"{tag}.json").read_text(encoding="utf-8")
    read = json.loads(text, parse_float=_FloatText)["value"]
    wire = msgpack.unpackb((FIXTURES / f"{tag}.msgpack").read_bytes(), raw=False)
    _aligned(wire, read, "")


def test_some_fixture_holds_an_integral_float() -> None:
    # The rule matters where a float's value is whole: 1.0 must stay a float.
    text = "".join(path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("*.json")))
    assert re.search(r": -?\d+\.0[,\n]", text)
