"""Keeps the latest heartbeat of every service instance and answers StatusRequests.

A client in any language gets the state of the whole stack with one request on
``temper.v1.control.status``: services (healthy, draining, silent, gone; the policy
version each generator serves and whether it lags), stream depths and the dead-letter
count.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

import nats.errors
from nats.js import api

from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.codec import Codec
from protocol.messages import (
    Heartbeat,
    PolicyUpdate,
    ServiceState,
    ServiceStatus,
    StackStatus,
    StatusRequest,
    StreamStatus,
)
from services.runtime.policy import last_policy_update
from services.runtime.responder import Request
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings

#: Announced versions remembered to date a lag; an older one counts as announced no later
#: than the oldest kept.
KEEP_VERSIONS: Final = 1024


@dataclass(frozen=True, kw_only=True)
class ControlSettings:
    """Bounds on silence, against the default heartbeat every 5 s (``heartbeat_s``)."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: An instance silent for this long is reported unhealthy (maybe only slow) ...
    stale_after_s: float = 10.0
    #: ... as gone after this long (killed, or its host lost) ...
    gone_after_s: float = 20.0
    #: ... and forgotten after this long (or at once after it said it stopped).
    forget_after_s: float = 60.0
    #: An instance behind the newest announced policy version for longer than this lags.
    lagging_after_s: float = 60.0
    #: How long the roll call at start (and after a reconnect) collects answers.
    roll_call_s: float = 1.0


@dataclass(slots=True)
class _Seen:
    heartbeat: Heartbeat
    at: float


class Announcements:
    """When each policy version was first announced, on this process's monotonic clock."""

    def __init__(self, keep: int = KEEP_VERSIONS) -> None:
        self._keep = keep
        self._at: dict[int, float] = {}

    def announced(self, version: int, now: float) -> None:
        if version in self._at:
            return  # re-announced (trained_samples moved on): the first time is what counts
        self._at[version] = now
        if len(self._at) > self._keep:
            del self._at[min(self._at)]

    @property
    def newest(self) -> int | None:
        return max(self._at, default=None)

    def behind_since(self, version: int) -> float | None:
        """Since when a version newer than ``version`` exists; None if none does."""
        return min((at for v, at in self._at.items() if v > version), default=None)


class Roster:
    """Every instance heard from, judged against the bounds; pure (time is passed in)."""

    def __init__(self, settings: ControlSettings) -> None:
        self.settings = settings
        self.policy = Announcements()
        self._seen: dict[tuple[str, str], _Seen] = {}

    def heard(self, heartbeat: Heartbeat, now: float) -> None:
        key = (heartbeat.service, heartbeat.instance)
        if heartbeat.state is ServiceState.STOPPED:
            self._seen.pop(key, None)
            return
        self._seen[key] = _Seen(heartbeat, now)

    def statuses(self, now: float, mine: Heartbeat) -> list[ServiceStatus]:
        """The listing, with ``mine`` (the caller's own heartbeat) as if just heard."""
        self._forget(now)
        seen = dict(self._seen)
        seen.setdefault((mine.service, mine.instance), _Seen(mine, now))
        out = [self._status_of(one, now) for one in seen.values()]
        return sorted(out, key=lambda s: (s.service, s.instance))

    def _status_of(self, seen: _Seen, now: float) -> ServiceStatus:
        beat = seen.heartbeat
        age_s = now - seen.at
        fresh = age_s <= self.settings.stale_after_s
        return ServiceStatus(
            service=beat.service,
            instance=beat.instance,
            state=beat.state,
            healthy=beat.healthy and fresh,
            age_s=age_s,
            in_flight=beat.in_flight,
            detail=beat.detail if fresh else f"no heartbeat for {age_s:.0f}s",
            gone=age_s > self.settings.gone_after_s,
            policy_version=beat.policy_version,
            lagging=self._lagging(beat.policy_version, now),
            metrics_url=beat.metrics_url,
        )

    def _lagging(self, version: int | None, now: float) -> bool:
        if version is None:
            return False
        since = self.policy.behind_since(version)
        return since is not None and now - since > self.settings.lagging_after_s

    def _forget(self, now: float) -> None:
        for key, seen in list(self._seen.items()):
            if now - seen.at > self.settings.forget_after_s:
                del self._seen[key]


class ControlService(Service):
    name = "control"

    def __init__(self, settings: ControlSettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self.roster = Roster(settings)

    async def setup(self) -> None:
        self.listen(subjects.heartbeats(), Codec(Heartbeat), self._on_heartbeat)
        self.listen(subjects.policy_update(), Codec(PolicyUpdate), self._on_policy)
        self.respond(subjects.status(), Codec(StatusRequest), self._on_status)
        await self._catch_up_policy()

    def background(self) -> list[Coroutine[Any, Any, None]]:
        return [self._roll_call()]

    async def reconnected(self) -> None:
        await self._catch_up_policy()  # an update announced while away dates the lag
        await self._roll_call()

    async def _roll_call(self) -> None:
        """Ask every instance for a heartbeat: those that started before this one would
        otherwise be missing from the listing until their next periodic one."""
        client = TemperClient(self.bus.nc)  # borrowed for one call, never closed here
        try:
            beats = await client.ping(timeout_s=self.settings.roll_call_s)
        except nats.errors.Error as error:  # the periodic heartbeats still arrive
            self.log.warning("roll_call_failed", error=repr(error))
            return
        now = time.monotonic()
        for beat in beats:
            self.roster.heard(beat, now)
        self.log.info("roll_call", answered=len(beats))

    async def _catch_up_policy(self) -> None:
        update = await last_policy_update(self.bus.js, self.log)
        if update is not None:
            self.roster.policy.announced(update.version, time.monotonic())

    async def _on_heartbeat(self, heartbeat: Heartbeat, _: Request) -> None:
        self.roster.heard(heartbeat, time.monotonic())

    async def _on_policy(self, update: PolicyUpdate, _: Request) -> None:
        self.roster.policy.announced(update.version, time.monotonic())

    async def _on_status(self, _: StatusRequest, __: Request) -> StackStatus:
        return StackStatus(
            services=self.services(),
            streams=await self._streams(),
            dead_letters=await self._stream_size(streams.DEAD_LETTERS.name),
            at=time.time(),
        )

    def services(self) -> list[ServiceStatus]:
        return self.roster.statuses(time.monotonic(), self.heartbeat())

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
