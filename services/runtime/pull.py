"""A lean fetch from a durable pull consumer: one inbox subscription, no task per message.

nats-py's ``PullSubscription.fetch`` waits for every message of a batch in a task of
its own (``create_task`` + ``wait_for`` + a uuid), which costs more than everything
else a fast consumer does with the message.  :class:`Puller` sends the same pull
requests (``$JS.API.CONSUMER.MSG.NEXT``) and collects the deliveries in a
subscription callback instead.  It fetches like nats-py does: first a ``no_wait``
request for what is there now, and only if that brings nothing a request that
lingers until the batch is full or ``wait_s`` has passed.  The server ends a request
it could not fill with a status message (404 none now, 408 expired, 409 consumer
gone), or sends nothing more once the batch is full.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

#: Statuses that end a request without saying anything is wrong.
_QUIET_ENDS: Final = frozenset({api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT})
#: Idle heartbeats and flow control (this puller asks for neither): not an end.
_CONTROL: Final = api.StatusCode.CONTROL_MESSAGE
#: Client-side grace after a lingering request's expiry, for its 408 to arrive.
_EXPIRY_GRACE_S: Final = 0.25


class PullRequest(msgspec.Struct, omit_defaults=True):
    """The body of ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>``."""

    batch: int
    #: Nanoseconds the server may hold the request open (0: its default).
    expires: int = 0
    no_wait: bool = False


class PullFailed(Exception):
    """The server ended a pull request with an error status (e.g. 409: consumer deleted)."""

    def __init__(self, status: str, description: str) -> None:
        super().__init__(f"pull request ended with {status} {description}".strip())
        self.status = status
        self.description = description


def next_subject(stream: str, durable: str) -> str:
    """The server's own API subject (not Temper's) for pulling from a durable."""
    return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"


class Puller:
    """Fetches batches of messages from one durable pull consumer; one fetch at a time."""

    def __init__(self, nc: NATS, stream: str, durable: str) -> None:
        self._nc = nc
        self._subject = next_subject(stream, durable)
        self._inbox = nc.new_inbox()
        self._encoder = msgspec.json.Encoder()
        self._sub: Subscription | None = None
        #: Deliveries not yet handed out (a late one may arrive between two fetches).
        self._got: list[Msg] = []
        self._wanted = 0
        self._ended = asyncio.Event()
        self._failure: PullFailed | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_message)

    async def close(self) -> list[Msg]:
        """Stop listening; returns the deliveries never handed out (the caller naks them)."""
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        left, self._got = self._got, []
        return left

    async def fetch(self, count: int, wait_s: float) -> list[Msg]:
        """Up to ``count`` messages: what is there now, else what comes within ``wait_s``.

        Raises :class:`PullFailed` when the server refuses the request, and nats-py's
        connection errors when the request cannot be sent.
        """
        taken = await self.take_now(count)
        if taken:
            return taken
        expires = int(wait_s * 1e9)
        await self._request(PullRequest(batch=count, expires=expires), wait_s)
        taken, self._got = self._got[:count], self._got[count:]
        return taken

    async def take_now(self, count: int) -> list[Msg]:
        """Up to ``count`` messages that are there now; never leaves a request open."""
        if len(self._got) < count:
            await self._request(PullRequest(batch=count - len(self._got), no_wait=True), 0.0)
        taken, self._got = self._got[:count], self._got[count:]
        return taken

    async def _request(self, request: PullRequest, wait_s: float) -> None:
        self._wanted = len(self._got) + request.batch
        self._failure = None
        self._ended.clear()
        await self._nc.publish(self._subject, self._encoder.encode(request), self._inbox)
        # A no_wait request is answered at once; the bound only covers a lost connection.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s + _EXPIRY_GRACE_S):
                await self._ended.wait()
        if self._failure is not None:
            raise self._failure

    async def _on_message(self, msg: Msg) -> None:
        headers = msg.headers
        if not msg.reply and headers is not None and api.Header.STATUS in headers:
            self._on_status(headers[api.Header.STATUS], headers.get(api.Header.DESCRIPTION, ""))
            return
        self._got.append(msg)
        if len(self._got) >= self._wanted:
            self._ended.set()

    def _on_status(self, status: str, description: str) -> None:
        if status == _CONTROL:
            return
        if status not in _QUIET_ENDS:
            self._failure = PullFailed(status, description)
        self._ended.set()
