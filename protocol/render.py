"""Messages as JSON-friendly data, with packed arrays shown as numbers (for people and tools)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from protocol.packed import f32_list, i32_list, unpack_u8

#: Packed fields of the protocol's structs, by field name: how to unpack them, item size.
_PACKED: Final[dict[str, tuple[Callable[[bytes], list[Any]], int]]] = {
    "tokens": (i32_list, 4),
    "prompt_tokens": (i32_list, 4),
    "logprobs": (f32_list, 4),
    "loss_mask": (lambda data: unpack_u8(data).tolist(), 1),
}


def to_view(message: msgspec.Struct) -> Any:
    """Builtins (dicts, lists, str, numbers); packed arrays unpacked; other bytes as base64.

    Only struct fields are unpacked: bytes in free-form maps (``metadata``, ``files``) stay
    base64 whatever their key.
    """
    return _view(message)


def _view(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return _struct(value)
    if isinstance(value, list | tuple):
        return [_view(item) for item in value]
    if isinstance(value, dict):
        return {msgspec.to_builtins(key): _view(item) for key, item in value.items()}
    return msgspec.to_builtins(value)


def _struct(value: msgspec.Struct) -> dict[str, Any]:
    config = value.__struct_config__
    out: dict[str, Any] = {}
    if config.tag_field is not None:
        out[config.tag_field] = config.tag
    for field in msgspec.structs.fields(value):
        item = getattr(value, field.name)
        packed = _PACKED.get(field.name)
        if packed is not None and isinstance(item, bytes) and len(item) % packed[1] == 0:
            out[field.encode_name] = packed[0](item)
        else:
            out[field.encode_name] = _view(item)
    return out
