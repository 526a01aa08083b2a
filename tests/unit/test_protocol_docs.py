"""docs/protocol.md describes the protocol as the code defines it, leaving nothing out."""

from __future__ import annotations

import inspect
import re
from enum import StrEnum
from pathlib import Path

import msgspec
import pytest

from protocol import MESSAGE_TYPES, TIERS, headers, messages, streams, subjects
from protocol.errors import ErrorCode

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
RECORDS = sorted(messages.Record.__subclasses__(), key=lambda cls: cls.__name__)
ENUMS = sorted(
    {
        value
        for _, value in inspect.getmembers(messages, inspect.isclass)
        if issubclass(value, StrEnum)
    }
    - {StrEnum},
    key=lambda cls: cls.__name__,
)
# A table cell boundary; `\|` inside a cell (as in `str \| nil`) is an escaped pipe.
CELL = re.compile(r"(?<!\\)\|")


def section(name: str) -> str:
    """The text under the ``#### <name> (...)`` heading, up to the next heading."""
    match = re.search(rf"^#### {name} \(.*?\)\n(.*?)(?=^#)", DOC, re.MULTILINE | re.DOTALL)
    assert match, f"docs/protocol.md has no '#### {name} (...)' section"
    return match.group(1)


def documented_fields(name: str) -> dict[str, str]:
    """Field name -> default column of the section's table."""
    rows = [CELL.split(line)[1:-1] for line in section(name).splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): cells[2].strip() for cells in rows}


@pytest.mark.parametrize("tag", sorted(MESSAGE_TYPES))
def test_every_message_has_a_section(tag: str) -> None:
    assert f"#### {MESSAGE_TYPES[tag].__name__} (`{tag}`)" in DOC


@pytest.mark.parametrize("cls", [*MESSAGE_TYPES.values(), *RECORDS], ids=lambda cls: cls.__name__)
def test_every_field_is_documented_with_its_default(cls: type[msgspec.Struct]) -> None:
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls) if f.encode_name != "v"}
    documented = documented_fields(cls.__name__)
    assert set(documented) == set(fields)
    for name, field in fields.items():
        assert (documented[name] == "required") == field.required, name


@pytest.mark.parametrize("enum", [*ENUMS, ErrorCode], ids=lambda cls: cls.__name__)
def test_every_enum_value_is_documented(enum: type[StrEnum]) -> None:
    if enum is ErrorCode:
        text = DOC[DOC.index("### 10.1") :]
        assert all(f"| `{code.value}` |" in text for code in ErrorCode)
        return
    row = re.search(rf"^\| {enum.__name__} \|(.*)$", DOC, re.MULTILINE)
    assert row, enum.__name__
    assert {value.value for value in enum} <= set(re.findall(r"`([a-z_]+)`", row.group(1)))


def test_every_header_is_documented() -> None:
    names = [
        value for name, value in vars(headers).items() if name.isupper() and isinstance(value, str)
    ]
    assert names
    for name in names:
        assert f"| `{name}` |" in DOC, name


@pytest.mark.parametrize("spec", streams.ALL, ids=lambda spec: spec.name)
def test_every_stream_is_documented(spec: streams.StreamSpec) -> None:
    row = re.search(rf"^\| `{spec.name}` \| (.*)$", DOC, re.MULTILINE)
    assert row, spec.name
    assert all(f"`{subject}`" in row.group(1) for subject in spec.subjects)
    assert f"| {spec.retention} |" in row.group(0)


#: Public functions of protocol.subjects that build no subject of their own: ``of_task``
#: is ``task`` on a Task's fields.
NOT_BUILDERS = {"token", "of_task"}


def placeholder_subjects() -> list[str]:
    """Every builder's output with its arguments shown as the doc's placeholders, with and
    without its optional arguments (a task of the default tenant and of another)."""
    args = {
        "tier": 0,
        "domain": "DOMAIN",
        "tenant": "TENANT",
        "task_id": "TASKID",
        "service": "SERVICE",
        "source": "SOURCE",
        "instance": "INSTANCE",
    }
    names = {
        "DOMAIN": "<domain>",
        "TENANT": "<tenant>",
        "TASKID": "<task_id>",
        "SERVICE": "<service>",
        "SOURCE": "<source>",
        "INSTANCE": "<instance>",
    }
    out = []
    for name, function in inspect.getmembers(subjects, inspect.isfunction):
        if function.__module__ != subjects.__name__ or name.startswith("_") or name in NOT_BUILDERS:
            continue
        params = inspect.signature(function).parameters
        required = [p for p, v in params.items() if v.default is inspect.Parameter.empty]
        for given in dict.fromkeys([tuple(params), tuple(required)]):
            subject = function(*(args[p] for p in given))
            for value, placeholder in names.items():
                subject = subject.replace(value, placeholder)
            out.append(re.sub(r"^(temper\.v1\.task)\.0(?=\.)", r"\1.<tier>", subject))
    return out


@pytest.mark.parametrize("subject", placeholder_subjects())
def test_every_subject_is_documented(subject: str) -> None:
    assert f"`{subject}`" in DOC


def test_tiers_and_limits_match() -> None:
    assert f"`0 ≤ tier ≤ {TIERS - 1}`" in DOC
    assert "1,048,576 bytes" in DOC
