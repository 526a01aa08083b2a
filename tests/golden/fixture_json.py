"""A golden fixture's decoded value as JSON, under the convention of docs/protocol.md §12.1.

``<tag>.json`` beside ``<tag>.msgpack`` holds:

* ``value``: the msgpack map as a plain msgpack library decodes it, keys in wire order,
  every ``bin`` written as a base64 string (RFC 4648, with padding);
* ``bin``: a JSON Pointer (RFC 6901) to every place that holds a ``bin`` on the wire,
  since JSON cannot tell those base64 strings from text;
* ``packed``: for every packed-array field, its pointer, element layout and elements
  as JSON numbers.

Together they give the wire bytes back exactly: restore the bins, encode the map.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import msgpack
import msgspec
import numpy as np

from protocol import ANY
from protocol.schema import PACKED

#: Where the convention is written down, named in every file.
CONVENTION = "docs/protocol.md#121-json-form-of-the-fixtures"


def pointer(parts: list[str | int]) -> str:
    """RFC 6901 JSON Pointer of ``parts`` (``~`` and ``/`` escaped)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def bin_pointers(value: Any, parts: list[str | int] | None = None) -> Iterator[str]:
    """Every place in a plain-decoded msgpack value that holds bytes, in document order."""
    parts = parts or []
    if isinstance(value, bytes):
        yield pointer(parts)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from bin_pointers(item, [*parts, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from bin_pointers(item, [*parts, index])


def jsonable(value: Any) -> Any:
    """The plain-decoded value with every bytes value as base64 text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [jsonable(item) for item in value]
    return value


def packed_arrays(value: Any, parts: list[str | int] | None = None) -> Iterator[tuple[str, Any]]:
    """(pointer, layout with elements) of every packed-array field in a decoded message."""
    parts = parts or []
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from packed_arrays(item, [*parts, index])
        return
    if not isinstance(value, msgspec.Struct):
        return
    for field in value.__struct_fields__:
        item = getattr(value, field)
        layout = PACKED.get((type(value), field))
        if layout is None:
            yield from packed_arrays(item, [*parts, field])
            continue
        elements = np.frombuffer(item, dtype=layout.dtype).tolist()
        yield pointer([*parts, field]), {**layout.describe(), "values": elements}


def fixture_json(tag: str, data: bytes) -> dict[str, Any]:
    """The JSON document describing fixture bytes ``data`` of message type ``tag``."""
    plain = msgpack.unpackb(data, raw=False)
    return {
        "type": tag,
        "convention": CONVENTION,
        "msgpack": f"{tag}.msgpack",
        "size": len(data),
        "value": jsonable(plain),
        "bin": list(bin_pointers(plain)),
        "packed": dict(packed_arrays(ANY.decode(data))),
    }


def fixture_json_text(tag: str, data: bytes) -> str:
    text = msgspec.json.format(msgspec.json.encode(fixture_json(tag, data)), indent=2)
    return text.decode() + "\n"


def resolve(document: Any, where: str) -> tuple[Any, str | int]:
    """(container, key) that pointer ``where`` names inside ``document``."""
    keys = [part.replace("~1", "/").replace("~0", "~") for part in where.split("/")[1:]]
    container = document
    for key in keys[:-1]:
        container = container[int(key) if isinstance(container, list) else key]
    last = keys[-1]
    return container, int(last) if isinstance(container, list) else last


def wire_value(document: dict[str, Any]) -> Any:
    """The plain msgpack value a fixture's JSON describes: its ``value`` with the bins restored."""
    value = msgspec.json.decode(msgspec.json.encode(document["value"]))
    for where in document["bin"]:
        container, key = resolve(value, where)
        container[key] = base64.b64decode(container[key], validate=True)
    return value
