"""Keeps the latest heartbeat of every service instance and answers StatusRequests.

A client in any language gets the state of the whole stack with one request on
``temper.v1.control.status``: services (healthy, draining, silent), stream
depths and the dead-letter count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import nats.errors
from nats.js import api

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import (
    Heartbeat,
    ServiceState,
    ServiceStatus,
    StackStatus,
    StatusRequest,
    StreamStatus,
)
from services.runtime.responder import Request
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings


@dataclass(frozen=True, kw_only=True)
class ControlSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: An instance silent for this long is reported unhealthy ...
    stale_after_s: float = 15.0
    #: ... and forgotten after this long (or at once after it said it stopped).
    forget_after_s: float = 120.0


@dataclass(slots=True)
class _Seen:
    heartbeat: Heartbeat
    at: float


class ControlService(Service):
    name = "control"

    def __init__(self, settings: ControlSettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self._seen: dict[tuple[str, str], _Seen] = {}

    async def setup(self) -> None:
        self.listen(subjects.heartbeats(), Codec(Heartbeat), self._on_heartbeat)
        self.respond(subjects.status(), Codec(StatusRequest), self._on_status)

    async def _on_heartbeat(self, heartbeat: Heartbeat, _: Request) -> None:
        key = (heartbeat.service, heartbeat.instance)
        if heartbeat.state is ServiceState.STOPPED:
            self._seen.pop(key, None)
            return
        self._seen[key] = _Seen(heartbeat, time.monotonic())

    async def _on_status(self, _: StatusRequest, __: Request) -> StackStatus:
        return StackStatus(
            services=self.services(),
            streams=await self._streams(),
            dead_letters=await self._stream_size(streams.DEAD_LETTERS.name),
            at=time.time(),
        )

    def services(self) -> list[ServiceStatus]:
        now = time.monotonic()
        self._forget(now)
        out = [self._status_of(seen, now - seen.at) for seen in self._seen.values()]
        mine = self.heartbeat()
        if (mine.service, mine.instance) not in self._seen:
            out.append(self._status_of(_Seen(mine, now), 0.0))
        return sorted(out, key=lambda s: (s.service, s.instance))

    def _status_of(self, seen: _Seen, age_s: float) -> ServiceStatus:
        beat = seen.heartbeat
        fresh = age_s <= self.settings.stale_after_s
        return ServiceStatus(
            service=beat.service,
            instance=beat.instance,
            state=beat.state,
            healthy=beat.healthy and fresh,
            age_s=age_s,
            in_flight=beat.in_flight,
            detail=beat.detail if fresh else f"no heartbeat for {age_s:.0f}s",
        )

    def _forget(self, now: float) -> None:
        for key, seen in list(self._seen.items()):
            if now - seen.at > self.settings.forget_after_s:
                del self._seen[key]

    async def _streams(self) -> list[StreamStatus]:
        out = []
        for spec in streams.ALL:
            try:
                info = await self.bus.js.stream_info(spec.name)
                out.append(await self._stream_status(spec.name, info))
            except nats.errors.Error:
                continue  # not declared yet, or deleted meanwhile
        return out

    async def _stream_status(self, name: str, info: api.StreamInfo) -> StreamStatus:
        pending = 0
        for consumer in await self.bus.js.consumers_info(name):
            pending += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
        return StreamStatus(
            name=name,
            messages=info.state.messages,
            bytes=info.state.bytes,
            consumers=info.state.consumer_count,
            pending=pending,
        )

    async def _stream_size(self, name: str) -> int:
        try:
            return int((await self.bus.js.stream_info(name)).state.messages)
        except nats.errors.Error:
            return 0
