"""Replay service: holds scored rollouts until a learner takes them.

Each scored rollout is held unacknowledged (the runtime keeps its redelivery deadline
pushed back) and acked only when it leaves the buffer: served to a learner, dropped as
stale, or excluded (infra failures never enter training).  A crash therefore loses
nothing: the scored stream redelivers what was held.  The capacity is the consumer's
in-flight bound, so a full buffer stops taking (backpressure), it never drops.

A learner asking with ``lease`` gets its batch leased instead of acked: the rollouts stay
unacknowledged until its BatchCommit (sent once the step that used them is durable),
and a LeaseRelease from a restarted learner puts back what it never committed.  Leased
rollouts count against the capacity.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import (
    Batch,
    BatchCommit,
    BatchStatus,
    CommitReply,
    LeaseRelease,
    SampleRequest,
    ScoredRollout,
)
from services.replay.buffer import ReplayBuffer, Selection
from services.runtime.consumer import ConsumerTuning, Delivery
from services.runtime.jetstream import ConsumerSpec
from services.runtime.responder import Request
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings
from services.runtime.stages import Stages

DURABLE = "replay"
#: Room left in a Batch for everything but the rollouts (headers, envelope).
_ENVELOPE_BYTES = 4096
#: Room per rollout for its entry in ``Batch.traces`` (id and trace id).
_TRACE_BYTES = 160


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: Scored rollouts held at most; beyond it the buffer stops taking (backpressure).
    capacity: int = 4096
    #: Samples older than this many policy versions are dropped (and counted).
    max_staleness: int = 4
    #: An incomplete group is served as it is after this long (a member may be lost for good).
    group_timeout_s: float = 300.0
    #: Longest wait a SampleRequest may ask for.
    max_wait_s: float = 30.0
    #: Redelivery deadline of held rollouts (pushed back while held).
    ack_wait_s: float = 120.0


class ReplayService(Service):
    name = "replay"

    def __init__(self, settings: ReplaySettings) -> None:
        super().__init__(settings.runtime)
        self.settings = settings
        self.buffer = ReplayBuffer(group_timeout_s=settings.group_timeout_s)
        self._arrived = asyncio.Event()
        self._waiting: set[asyncio.Future[None]] = set()
        #: Trace id of every rollout held or leased, for the Batch's ``traces``.
        self._traces: dict[str, str] = {}
        #: Per rollout: time held in the buffer; per request: time to select the batch.
        self.stages = Stages()

    async def setup(self) -> None:
        spec = ConsumerSpec(
            stream=streams.SCORED.name,
            durable=DURABLE,
            ack_wait_s=self.settings.ack_wait_s,
            # Held rollouts come back after every restart; that must not dead-letter them.
            max_deliver=1000,
            max_ack_pending=self.settings.capacity,
        )
        tuning = ConsumerTuning(max_in_flight=self.settings.capacity, fetch_wait_s=0.5)
        self.consume(spec, Codec(ScoredRollout), self._hold, tuning)
        self.respond(subjects.replay_sample(), Codec(SampleRequest), self._on_sample)
        self.respond(subjects.replay_commit(), Codec(BatchCommit | LeaseRelease), self._on_commit)

    async def _hold(self, item: ScoredRollout, delivery: Delivery) -> None:
        """Returns (and so acks) only when the rollout has left the buffer for good."""
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.buffer.add(item, lambda: _resolve(left)):
            return
        self._traces[item.id] = delivery.trace_id
        self._arrived.set()
        self._waiting.add(left)
        try:
            with self.stages.stage("hold"):
                await left
        finally:
            self._waiting.discard(left)
            self._traces.pop(item.id, None)

    async def _on_commit(self, request: BatchCommit | LeaseRelease, _: Request) -> CommitReply:
        if isinstance(request, LeaseRelease):
            released = self.buffer.release_leases()
            if released:
                self._arrived.set()
            self.log.info("leases_released", learner=request.learner, rollouts=released)
            return CommitReply(request_id=request.id, released=released)
        committed, unknown = self.buffer.commit(request.rollout_ids)
        return CommitReply(request_id=request.id, committed=committed, unknown=unknown)

    async def intake_stopped(self) -> None:
        """Held rollouts cannot be served while draining: hand them back to the stream now."""
        for future in list(self._waiting):
            future.cancel()
        self.buffer.release_all()

    async def _on_sample(self, request: SampleRequest, _: Request) -> Batch:
        deadline = time.monotonic() + min(request.wait_s, self.settings.max_wait_s)
        if not await self._until_available(request, deadline):
            return Batch(
                request_id=request.id, status=BatchStatus.EMPTY, remaining=len(self.buffer)
            )
        budget = _SizeBudget(self.bus.max_payload - _ENVELOPE_BYTES)
        selection = self._select(request, budget)
        items, dropped = list(selection.items), selection.dropped_stale
        excluded = selection.excluded
        while len(items) < request.max_samples and await self._arrival(deadline):
            more = self._select(request, budget, len(items))
            items.extend(more.items)
            dropped += more.dropped_stale
            excluded += more.excluded
            selection = more
        status = _status(len(items), request.max_samples)
        return Batch(
            request_id=request.id,
            items=items,
            status=status,
            dropped_stale=dropped,
            excluded=excluded,
            remaining=selection.remaining,
            traces={i.id: self._traces.get(i.id, "") for i in items},
        )

    async def _until_available(self, request: SampleRequest, deadline: float) -> bool:
        """Wait until the buffer can serve ``request.min_samples``; False at the deadline."""
        while self._available(request) < request.min_samples:
            if not await self._arrival(deadline):
                return False
        return True

    async def _arrival(self, deadline: float) -> bool:
        """Wait for the next rollout to arrive; False once the deadline passes first."""
        self._arrived.clear()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._arrived.wait()
        except TimeoutError:
            return False
        return True

    def _available(self, request: SampleRequest) -> int:
        return self.buffer.available(
            learner_version=request.learner_version,
            max_staleness=self._max_staleness(request),
            whole_groups=request.whole_groups,
        )

    def _max_staleness(self, request: SampleRequest) -> int:
        chosen = request.max_staleness
        return self.settings.max_staleness if chosen is None else chosen

    def _select(self, request: SampleRequest, budget: _SizeBudget, already: int = 0) -> Selection:
        with self.stages.stage("select"):
            return self._take(request, budget, already)

    def _take(self, request: SampleRequest, budget: _SizeBudget, already: int) -> Selection:
        return self.buffer.take(
            learner_version=request.learner_version,
            max_staleness=self._max_staleness(request),
            max_samples=request.max_samples - already,
            whole_groups=request.whole_groups,
            domain_weights=request.domain_weights,
            fits=budget.fits,
            lease=request.lease,
        )

    def health(self) -> tuple[bool, str]:
        ok, detail = super().health()
        return ok, detail or f"{len(self.buffer)} held"

    def statistics(self) -> dict[str, float]:
        values = super().statistics()
        values.update(self.buffer.statistics())
        values.update(self.stages.figures())
        return values


class _SizeBudget:
    """Keeps a Batch under the server's payload limit."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def fits(self, item: ScoredRollout) -> bool:
        size = len(encode(item)) + _TRACE_BYTES
        if size > self.left:
            return False
        self.left -= size
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _status(count: int, wanted: int) -> BatchStatus:
    if count == 0:
        return BatchStatus.EMPTY
    return BatchStatus.OK if count >= wanted else BatchStatus.PARTIAL
