"""Golden fixtures: bytes written once per v1 message type must decode forever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from protocol import ANY, MESSAGE_TYPES, PROTOCOL_VERSION, Codec, Message
from tests.golden import make_fixtures
from tests.golden.examples import examples

FIXTURES = Path(__file__).resolve().parents[1] / "golden" / f"v{PROTOCOL_VERSION}"
EXAMPLES = examples()


def fixture(tag: str) -> bytes:
    return (FIXTURES / f"{tag}.msgpack").read_bytes()


def fixture_tags() -> list[str]:
    return sorted(path.stem for path in FIXTURES.glob("*.msgpack"))


def test_every_message_type_has_a_fixture() -> None:
    missing = sorted(set(MESSAGE_TYPES) - set(fixture_tags()))
    assert not missing, f"run tests/golden/make_fixtures.py to add fixtures for {missing}"


def test_every_fixture_is_a_known_message_type() -> None:
    assert sorted(set(fixture_tags()) - set(MESSAGE_TYPES)) == []
    # Each fixture is its bytes plus their JSON form (docs/protocol.md §12.1), nothing else.
    assert all(path.suffix in {".msgpack", ".json"} for path in FIXTURES.iterdir())


def test_make_fixtures_writes_the_same_directory() -> None:
    assert make_fixtures.FIXTURES == FIXTURES


@pytest.mark.parametrize("tag", fixture_tags())
def test_fixture_decodes_to_the_example_with_its_own_codec(tag: str) -> None:
    codec: Codec[Message] = Codec(MESSAGE_TYPES[tag])
    assert codec.decode(fixture(tag)) == EXAMPLES[tag]


@pytest.mark.parametrize("tag", fixture_tags())
def test_fixture_decodes_to_the_example_with_any(tag: str) -> None:
    decoded = ANY.decode(fixture(tag))
    assert type(decoded) is MESSAGE_TYPES[tag]
    assert decoded == EXAMPLES[tag]


@pytest.mark.parametrize("tag", fixture_tags())
def test_fixture_is_a_plain_msgpack_map(tag: str) -> None:
    value = msgpack.unpackb(fixture(tag), raw=False)
    assert value["type"] == tag
    assert value["v"] == PROTOCOL_VERSION


def covers(new: Any, old: Any) -> bool:
    """``new`` holds everything ``old`` holds, with the same values; maps may have gained keys."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and covers(new[k], v) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(map(covers, new, old))
    return type(new) is type(old) and new == old


@pytest.mark.parametrize("tag", fixture_tags())
def test_writers_still_write_every_fixture_field(tag: str) -> None:
    # Additive evolution: a field may be added, never renamed, removed or retyped.
    old = msgpack.unpackb(fixture(tag), raw=False)
    new = msgpack.unpackb(ANY.encode(EXAMPLES[tag]), raw=False)
    assert covers(new, old)


def test_make_fixtures_never_overwrites(tmp_path: Path) -> None:
    written, skipped = make_fixtures.write_fixtures(tmp_path)
    assert sorted(path.stem for path in written) == sorted(MESSAGE_TYPES)
    assert skipped == []
    for tag in MESSAGE_TYPES:
        assert ANY.decode((tmp_path / f"{tag}.msgpack").read_bytes()) == EXAMPLES[tag]

    sentinel = tmp_path / "task.msgpack"
    sentinel.write_bytes(b"do not touch")
    written, skipped = make_fixtures.write_fixtures(tmp_path)
    assert written == []
    assert sorted(path.stem for path in skipped) == sorted(MESSAGE_TYPES)
    assert sentinel.read_bytes() == b"do not touch"


def test_make_fixtures_main_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each tag gets its .msgpack and its .json.
    assert make_fixtures.main(tmp_path) == 0
    assert capsys.readouterr().out.count("wrote") == 2 * len(MESSAGE_TYPES)
    assert make_fixtures.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert "wrote" not in out
    assert out.count("skipped") == 2 * len(MESSAGE_TYPES)
