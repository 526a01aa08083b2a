"""Write the v1 golden fixtures: ``tests/golden/v1/<tag>.msgpack``, one per message type.

Run ``python tests/golden/make_fixtures.py`` after adding a message type (and its
entry in ``examples.py``).  Existing fixtures are never overwritten: they record
what v1 looked like on the wire, and readers must keep decoding them forever.

Beside each fixture goes ``<tag>.json``, its decoded value in the language-neutral
form of docs/protocol.md §12.1, made from the ``.msgpack`` bytes on disk (not from
``examples.py``), so it always describes what the fixture holds.  A missing one is
written; an existing one is left alone (the tests compare it with the bytes).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    # Run as a script, only this file's folder is on the path; the imports need the repository root.
    sys.path.insert(0, str(ROOT))

from protocol import ANY, MESSAGE_TYPES  # noqa: E402
from tests.golden.examples import examples  # noqa: E402
from tests.golden.fixture_json import fixture_json_text  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "v1"


def fixture_path(directory: Path, tag: str) -> Path:
    return directory / f"{tag}.msgpack"


def json_path(directory: Path, tag: str) -> Path:
    return directory / f"{tag}.json"


def encoded_examples() -> dict[str, bytes]:
    """Every example encoded, after checking it covers every tag and survives a round trip."""
    values = examples()
    missing = sorted(set(MESSAGE_TYPES) - set(values))
    if missing:
        raise SystemExit(f"examples.py has no example for: {', '.join(missing)}")
    encoded = {}
    for tag, message in values.items():
        data = ANY.encode(message)
        if ANY.decode(data) != message:
            raise SystemExit(f"example {tag!r} does not survive encode -> decode")
        encoded[tag] = data
    return encoded


def write_new(files: dict[Path, bytes]) -> tuple[list[Path], list[Path]]:
    """Write each file that does not exist yet; return (written, skipped)."""
    written: list[Path] = []
    skipped: list[Path] = []
    for path, data in files.items():
        try:
            # "x" fails if the file exists, so a fixture can never be replaced, even by a race.
            with path.open("xb") as file:
                file.write(data)
        except FileExistsError:
            skipped.append(path)
            continue
        written.append(path)
    return written, skipped


def write_fixtures(directory: Path) -> tuple[list[Path], list[Path]]:
    """Write missing fixtures; return (written, skipped)."""
    directory.mkdir(parents=True, exist_ok=True)
    encoded = sorted(encoded_examples().items())
    return write_new({fixture_path(directory, tag): data for tag, data in encoded})


def write_json(directory: Path) -> tuple[list[Path], list[Path]]:
    """Write the missing ``.json`` of every fixture in ``directory``; return (written, skipped)."""
    return write_new(
        {
            json_path(directory, fixture.stem): fixture_json_text(
                fixture.stem, fixture.read_bytes()
            ).encode()
            for fixture in sorted(directory.glob("*.msgpack"))
        }
    )


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(directory: Path = FIXTURES) -> int:
    written, skipped = write_fixtures(directory)
    json_written, json_skipped = write_json(directory)
    written += json_written
    skipped += json_skipped
    for path in written:
        print(f"wrote   {shown(path)} ({path.stat().st_size} bytes)")
    for path in skipped:
        print(f"skipped {shown(path)} (exists; golden fixtures never change)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
