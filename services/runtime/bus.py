"""A service's NATS connection: typed publishing with headers and size checks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api

from protocol import headers as h
from protocol.codec import check_size, encode
from protocol.messages import PROTOCOL_VERSION, Message
from services.runtime.logs import get_logger

_VERSION = str(PROTOCOL_VERSION)


@dataclass(frozen=True, kw_only=True)
class ConnectOptions:
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


class Bus:
    """Owns one NATS connection and its JetStream context."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()

    @classmethod
    async def connect(cls, options: ConnectOptions) -> Bus:
        log = get_logger(component="bus")

        async def on_error(error: Exception) -> None:
            log.warning("nats_error", error=str(error))

        async def on_disconnect() -> None:
            log.warning("nats_disconnected")

        async def on_reconnect() -> None:
            log.info(
                "nats_reconnected", url=str(nc.connected_url.geturl() if nc.connected_url else "")
            )

        nc = await nats.connect(
            options.url,
            name=options.name,
            connect_timeout=options.connect_timeout_s,
            reconnect_time_wait=options.reconnect_wait_s,
            max_reconnect_attempts=-1 if options.retry_forever else 0,
            allow_reconnect=options.retry_forever,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
        return cls(nc)

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
