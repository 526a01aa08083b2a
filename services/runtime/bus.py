"""A service's NATS connection: typed publishing with headers and size checks, typed asking."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from protocol import headers as h
from protocol.codec import check_size, encode
from protocol.errors import PayloadTooLarge
from protocol.messages import PROTOCOL_VERSION, Message
from protocol.servers import server_list
from services.runtime.ask import ask
from services.runtime.logs import get_logger

R = TypeVar("R", bound=Message)

_VERSION = str(PROTOCOL_VERSION)
#: The server's status for a request nobody answers: no stream listens on the subject.
_NO_RESPONDERS = "503"
#: Whitespace ends a protocol line: a subject holding some could smuggle in a command.
_NOT_IN_SUBJECT = re.compile(r"[ \t\r\n]")
#: Header names nats-py accepts (an HTTP token); values lose their line breaks.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_LINE_BREAKS = str.maketrans({"\r": " ", "\n": " "})
#: The nats-py internals :meth:`Bus._write` calls: 2.x has no public call for commands
#: built in bulk.  tests/integration/test_bus_contract.py checks each against the
#: installed nats-py, so an upgrade that changes one fails there, naming it.
NATS_PRIVATE_CALLS: Final = ("_send_command", "_flush_pending")


@dataclass(frozen=True, kw_only=True)
class ConnectOptions:
    #: One server, or several comma-separated.
    url: str
    name: str
    connect_timeout_s: float = 5.0
    reconnect_wait_s: float = 1.0
    #: Services retry forever (NATS may come up after them); CLI tools fail fast.
    retry_forever: bool = True


def message_headers(
    *, trace_id: str | None, msg_id: str | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    out = {h.VERSION: _VERSION}
    if trace_id:
        out[h.TRACE_ID] = h.clean(trace_id)
    if msg_id:
        out[h.MSG_ID] = h.clean(msg_id)
    if extra:
        out.update({k: h.clean(v) for k, v in extra.items()})
    return out


class Publication(NamedTuple):
    """One message of :meth:`Bus.publish_many`: bytes as they go on the wire.

    A tuple: one is built for every message, and a frozen dataclass costs several times more.
    """

    subject: str
    payload: bytes
    headers: dict[str, str]


class StreamAck(msgspec.Struct, frozen=True, gc=False):
    """The stream's answer to one durable publish (the fields of JetStream's PubAck read here)."""

    stream: str
    seq: int
    #: The stream already held a message with this Nats-Msg-Id: nothing new was stored.
    duplicate: bool = False
    domain: str | None = None


#: Per item of :meth:`Bus.publish_many`: the stream's ack, or why there is none.
PublishResult = StreamAck | Exception


class Reconnects:
    """Counts the connection's reconnects and wakes whoever waits for the next one.

    nats-py awaits its reconnected callback inside its reconnect routine, before that
    routine is done: work that needs the connection must not run there.  The callback
    only notes the reconnect here; a service reacts in a task of its own.
    """

    def __init__(self) -> None:
        self.count = 0
        self._next = asyncio.Event()

    def note(self) -> None:
        self.count += 1
        self._next.set()
        self._next = asyncio.Event()

    async def wait(self) -> int:
        """Return the reconnect count once the connection has come back again."""
        await self._next.wait()
        return self.count


class Bus:
    """Owns one NATS connection and its JetStream context."""

    def __init__(self, nc: NATS, reconnects: Reconnects | None = None) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        #: Noted by the connection's reconnected callback (only for a Bus made by connect()).
        self.reconnects = reconnects or Reconnects()
        self._acks: _AckInbox | None = None
        self._acks_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, options: ConnectOptions) -> Bus:
        log = get_logger(component="bus")
        reconnects = Reconnects()

        async def on_error(error: Exception) -> None:
            log.warning("nats_error", error=str(error))

        async def on_disconnect() -> None:
            log.warning("nats_disconnected")

        async def on_reconnect() -> None:
            log.info(
                "nats_reconnected", url=str(nc.connected_url.geturl() if nc.connected_url else "")
            )
            reconnects.note()

        nc = await nats.connect(
            server_list(options.url),
            name=options.name,
            connect_timeout=options.connect_timeout_s,
            reconnect_time_wait=options.reconnect_wait_s,
            max_reconnect_attempts=-1 if options.retry_forever else 0,
            allow_reconnect=options.retry_forever,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
        return cls(nc, reconnects)

    @property
    def max_payload(self) -> int:
        return int(self.nc.max_payload)

    def encode_checked(self, message: Message, hdrs: Mapping[str, str] | None) -> bytes:
        payload = encode(message)
        check_size(payload, hdrs, self.max_payload)
        return payload

    async def publish(
        self,
        subject: str,
        message: Message,
        *,
        trace_id: str | None = None,
        msg_id: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
    ) -> api.PubAck:
        """Durable publish: returns once the stream stored it (``duplicate`` if deduplicated)."""
        hdrs = message_headers(trace_id=trace_id, msg_id=msg_id, extra=extra_headers)
        payload = self.encode_checked(message, hdrs)
        return await self.js.publish(subject, payload, timeout=timeout_s, headers=hdrs)

    async def publish_raw(
        self, subject: str, payload: bytes, hdrs: Mapping[str, str], *, timeout_s: float = 5.0
    ) -> api.PubAck:
        """Durable publish of bytes as they are (dead letters keep the original payload)."""
        check_size(payload, hdrs, self.max_payload)
        return await self.js.publish(subject, payload, timeout=timeout_s, headers=dict(hdrs))

    async def publish_many(
        self, items: Sequence[Publication], *, timeout_s: float = 5.0
    ) -> list[PublishResult]:
        """Durable publish of many messages at once; one result per item, in order.

        Every message goes out with its own reply subject on one long-lived wildcard
        inbox, all in one write, and then all the stream acks are awaited together, for
        up to ``timeout_s``.  A failure belongs to its item alone: a ``PayloadTooLarge``,
        a bad subject or header, a JetStream ``APIError``, ``NoStreamResponseError`` (no
        stream takes the subject), or ``nats.errors.TimeoutError`` (no ack in time: the
        message may still have been stored, which is why callers publish with a
        ``Nats-Msg-Id`` and may simply publish it again).  A connection that is closed,
        draining or reconnecting fails every item with nats-py's error for that.
        """
        pending = _Pending(len(items))
        if not items:
            return []
        inbox = await self._ack_inbox()
        limit = self.max_payload
        commands: list[bytes] = []
        try:
            for index, item in enumerate(items):
                reply = inbox.expect(pending, index)
                try:
                    commands.append(publish_command(item, reply, limit))
                except (PayloadTooLarge, nats.errors.Error) as error:
                    inbox.forget(reply)
                    pending.settle(index, error)
            if commands:
                try:
                    await self._write(b"".join(commands))
                except nats.errors.Error as error:
                    inbox.fail(pending, error)
            await pending.wait(timeout_s)
        finally:
            inbox.forget_all(pending)  # also when cancelled: nothing waits for these any more
        return pending.results

    async def ack_many(self, msgs: Sequence[Msg]) -> None:
        """Ack JetStream deliveries, all in one write: for each, what ``Msg.ack`` sends.

        Raises nats-py's error when the connection cannot take them (closed, draining,
        reconnecting); like any ack this is best effort, and what is not acked comes back
        after the consumer's ``ack_wait``.
        """
        if msgs:
            await self._write(b"".join([ack_command(msg.reply) for msg in msgs]))

    async def _write(self, commands: bytes) -> None:
        """Queue protocol commands for nats-py's writer task and wake it.

        nats-py 2.x has no public call for commands built in bulk; these two internals
        (:data:`NATS_PRIVATE_CALLS`) are what its own ``publish()`` calls once it has built
        a command.  ``publish()`` also validates, formats headers and checks the
        connection each time, which costs several times the write itself;
        :func:`publish_command` and :func:`ack_command` build the same bytes for a whole
        batch.  Unlike ``publish()``, nothing is buffered while reconnecting: the caller's
        messages are handed back or redelivered instead.
        """
        nc = self.nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        if nc.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not nc.is_connected:
            raise nats.errors.ConnectionReconnectingError
        await nc._send_command(commands)
        await nc._flush_pending()

    async def _ack_inbox(self) -> _AckInbox:
        if self._acks is None:
            async with self._acks_lock:  # two first callers must not both subscribe
                if self._acks is None:
                    self._acks = await _AckInbox.open(self.nc)
        return self._acks

    async def ask(
        self,
        subject: str,
        message: Message | None,
        reply_type: type[R],
        timeout_s: float,
        *,
        trace_id: str | None = None,
    ) -> R:
        """Request/reply: the answer as a ``reply_type``, else an ``AskError``
        (see :func:`services.runtime.ask.ask`)."""
        return await ask(self.nc, subject, message, reply_type, timeout_s, trace_id=trace_id)

    async def emit(self, subject: str, message: Message, *, trace_id: str | None = None) -> None:
        """Fire-and-forget core NATS publish (heartbeats, stats): losing one is harmless."""
        hdrs = message_headers(trace_id=trace_id, msg_id=None)
        await self.nc.publish(subject, self.encode_checked(message, hdrs), headers=hdrs)

    async def flush(self) -> None:
        """Return once the server has processed everything sent so far, subscriptions included.

        nats-py 2.16 writes flush()'s PING straight to the socket, ahead of commands still
        queued for its flusher task (a SUB just made), so one round trip can come back before
        the server has seen them.  The first round trip lets the flusher write that queue;
        the second PING goes out after it.
        """
        await self.nc.flush()
        await self.nc.flush()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush and drain within ``timeout_s``, else just close; safe to call twice.

        NATS may be gone when a service stops (the stack is going down): draining would
        wait out the client's flush timeout, and closing a dead transport can raise.
        """
        if self.nc.is_closed:
            return
        if self.nc.is_connected:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout_s)
                return
            except (TimeoutError, nats.errors.Error, RuntimeError) as error:
                get_logger(component="bus").warning("drain_failed", error=repr(error))
        with contextlib.suppress(nats.errors.Error, RuntimeError, TimeoutError):
            await asyncio.wait_for(self.nc.close(), timeout_s)


