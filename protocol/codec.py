"""MessagePack codec with typed errors.

One :class:`Codec` is built per message type (or tagged union) and reused: the
msgspec decoder is compiled once.  Decoding never raises anything but
:class:`~protocol.errors.DecodeError` (or its subclass ``VersionError``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import msgspec

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
        return message

    def _explain(
        self, data: bytes | bytearray | memoryview, error: msgspec.ValidationError
    ) -> DecodeError:
        try:
            envelope = _envelope_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            envelope = _Envelope()
        if envelope.v is not None and envelope.v != PROTOCOL_VERSION:
            return VersionError(envelope.v, PROTOCOL_VERSION)
        if isinstance(envelope.type, str) and envelope.type not in MESSAGE_TYPES:
            return DecodeError(
                f"unknown message type {envelope.type!r}",
                code=ErrorCode.UNKNOWN_TYPE,
                field="$.type",
            )
        path, message = field_path(error)
        return DecodeError(
            f"invalid message: {message} (at {path})", code=ErrorCode.VALIDATION, field=path
        )


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
