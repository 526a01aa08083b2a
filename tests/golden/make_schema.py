"""Write ``docs/protocol.schema.json`` from the protocol's message types.

Run ``python tests/golden/make_schema.py`` after changing ``protocol/messages.py``;
``--check`` writes nothing and exits 1 when the committed file is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    # Run as a script, only this file's folder is on the path; the imports need the repository root.
    sys.path.insert(0, str(ROOT))

from protocol.schema import schema_text  # noqa: E402

SCHEMA = ROOT / "docs" / "protocol.schema.json"


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
