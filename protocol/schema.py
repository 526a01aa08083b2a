"""The v1 messages as a JSON Schema (draft 2020-12), for clients that are not written in Python.

``docs/protocol.schema.json`` is this module's output, written by
``tests/golden/make_schema.py``; a test fails when the two disagree.  The schema
describes a message's *decoded value* in JSON form: a msgpack ``bin`` appears as a
base64 string (``contentEncoding: base64``), exactly as in the golden fixtures'
``.json`` files.  msgspec cannot tell a packed array from other bytes, so the packed
fields are named here, with their element type and byte order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from protocol.messages import PROTOCOL_VERSION, AnyMessage, Rollout, SavedTrajectory, Task
from protocol.packed import F32, I32, U8

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
#: Extension keyword on a packed field (JSON Schema ignores keywords it does not know).
PACKED_KEYWORD: Final = "x-temper-packed"


@dataclass(frozen=True, slots=True)
class Packed:
    """The layout of one packed-array field: elements back to back, no header."""

    dtype: np.dtype[Any]
    element: str

    def describe(self) -> dict[str, Any]:
        order = {"<": "little", "|": "none", "=": "little"}[self.dtype.str[0]]
        return {
            "element": self.element,
            "byteOrder": order,
            "itemSize": self.dtype.itemsize,
            "dtype": self.dtype.str,
        }


INT32: Final = Packed(I32, "int32")
FLOAT32: Final = Packed(F32, "float32")
UINT8: Final = Packed(U8, "uint8")

#: Every packed-array field: (struct, field name) -> layout.
PACKED: Final[Mapping[tuple[type[msgspec.Struct], str], Packed]] = {
    (Task, "prompt_tokens"): INT32,
    (Rollout, "tokens"): INT32,
    (Rollout, "logprobs"): FLOAT32,
    (Rollout, "loss_mask"): UINT8,
    (SavedTrajectory, "completion"): INT32,
    (SavedTrajectory, "logprobs"): FLOAT32,
    (SavedTrajectory, "loss_mask"): UINT8,
}

_DESCRIPTION: Final = (
    f"Temper wire protocol, version {PROTOCOL_VERSION}: every message type, as docs/protocol.md "
    "defines it. On the wire a message is one MessagePack map; this schema describes its "
    "decoded value in JSON form, where a msgpack bin is a base64 string (contentEncoding "
    f"base64). Fields marked {PACKED_KEYWORD} are packed arrays: elements back to back with "
    "no header, in the element type and byte order named there. Generated from protocol/"
    "messages.py by tests/golden/make_schema.py; do not edit."
)


def _mark_packed(definitions: dict[str, Any]) -> None:
    for (struct, field), packed in PACKED.items():
        prop = definitions[struct.__name__]["properties"][field]
        layout = packed.describe()
        prop[PACKED_KEYWORD] = layout
        order = "" if layout["byteOrder"] == "none" else f"{layout['byteOrder']}-endian "
        size = packed.dtype.itemsize
        prop["description"] = (
            f"Packed {packed.element} array ({order}{packed.dtype.str}), "
            f"{size} byte{'s' if size > 1 else ''} per element; msgpack bin."
        )


def _pin_version(definitions: dict[str, Any]) -> None:
    for definition in definitions.values():
        version = definition.get("properties", {}).get("v")
        if version is not None:
            version["const"] = PROTOCOL_VERSION
            version["description"] = "Protocol major version; a reader rejects any other value."


def _portable_patterns(node: Any) -> None:
    """Python's end-of-string ``\\Z`` as ECMA-262's ``$``: JSON Schema patterns are ECMA regexes.

    Without the ``m`` flag ``$`` matches only at the very end there, as ``\\Z`` does in Python.
    """
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.endswith("\\Z"):
            node["pattern"] = pattern[:-2] + "$"
        for value in node.values():
            _portable_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _portable_patterns(value)


def schema() -> dict[str, Any]:
    """The JSON Schema of every v1 message (a tagged union on ``type``)."""
    generated: dict[str, Any] = msgspec.json.schema(AnyMessage)
    _mark_packed(generated["$defs"])
    _pin_version(generated["$defs"])
    _portable_patterns(generated)
    return {
        "$schema": DIALECT,
        "$id": f"urn:temper:protocol:v{PROTOCOL_VERSION}",
        "title": f"Temper protocol v{PROTOCOL_VERSION}",
        "description": _DESCRIPTION,
        **generated,
    }


def schema_text() -> str:
    """The schema as committed: two-space indented JSON, keys in a stable order, one newline."""
    return msgspec.json.format(msgspec.json.encode(schema()), indent=2).decode() + "\n"
