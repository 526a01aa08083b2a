"""TOML text from plain data (the standard library reads TOML but does not write it).

Enough of TOML for run configs and domains configs: top-level values, tables, arrays of
tables, and inline arrays and tables below them.  ``tomllib.loads(dumps(data)) == data``
for any such data of str, int, float, bool, lists and dicts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as a TOML document: plain values first, then tables, then arrays of tables."""
    lines: list[str] = []
    plain = {k: v for k, v in data.items() if not _is_table(v) and not _is_tables(v)}
    lines += [f"{key(k)} = {value(v)}" for k, v in plain.items()]
    for name, table in data.items():
        if _is_table(table):
            lines += ["", f"[{key(name)}]"]
            lines += [f"{key(k)} = {value(v)}" for k, v in table.items()]
        elif _is_tables(table):
            for item in table:
                lines += ["", f"[[{key(name)}]]"]
                lines += [f"{key(k)} = {value(v)}" for k, v in item.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table(item: Any) -> bool:
    return isinstance(item, Mapping)


def _is_tables(item: Any) -> bool:
    return isinstance(item, list) and bool(item) and all(isinstance(i, Mapping) for i in item)


def key(name: str) -> str:
    return name if _BARE_KEY.match(name) else string(name)


def value(item: Any) -> str:
    """One value, inline."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        return _float(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, Mapping):
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + " }"
    if isinstance(item, list | tuple):
        return "[" + ", ".join(value(v) for v in item) + "]"
    raise TypeError(f"no TOML form for {type(item).__name__}: {item!r}")


def _float(item: float) -> str:
    if math.isnan(item):
        return "nan"
    if math.isinf(item):
        return "inf" if item > 0 else "-inf"
    text = repr(item)
    # TOML floats need a fraction or an exponent: repr(1.0) is "1.0", but repr(1e16) is "1e+16".
    return text if any(c in text for c in ".en") else text + ".0"


def string(text: str) -> str:
    """A basic string: JSON's escapes are TOML's, except that DEL must be escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