@functools.lru_cache(maxsize=256)
def _header_prefix(key: str) -> str | None:
    """``"Name: "`` for a header key, None for a blank one (names repeat: checked once)."""
    name = key.strip()
    if not name:
        return None
    if not _HEADER_NAME.fullmatch(name):
        raise nats.errors.BadHeaderError(name)
    return f"{name}: "


def header_block(headers: Mapping[str, str]) -> bytes:
    """A message's NATS header block, the bytes nats-py writes for ``headers``."""
    lines = ["NATS/1.0\r\n"]
    for key, value in headers.items():
        prefix = _header_prefix(key)
        if prefix is not None:
            text = value.strip()
            if "\r" in text or "\n" in text:
                text = text.translate(_LINE_BREAKS)
            lines.append(f"{prefix}{text}\r\n")
    lines.append("\r\n")  # the blank line that ends the block
    return "".join(lines).encode()


def publish_command(item: Publication, reply: str, max_payload: int) -> bytes:
    """The HPUB command that publishes ``item`` with ``reply``; refuses what is too large.

    A message over ``max_payload`` would make the server close the connection.
    """
    if not item.subject or _NOT_IN_SUBJECT.search(item.subject):
        raise nats.errors.BadSubjectError
    block = header_block(item.headers)
    size = len(block) + len(item.payload)
    if size > max_payload:
        raise PayloadTooLarge(size, max_payload, "payload plus headers")
    line = f"HPUB {item.subject} {reply} {len(block)} {size}\r\n".encode()
    return b"".join((line, block, item.payload, b"\r\n"))


