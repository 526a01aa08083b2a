"""Fair intake within a priority tier: one durable per flow (a domain's tasks of one
tenant), taken in weighted fair share, with quarantined domains held in their stream.

A pull consumer on a whole tier hands tasks out in stream order, so behind a flood of
one domain (or of one tenant) every other waits for all of it.  With one durable per
flow (filter subject ``temper.v1.task.<tier>.<domain>`` for the default tenant,
``temper.v1.task.<tier>.<domain>.<tenant>`` for another; a work-queue stream allows
such non-overlapping consumers) the generator chooses whose task to take next:
:class:`~services.generator.scheduling.fairshare.FairShare` picks among the flows with tasks
waiting, and a domain in :class:`~services.generator.scheduling.quarantine.Quarantine` is skipped,
every tenant of it (its tasks stay in the stream, neither failed nor dead-lettered)
except for its probe.  All generator instances share the durables, so each task still
goes to one of them.

Flows are found from the stream's per-subject message counts (one ``STREAM.INFO``
request with a subject filter, at most every ``refresh_s``), and their durables are
created on first sight.  A tier with nothing to take does not poll: it listens on the
tier's subjects (a core subscription, open only while nothing can be taken, so a busy
generator gets no copies of the tasks) and asks again when a task is published, or every
``idle_refresh_s`` for what becomes available without a publish (a task handed back by
another instance, a quarantined domain's tasks).  The tiers of one generator share
:class:`Publishes`: a task published on another idle tier, or a tier with work coming
back for the turn (the priority gate says so), ends the wait of the tier that holds the
fetch turn at once, so the turn passes without a poll's delay (an idle generator took
about 50 ms to start a task before).  Everything else (in-progress
acks, naks, dead letters, the priority gate between tiers) is the pull consumer's, as
for any other consumer: :class:`DomainSource` only decides which durable each message
comes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from protocol import subjects
from protocol.codec import Codec
from protocol.errors import SubjectError
from protocol.messages import Task
from services.generator.scheduling.fairshare import FairShare, Flow
from services.generator.scheduling.quarantine import Quarantine
from services.runtime.bus import Bus
from services.runtime.consumer import Consumer, ConsumerTuning, Handler, max_deliveries_advisory
from services.runtime.deadletter import DeadLetters
from services.runtime.jetstream import ConsumerSpec, ensure_consumer
from services.runtime.logs import get_logger
from services.runtime.metrics import ServiceMetrics
from services.runtime.pull import Puller

#: The tier-wide durable of FIFO intake; its flows' durables are named by flow_durable().
DURABLE = "generator"
#: Longest wait for the stream's backlog before the intake asks again.
REFRESH_TIMEOUT_S = 1.0
#: The server's limit on a consumer name (JSMaxNameLen).
MAX_DURABLE_LEN = 255


def flow_durable(flow: Flow) -> str:
    """``generator-<domain>`` for the default tenant (the durable of a domain before
    tenants existed), ``generator-<domain>~<tenant>`` for another.  A consumer name may
    not hold ``.`` (nor ``*``, ``>``, ``/``, ``\\``, spaces); ``~`` is in no token, so no
    two flows share a name.  Two tokens of 128 characters would pass the server's 255:
    such a flow is named by a digest instead (``generator~<hex>``, unlike any other)."""
    domain = subjects.token(flow.domain, "domain")
    if not flow.tenant:
        return f"{DURABLE}-{domain}"
    name = f"{DURABLE}-{domain}~{subjects.token(flow.tenant, 'tenant')}"
    if len(name) <= MAX_DURABLE_LEN:
        return name
    return f"{DURABLE}~{hashlib.sha256(f'{domain}.{flow.tenant}'.encode()).hexdigest()}"


class Publishes:
    """Which idle tiers had a task published since they last looked, shared by the tiers
    of one generator: the tier that holds the fetch turn stops waiting at once when
    another one has work and waits for the turn (it passes on), instead of polling out
    its wait first.

    Only a tier whose consumer waits for the turn (``waiting``, the priority gate's word)
    ends another's wait: one that cannot fetch now (its slots are full) would have the
    others hand the turn round and round, never waiting, and starve the event loop."""

    def __init__(self, waiting: Callable[[int], bool] = lambda _: False) -> None:
        self.waiting = waiting
        self._pending: set[int] = set()
        #: Tiers with work that wait for the turn (the priority gate says so).
        self._wanting: set[int] = set()
        self._changed = asyncio.Event()

    def published(self, tier: int) -> None:
        self._pending.add(tier)
        self._wake()

    def wants_turn(self, tier: int) -> None:
        """``tier`` has work and waits for the fetch turn: whoever holds it stops waiting."""
        self._wanting.add(tier)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def seen(self, tier: int) -> bool:
        """Whether ``tier`` had one (and forget it: the tier is looking now)."""
        self._wanting.discard(tier)
        if tier not in self._pending:
            return False
        self._pending.discard(tier)
        return True

    def elsewhere(self, tier: int) -> bool:
        """Whether a tier other than ``tier`` has work and waits for the turn."""
        return any(t != tier and self.waiting(t) for t in self._pending | self._wanting)

    async def wait(self, tier: int, timeout_s: float) -> None:
        """Until a task is published on any tier, or ``timeout_s``; at once when one was
        published on ``tier`` while it was busy asking the stream (marked, not lost)."""
        if tier in self._pending or self.elsewhere(tier):
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed.wait()


@dataclass(frozen=True, kw_only=True)
class Fairness:
    """What a tier's intake shares with the others: one share, one quarantine, and
    which idle tiers were published to."""

    share: FairShare
    quarantine: Quarantine
    publishes: Publishes = field(default_factory=Publishes)
    #: How often the stream is asked for its backlog: the longest a new task of an idle
    #: tier waits before it is seen.
    refresh_s: float = 0.1
    #: How often an idle tier asks anyway: the longest a task that becomes available
    #: again without being published (a nak elsewhere, an ack timeout) waits to be seen.
    idle_refresh_s: float = 2.0
    clock: Callable[[], float] = time.monotonic


async def retire_tier_durable(js: JetStreamContext, stream: str) -> bool:
    """Delete the tier-wide durable of FIFO intake, if there is one: a work-queue stream
    refuses per-domain durables beside it.  Its unacknowledged tasks stay in the stream
    and go to the domain durables.  True if one was deleted."""
    with contextlib.suppress(nats.js.errors.NotFoundError):
        info = await js.consumer_info(stream, DURABLE)
        if not info.config.filter_subject:
            return bool(await js.delete_consumer(stream, DURABLE))
    return False


class Backlog:
    """Tasks per flow in one tier stream, as the last ``STREAM.INFO`` counted them
    (delivered but unacknowledged tasks included: a work queue keeps them until acked)."""

    def __init__(self, js: JetStreamContext, stream: str, tier: int) -> None:
        self._js = js
        self._stream = stream
        self._filter = subjects.task_tier(tier)
        self.counts: dict[Flow, int] = {}
        self.at = float("-inf")

    async def refresh(self, now: float) -> None:
        # Bounded well below the JetStream API timeout: while the stream elects a new leader
        # the request goes unanswered, and the intake should ask again soon, not wait 5 s.
        async with asyncio.timeout(REFRESH_TIMEOUT_S):
            info = await self._js.stream_info(self._stream, subjects_filter=self._filter)
        counts: dict[Flow, int] = {}
        for subject, count in (info.state.subjects or {}).items():
            flow = _flow_of(subject)
            if count > 0 and flow is not None:
                counts[flow] = count
        self.counts = counts
        self.at = now

    def drained(self, flow: Flow) -> None:
        """Its durable had nothing to hand out now (what is left is in flight)."""
        self.counts.pop(flow, None)


def _flow_of(subject: str) -> Flow | None:
    """The flow of a task subject; None for a subject no builder makes (the stream takes
    ``task.<tier>.>``): no durable would ever take its tasks."""
    try:
        route = subjects.TaskRoute.parse(subject)
    except SubjectError:
        return None
    return Flow(route.domain, route.tenant)


class Wake:
    """A core subscription to a tier's task subjects, open while the tier is idle: a task
    published there is marked in the tiers' shared :class:`Publishes`."""

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    @classmethod
    async def open(cls, nc: NATS, tier: int, publishes: Publishes) -> Wake:
        async def on_task(_: Msg) -> None:
            publishes.published(tier)

        return cls(await nc.subscribe(subjects.task_tier(tier), cb=on_task))

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._subscription.unsubscribe()


class DomainSource:
    """The message source of one tier: a :class:`Puller` per flow's durable."""

    def __init__(
        self, nc: NATS, js: JetStreamContext, spec: ConsumerSpec, tier: int, fair: Fairness
    ) -> None:
        self._nc = nc
        self._js = js
        self._spec = spec
        self._tier = tier
        self._fair = fair
        self._backlog = Backlog(js, spec.stream, tier)
        self._pullers: dict[Flow, Puller] = {}
        #: Open while the tier is idle (nothing in its stream).
        self._wake: Wake | None = None
        self._log = get_logger(stream=spec.stream)

    async def fetch(self, count: int, wait_s: float) -> list[Msg]:
        """Up to ``count`` tasks, fairly across flows; waits up to ``wait_s`` for any, or
        until another idle tier is published to (its turn to fetch comes sooner then)."""
        deadline = self._fair.clock() + wait_s
        publishes = self._fair.publishes
        while True:
            if publishes.seen(self._tier):
                self._backlog.at = float("-inf")  # published here: ask the stream again
            msgs = await self._take(count)
            if msgs and self._wake is not None:
                await self._wake.close()  # busy: no copies of every task needed
                self._wake = None
            left = deadline - self._fair.clock()
            if msgs or left <= 0:
                return msgs
            if publishes.elsewhere(self._tier):
                await asyncio.sleep(0)  # the turn passes: let the tier that wants it ask
                return msgs
            await self._wait(left)

    async def _wait(self, left: float) -> None:
        """Nothing could be taken: wait for a publish on any tier (or ``left`` seconds)."""
        if self._wake is None:
            self._wake = await Wake.open(self._nc, self._tier, self._fair.publishes)
            self._backlog.at = float("-inf")  # ask once more: from now on no publish is missed
        else:
            await self._fair.publishes.wait(self._tier, left)

    def _refresh_due(self, now: float) -> bool:
        every = self._fair.refresh_s if self._wake is None else self._fair.idle_refresh_s
        return now - self._backlog.at >= every

    async def _take(self, count: int) -> list[Msg]:
        now = self._fair.clock()
        if self._refresh_due(now):
            await self._backlog.refresh(now)
        quarantine = self._fair.quarantine
        waiting = [f for f in self._backlog.counts if quarantine.may_start(f.domain, now)]
        msgs: list[Msg] = []
        while len(msgs) < count and waiting:
            flow = self._fair.share.pick(waiting)
            assert flow is not None  # waiting is not empty
            got = await (await self._puller(flow)).take_now(1)
            if not got:
                self._backlog.drained(flow)
                waiting.remove(flow)
                continue
            self._fair.share.started(flow, waiting)
            quarantine.started(flow.domain, now)
            if not quarantine.may_start(flow.domain, now):
                # Its probe is out: nothing more of any of its tenants until it reports.
                waiting = [f for f in waiting if f.domain != flow.domain]
            msgs.extend(got)
        return msgs

    async def _puller(self, flow: Flow) -> Puller:
        puller = self._pullers.get(flow)
        if puller is None:
            spec = ConsumerSpec(
                stream=self._spec.stream,
                durable=flow_durable(flow),
                filter_subject=subjects.task(self._tier, flow.domain, flow.tenant),
                ack_wait_s=self._spec.ack_wait_s,
                max_deliver=self._spec.max_deliver,
                max_ack_pending=self._spec.max_ack_pending,
            )
            await ensure_consumer(self._js, spec)
            puller = Puller(self._nc, spec.stream, spec.durable)
            await puller.start()
            self._pullers[flow] = puller
            self._log.info(
                "domain_consumer", domain=flow.domain, tenant=flow.tenant, durable=spec.durable
            )
        return puller

    async def close(self) -> list[Msg]:
        if self._wake is not None:
            await self._wake.close()
            self._wake = None
        left: list[Msg] = []
        for puller in self._pullers.values():
            left.extend(await puller.close())
        self._pullers.clear()
        return left


class DomainConsumer(Consumer[Task]):
    """A tier's task consumer with fair intake (see the module docstring)."""

    def __init__(
        self,
        spec: ConsumerSpec,
        codec: Codec[Task],
        handler: Handler[Task],
        *,
        tier: int,
        fairness: Fairness,
        bus: Bus,
        dead_letters: DeadLetters,
        metrics: ServiceMetrics,
        tuning: ConsumerTuning,
    ) -> None:
        super().__init__(
            spec, codec, handler, bus=bus, dead_letters=dead_letters, metrics=metrics, tuning=tuning
        )
        self.tier = tier
        self.fairness = fairness

    async def _prepare(self) -> None:
        if await retire_tier_durable(self._js, self.spec.stream):
            self._log.warning("tier_consumer_replaced", durable=DURABLE)

    def _advisory_subject(self) -> str:
        return max_deliveries_advisory(self.spec.stream, "*")

    async def _open(self) -> DomainSource:
        return DomainSource(self._bus.nc, self._js, self.spec, self.tier, self.fairness)
