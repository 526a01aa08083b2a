"""MessagePack codec with typed errors.

One :class:`Codec` is built per message type (or tagged union) and reused: the
msgspec decoder is compiled once.  Decoding never raises anything but
:class:`~protocol.errors.DecodeError` (or its subclass ``VersionError``).

Messages nest (a ScoredRollout holds a Rollout, which holds a Task), and each carries
its own ``v``: a version error names the nested one's path (``$.rollout.task.v``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import msgspec
import msgspec.inspect as mi

from protocol.errors import DecodeError, ErrorCode, PayloadTooLarge, VersionError
from protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, AnyMessage, Message

M = TypeVar("M")

#: nats-server's default ``max_payload`` (1 MiB); the real limit comes from the server's INFO.
DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024

# A bad map key is reported as "- at `key` in `$.path`": the path is the map's.
_PATH = re.compile(r" - at (?:`key` in )?`(\$[^`]*)`$")
# A field named in the message (a missing field, or a ``__post_init__`` check) extends the path.
_FIELD_IN_MESSAGE = re.compile(r"^(?:Object missing required field )?`([A-Za-z_][A-Za-z0-9_]*)`")


class _Envelope(msgspec.Struct):
    """Just enough of any message to explain why it failed: its tag and version."""

    type: Any = None
    v: Any = None


_envelope_decoder: Final = msgspec.msgpack.Decoder(_Envelope)


def field_path(error: msgspec.ValidationError) -> tuple[str, str]:
    """(``$.path.to.field``, message without the path) of a msgspec validation error."""
    text = str(error)
    match = _PATH.search(text)
    path = match.group(1) if match else "$"
    message = text[: match.start()] if match else text
    inner = _FIELD_IN_MESSAGE.match(message)
    if inner:
        path = f"{path}.{inner.group(1)}"
    return path, message


class Codec(Generic[M]):
    """Encode and decode one message type (or a tagged union of them)."""

    def __init__(self, type_: Any) -> None:
        self.type = type_
        self._decoder: msgspec.msgpack.Decoder[M] = msgspec.msgpack.Decoder(type_)
        self._encoder = msgspec.msgpack.Encoder()
        roots = _structs_in(mi.type_info(type_))
        self._roots = tuple(info.cls for info in roots)
        self._nested: _NestedPlan = _nested_plan(roots)

    def encode(self, message: M) -> bytes:
        return self._encoder.encode(message)

    def decode(self, data: bytes | bytearray | memoryview) -> M:
        try:
            message = self._decoder.decode(data)
        except msgspec.ValidationError as error:
            raise self._explain(data, error) from None
        except msgspec.DecodeError as error:
            raise DecodeError(
                f"not valid MessagePack: {error}", code=ErrorCode.NOT_MSGPACK
            ) from None
        except RecursionError:
            # msgspec counts nesting against Python's recursion limit; deep input must not escape.
            raise DecodeError("nested too deeply", code=ErrorCode.VALIDATION, field="$") from None
        version = getattr(message, "v", PROTOCOL_VERSION)
        if version != PROTOCOL_VERSION:
            raise VersionError(version, PROTOCOL_VERSION)
        if type(message) in self._nested and not _versions_agree(message, self._nested):
            _check_nested(message, self._roots, "$", self._nested)  # raises, naming the path
        return message

    def _explain(
        self, data: bytes | bytearray | memoryview, error: msgspec.ValidationError
    ) -> DecodeError:
        malformed = _malformed(data)
        if malformed is not None:
            return malformed
        try:
            envelope = _envelope_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            envelope = _Envelope()
        if _is_other_version(envelope.v):
            return VersionError(envelope.v, PROTOCOL_VERSION)
        if isinstance(envelope.type, str) and envelope.type not in MESSAGE_TYPES:
            return DecodeError(
                f"unknown message type {envelope.type!r}",
                code=ErrorCode.UNKNOWN_TYPE,
                field="$.type",
            )
        nested = self._nested_version(data)
        if nested is not None:
            return nested
        path, message = field_path(error)
        return DecodeError(
            f"invalid message: {message} (at {path})", code=ErrorCode.VALIDATION, field=path
        )

    def _nested_version(self, data: bytes | bytearray | memoryview) -> VersionError | None:
        """As at the top level, a nested message of another version explains a failure
        better than the field it trips over (that version may have changed the field)."""
        if not self._nested:
            return None
        try:
            value = msgspec.msgpack.decode(data)
            _check_nested(value, self._roots, "$", self._nested)
        except VersionError as error:
            return error
        except (msgspec.DecodeError, RecursionError):
            return None
        return None


def _malformed(data: bytes | bytearray | memoryview) -> DecodeError | None:
    """``not_msgpack`` unless ``data`` is exactly one well-formed MessagePack value.

    The typed decoder stops at the first value that does not fit the message, so a
    non-map followed by trailing bytes would otherwise be reported as ``validation``;
    docs/protocol.md §2.2 puts ``not_msgpack`` first.  Skipped as raw bytes: strings are
    not checked here, only the structure.  Nesting too deep to skip is left to the
    explanation that follows (``validation``, wherever the typed decoder stopped).
    """
    try:
        msgspec.msgpack.decode(data, type=msgspec.Raw)
    except msgspec.DecodeError as error:
        return DecodeError(f"not valid MessagePack: {error}", code=ErrorCode.NOT_MSGPACK)
    except RecursionError:
        return None
    return None


#: Struct type -> its fields that can hold a message at some depth, as
#: (attribute, wire name, the struct types a value there can be).
_NestedPlan = dict[type, tuple[tuple[str, str, tuple[type, ...]], ...]]


def _structs_in(info: mi.Type) -> list[mi.StructType]:
    """The struct types a value of type ``info`` can be, itself or as items of an array."""
    if isinstance(info, mi.StructType):
        return [info]
    if isinstance(info, mi.Metadata):
        return _structs_in(info.type)
    if isinstance(info, mi.UnionType):
        return [found for member in info.types for found in _structs_in(member)]
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return _structs_in(info.item_type)
    # Map values are not followed: no message type holds messages in a map.
    return []


def _nested_plan(roots: list[mi.StructType]) -> _NestedPlan:
    """Where messages can sit inside values of the ``roots`` types, built once per codec."""
    plan: _NestedPlan = {}
    seen: set[type] = set()
    for info in roots:
        _plan_struct(info, plan, seen)
    return plan


def _plan_struct(info: mi.StructType, plan: _NestedPlan, seen: set[type]) -> bool:
    """Add ``info`` to ``plan`` if it can hold a message; True if it can."""
    if info.cls in seen:
        return info.cls in plan
    seen.add(info.cls)
    fields = []
    for field in info.fields:
        kinds = _structs_in(field.type)
        deeper = [_plan_struct(kind, plan, seen) for kind in kinds]
        if any(issubclass(k.cls, Message) or d for k, d in zip(kinds, deeper, strict=True)):
            fields.append((field.name, field.encode_name, tuple(k.cls for k in kinds)))
    if fields:
        plan[info.cls] = tuple(fields)
    return bool(fields)


def _check_nested(value: object, kinds: tuple[type, ...], path: str, plan: _NestedPlan) -> None:
    """Raise :class:`VersionError` for a message below ``path`` whose ``v`` is not ours.

    ``value`` is a decoded struct, or the plain maps and arrays of an undecodable one
    (then ``kinds`` tells which struct a map stands for).  The top level is not checked
    here: its version is read before anything else.
    """
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_nested(item, kinds, f"{path}[{index}]", plan)
        return
    if isinstance(value, msgspec.Struct):
        cls: type | None = type(value)
        fields: Mapping[str, object] | None = None
    elif isinstance(value, dict):
        cls, fields = _kind_of(value, kinds), value
    else:
        return
    if cls is None:
        return
    if path != "$" and issubclass(cls, Message):
        version = getattr(value, "v", None) if fields is None else fields.get("v")
        if _is_other_version(version):
            raise VersionError(version, PROTOCOL_VERSION, field=f"{path}.v")
    for name, wire, inner in plan.get(cls, ()):
        child = getattr(value, name) if fields is None else fields.get(wire)
        _check_nested(child, inner, f"{path}.{wire}", plan)


def _is_other_version(value: object) -> bool:
    """An integer ``v`` that is not ours.  A ``v`` of another type is a plain validation
    error: ``"2"``, ``2.0`` or a nested array (whose repr could be anything) is no version."""
    return isinstance(value, int) and not isinstance(value, bool) and value != PROTOCOL_VERSION


def _versions_agree(value: object, plan: _NestedPlan) -> bool:
    """Whether every message nested in a decoded ``value`` is of our version.

    :func:`_check_nested` without the paths: this runs for every message decoded, and
    building paths (or generators) would cost more than the checks.
    """
    for name, _, _ in plan.get(type(value), ()):
        child = getattr(value, name)
        for item in child if isinstance(child, list | tuple) else (child,):
            if isinstance(item, Message) and item.v != PROTOCOL_VERSION:
                return False
            if type(item) in plan and not _versions_agree(item, plan):
                return False
    return True


def _kind_of(value: dict[Any, Any], kinds: tuple[type, ...]) -> type | None:
    """Which of ``kinds`` a plain map stands for: by its tag, else the only one there is."""
    tag = value.get("type")
    for kind in kinds:
        if (
            tag is not None
            and getattr(getattr(kind, "__struct_config__", None), "tag", None) == tag
        ):
            return kind
    return kinds[0] if len(kinds) == 1 else None


#: Decodes any v1 message; for tools (``temper tail``) that do not know what a subject carries.
ANY: Final[Codec[AnyMessage]] = Codec(AnyMessage)


def encode(message: Message) -> bytes:
    """Encode any message with the shared encoder."""
    return ANY.encode(message)  # type: ignore[arg-type]


def headers_size(headers: Mapping[str, str] | None) -> int:
    """Bytes of the NATS header block: ``NATS/1.0`` line, one line a header, a blank line."""
    if not headers:
        return 0
    size = len(b"NATS/1.0\r\n") + 2
    for key, value in headers.items():
        size += len(key.encode()) + 2 + len(value.encode()) + 2
    return size


def check_size(payload: bytes, headers: Mapping[str, str] | None, max_payload: int) -> None:
    """Raise :class:`PayloadTooLarge` if payload plus headers exceed ``max_payload``.

    The server closes a connection that publishes more than its ``max_payload``,
    so an oversized message must be refused before it reaches the socket.
    """
    total = len(payload) + headers_size(headers)
    if total > max_payload:
        raise PayloadTooLarge(total, max_payload, "payload plus headers")