def ack_command(reply: str) -> bytes:
    """The PUB command that acks a JetStream delivery: an empty message to its reply subject."""
    if not reply or _NOT_IN_SUBJECT.search(reply):
        raise nats.errors.BadSubjectError
    return f"PUB {reply} 0\r\n\r\n".encode()


class _PubError(msgspec.Struct):
    code: int = 0
    err_code: int | None = None
    description: str | None = None


class _PubReply(msgspec.Struct, gc=False):
    """What the server answers a publish: an ack, or an error (which may name the stream too)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: _PubError | None = None


_REPLY = msgspec.json.Decoder(_PubReply)


def pub_result(reply: Msg) -> PublishResult:
    """A JetStream publish reply as an ack, or as the error it carries."""
    if not reply.data:
        status = (reply.headers or {}).get(api.Header.STATUS, "")
        if status == _NO_RESPONDERS:
            return nats.js.errors.NoStreamResponseError()
        return nats.js.errors.APIError(code=int(status or 0), description="empty publish reply")
    try:
        answer = _REPLY.decode(reply.data)
    except msgspec.MsgspecError as error:
        return nats.js.errors.APIError(description=f"unreadable publish reply: {error}")
    refusal = answer.error
    if refusal is not None:
        return nats.js.errors.APIError(
            code=refusal.code, err_code=refusal.err_code, description=refusal.description
        )
    if not answer.stream:
        return nats.js.errors.APIError(description="publish reply names no stream")
    return StreamAck(answer.stream, answer.seq, answer.duplicate, answer.domain)


class _Pending:
    """The results of one publish_many call, filled in as the acks arrive."""

    __slots__ = ("done", "left", "replies", "results")

    def __init__(self, count: int) -> None:
        timeout: Exception = nats.errors.TimeoutError()
        self.results: list[PublishResult] = [timeout] * count
        self.left = count
        #: The reply subject of each item (to forget those never answered).
        self.replies: list[str] = []
        self.done = asyncio.Event()
        if not count:
            self.done.set()

    def settle(self, index: int, result: PublishResult) -> None:
        self.results[index] = result
        self.left -= 1
        if self.left == 0:
            self.done.set()

    async def wait(self, timeout_s: float) -> None:
        # What has no ack by then keeps the TimeoutError it was created with.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.done.wait()


class _AckInbox:
    """One wildcard subscription that receives the stream acks of every pipelined publish.

    nats-py's request() makes a future, a done-callback, a token and a timer per message;
    here a message costs one dict entry, and its ack one dict pop and one msgspec decode.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._tokens = itertools.count()
        self._waiting: dict[str, tuple[_Pending, int]] = {}

    @classmethod
    async def open(cls, nc: NATS) -> _AckInbox:
        """Subscribe for the connection's lifetime (closing the Bus drains it)."""
        inbox = cls(nc.new_inbox() + ".")
        await nc.subscribe(inbox._prefix + "*", cb=inbox._on_reply)
        return inbox

    def expect(self, pending: _Pending, index: int) -> str:
        """A fresh reply subject whose answer settles item ``index`` of ``pending``."""
        reply = f"{self._prefix}{next(self._tokens)}"
        self._waiting[reply] = (pending, index)
        pending.replies.append(reply)
        return reply

    def forget(self, reply: str) -> None:
        self._waiting.pop(reply, None)

    def fail(self, pending: _Pending, error: Exception) -> None:
        """Settle with ``error`` every item of ``pending`` still waiting for its answer."""
        for reply in pending.replies:
            waiting = self._waiting.pop(reply, None)
            if waiting is not None:
                pending.settle(waiting[1], error)

    def forget_all(self, pending: _Pending) -> None:
        """Drop what ``pending`` still waits for: a late ack then finds nobody, as it should."""
        if pending.left:
            for reply in pending.replies:
                self._waiting.pop(reply, None)

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self._waiting.pop(msg.subject, None)
        if waiting is not None:
            pending, index = waiting
            pending.settle(index, pub_result(msg))
