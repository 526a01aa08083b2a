"""Errors a handler raises on purpose; the runtime turns them into replies or dead letters."""

from __future__ import annotations

from protocol.errors import ErrorCode


class RequestRejected(Exception):
    """Raised by a request handler to answer with a typed ``ErrorReply`` (bad request, limits)."""

    def __init__(self, code: ErrorCode, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


class Reject(Exception):
    """Raised by a stream handler for input that can never succeed: dead-letter it, no retry."""

    def __init__(self, code: ErrorCode, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


class Defer(Exception):
    """Raised by a stream handler for a message that is not due yet: it is handed back
    to its stream, to be delivered again after ``delay_s`` (not a failure)."""

    def __init__(self, delay_s: float, reason: str = "") -> None:
        super().__init__(reason or f"deferred {delay_s:.3g}s")
        self.delay_s = delay_s
