"""Typed request/reply: one request out, one typed answer back, or a typed error saying why not.

Every request the services make goes through :func:`ask` (or :meth:`Bus.ask`, which
delegates here): the message is encoded with the protocol codec, sent with the trace id
of the work it belongs to, and the answer decoded as ``reply_type | ErrorReply``.  What
can go wrong is one of the :class:`AskError` subclasses below, each carrying the subject;
each caller maps them to its own failure (an infra failure, a CLI message, a retry).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar, cast

import nats.errors
import structlog
from nats.aio.client import Client as NATS

from protocol import headers
from protocol.codec import Codec, check_size, encode
from protocol.errors import DecodeError, ErrorCode, PayloadTooLarge
from protocol.messages import ErrorReply, Message

R = TypeVar("R", bound=Message)

#: A reason longer than this is cut: a decode error can quote a whole schema.
_REASON_LIMIT: Final = 300


class AskError(Exception):
    """A request got no usable answer; ``subject`` is where it went."""

    def __init__(self, subject: str, text: str) -> None:
        super().__init__(text)
        self.subject = subject


class NoResponder(AskError):
    """Nobody listens on the subject (the service is not running)."""

    def __init__(self, subject: str) -> None:
        super().__init__(subject, f"no service answers on {subject}")


class AskTimeout(AskError):
    """Nothing came back within ``timeout_s``; the request may still have been served."""

    def __init__(self, subject: str, timeout_s: float) -> None:
        super().__init__(subject, f"no answer on {subject} within {timeout_s:.1f}s")
        self.timeout_s = timeout_s


class BadReply(AskError):
    """The answer does not decode, or is not of the type asked for."""

    def __init__(self, subject: str, reason: str) -> None:
        reason = reason[:_REASON_LIMIT]
        super().__init__(subject, f"unusable reply on {subject}: {reason}")
        self.reason = reason


class Refused(AskError):
    """The service answered with an :class:`ErrorReply`."""

    def __init__(self, subject: str, reply: ErrorReply) -> None:
        where = f" (at {reply.field})" if reply.field else ""
        text = f"{subject} refused the request ({reply.code.value}): {reply.message}{where}"
        super().__init__(subject, text)
        self.reply = reply

    @property
    def code(self) -> ErrorCode:
        return self.reply.code

    @property
    def message(self) -> str:
        return self.reply.message

    @property
    def field(self) -> str | None:
        return self.reply.field


class Unsent(AskError):
    """The request could not go out: the connection is closed, draining or reconnecting,
    or the payload is over the server's limit.  ``error`` is the client's own."""

    def __init__(self, subject: str, error: Exception) -> None:
        super().__init__(subject, f"request on {subject} not sent: {error!r}")
        self.error = error


def current_trace_id() -> str | None:
    """The trace id of the work running now (the runtime binds it while a handler runs)."""
    trace_id = structlog.contextvars.get_contextvars().get("trace_id")
    return str(trace_id) if trace_id else None


def trace_headers(trace_id: str | None = None) -> dict[str, str] | None:
    """The headers that carry ``trace_id`` (else the current one) on; None without one."""
    trace = trace_id or current_trace_id()
    return {headers.TRACE_ID: headers.clean(trace)} if trace else None


async def ask(
    nc: NATS,
    subject: str,
    message: Message | None,
    reply_type: type[R],
    timeout_s: float,
    *,
    trace_id: str | None = None,
) -> R:
    """Send ``message`` to ``subject`` and return the answer, a ``reply_type``.

    ``message`` None sends an empty body, for subjects that read none (health, ping).
    ``trace_id`` None carries the current work's trace id on.  Raises
    :class:`NoResponder`, :class:`AskTimeout`, :class:`BadReply`, :class:`Refused` or
    :class:`Unsent`.
    """
    payload = b"" if message is None else encode(message)
    data = await request(nc, subject, payload, timeout_s, trace_id=trace_id)
    return decode_reply(subject, data, reply_type)


async def request(
    nc: NATS, subject: str, payload: bytes, timeout_s: float, *, trace_id: str | None = None
) -> bytes:
    """The raw answer to ``payload``; the transport's failures as :class:`AskError`."""
    hdrs = trace_headers(trace_id)
    try:
        if hdrs is not None:
            # nats-py checks the payload alone; the server counts the headers too, and
            # closes the connection of a client that sends more than its limit.
            check_size(payload, hdrs, nc.max_payload)
        reply = await nc.request(subject, payload, timeout=timeout_s, headers=hdrs)
    except nats.errors.NoRespondersError:
        raise NoResponder(subject) from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise AskTimeout(subject, timeout_s) from None
    except (nats.errors.Error, PayloadTooLarge) as error:
        raise Unsent(subject, error) from error
    return bytes(reply.data)


def decode_reply(subject: str, data: bytes, reply_type: type[R]) -> R:
    """``data`` as a ``reply_type``; :class:`Refused` for an ErrorReply, else :class:`BadReply`."""
    try:
        answer = _replies(reply_type).decode(data)
    except DecodeError as error:
        raise BadReply(subject, error.message) from None
    if isinstance(answer, ErrorReply):
        raise Refused(subject, answer)
    return answer


#: One codec per reply type, built on first use (a msgspec decoder is compiled once).
_CODECS: dict[type[Message], Codec[Any]] = {}


def _replies(reply_type: type[R]) -> Codec[R | ErrorReply]:
    codec = _CODECS.get(reply_type)
    if codec is None:
        codec = _CODECS[reply_type] = Codec(reply_type | ErrorReply)
    return cast("Codec[R | ErrorReply]", codec)
