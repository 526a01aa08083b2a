"""Write ``docs/protocol.schema.json`` from the protocol's message types.

Run ``python tests/golden/make_schema.py`` after changing ``protocol/messages.py``;
``--check`` writes nothing and exits 1 when the committed file is out of date.

:func:`protocol.schema.schema` gives the types as msgspec generates them; this script
adds what docs/protocol.md's reader rules say about ``type`` (§2.2, reader rule 4): a
reader of one message type accepts a map without ``type``, so no message definition
requires it, while the schema's top level, the reader of any message, does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    # Run as a script, only this file's folder is on the path; the imports need the repository root.
    sys.path.insert(0, str(ROOT))

from protocol.schema import schema as message_schema  # noqa: E402

SCHEMA = ROOT / "docs" / "protocol.schema.json"

TYPE_DESCRIPTION = (
    "The message's tag. Writers always write it. A reader of several message types "
    "requires it (the top level of this schema); a reader of this type alone accepts a "
    "map without it (docs/protocol.md section 2.2, reader rule 4)."
)


def _type_as_the_readers_take_it(document: dict[str, Any]) -> None:
    """``type`` optional in each message, its tag the default; required at the top level."""
    tags = document["discriminator"]["mapping"]
    for tag, ref in tags.items():
        definition = document["$defs"][ref.rpartition("/")[2]]
        definition["properties"]["type"] = {
            "enum": [tag],
            "default": tag,
            "description": TYPE_DESCRIPTION,
        }
        definition["required"] = [name for name in definition["required"] if name != "type"]
        if not definition["required"]:
            del definition["required"]
    document["required"] = ["type"]


def schema() -> dict[str, Any]:
    """The committed schema: the message types, with the reader rules on ``type``."""
    document = message_schema()
    _type_as_the_readers_take_it(document)
    return document


def schema_text() -> str:
    """The schema as committed: two-space indented JSON, keys in a stable order, one newline."""
    return msgspec.json.format(msgspec.json.encode(schema()), indent=2).decode() + "\n"


def main(argv: list[str] | None = None, path: Path = SCHEMA) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if it differs")
    args = parser.parse_args(argv)
    wanted = schema_text()
    current = path.read_text(encoding="utf-8") if path.exists() else None
    if current == wanted:
        print(f"{path.name} is up to date")
        return 0
    if args.check:
        print(f"{path} is out of date: run python tests/golden/make_schema.py", file=sys.stderr)
        return 1
    path.write_text(wanted, encoding="utf-8")
    print(f"wrote {path} ({len(wanted.encode())} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
