"""Write the v1 golden fixtures: ``tests/golden/v1/<tag>.msgpack``, one per message type.

Run ``python tests/golden/make_fixtures.py`` after adding a message type (and its
entry in ``examples.py``).  Existing fixtures are never overwritten: they record
what v1 looked like on the wire, and readers must keep decoding them forever.
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

FIXTURES = Path(__file__).resolve().parent / "v1"


def fixture_path(directory: Path, tag: str) -> Path:
    return directory / f"{tag}.msgpack"


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


def write_fixtures(directory: Path) -> tuple[list[Path], list[Path]]:
    """Write missing fixtures; return (written, skipped)."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    skipped: list[Path] = []
    for tag, data in sorted(encoded_examples().items()):
        path = fixture_path(directory, tag)
        try:
            # "x" fails if the file exists, so a fixture can never be replaced, even by a race.
            with path.open("xb") as file:
                file.write(data)
        except FileExistsError:
            skipped.append(path)
            continue
        written.append(path)
    return written, skipped


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(directory: Path = FIXTURES) -> int:
    written, skipped = write_fixtures(directory)
    for path in written:
        print(f"wrote   {shown(path)} ({path.stat().st_size} bytes)")
    for path in skipped:
        print(f"skipped {shown(path)} (exists; golden fixtures never change)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
