"""Typed protocol errors.

Every error carries the fields a caller needs to act on it (which field, which
limit, which version) so that services can turn it into an ``ErrorReply`` or an
``ErrorEvent`` without parsing strings.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable machine-readable error codes, shared by replies, events and dead letters."""

    NOT_MSGPACK = "not_msgpack"
    VALIDATION = "validation"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    TOO_LARGE = "too_large"
    HANDLER_FAILED = "handler_failed"
    MAX_DELIVER = "max_deliver"
    #: Samples that failed on their domain's last retry attempt (the generator's).
    RETRIES_EXHAUSTED = "retries_exhausted"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    BAD_REQUEST = "bad_request"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """Base class of everything the protocol package raises on bad data."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class DecodeError(ProtocolError):
    """Bytes could not be turned into a valid message; ``field`` is the path (``$.tokens``)."""

    def __init__(self, message: str, *, code: ErrorCode, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.code = code


class VersionError(DecodeError):
    """The message, or a message nested in it, declares a protocol major version this reader
    does not speak; ``field`` is where (``$.v``, ``$.rollout.task.v``)."""

    def __init__(self, got: object, supported: int, *, field: str = "$.v") -> None:
        # A nested message (a Rollout's task) names where it sits; the top level needs no path.
        where = "" if field == "$.v" else f" at {field}"
        super().__init__(
            f"protocol version {got!r}{where} is not supported (this reader speaks {supported})",
            code=ErrorCode.UNSUPPORTED_VERSION,
            field=field,
        )
        self.got = got
        self.supported = supported


class PayloadTooLarge(ProtocolError):
    """Payload plus headers would exceed the server's ``max_payload``."""

    code = ErrorCode.TOO_LARGE

    def __init__(self, size: int, limit: int, what: str) -> None:
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit
        self.what = what


class RemoteError(ProtocolError):
    """A service answered a request with an ``ErrorReply``."""

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.code = code


class SubjectMismatch(ProtocolError):
    """A message disagrees with the subject it came on (a task's tenant); ``field``
    names the field (``$.tenant``)."""

    code = ErrorCode.VALIDATION


class SubjectError(ProtocolError, ValueError):
    """A value cannot be used as a subject token (empty, or holds ``.``, ``*``, ``>`` or spaces)."""

    code = ErrorCode.BAD_REQUEST
