"""Fair intake within a priority tier: one durable per (tier, domain), taken in weighted
fair share, with quarantined domains held in their stream.

A pull consumer on a whole tier hands tasks out in stream order, so behind a flood of
one domain every other domain waits for all of it.  With one durable per domain (filter
subject ``temper.v1.task.<tier>.<domain>``; a work-queue stream allows such
non-overlapping consumers) the generator chooses whose task to take next:
:class:`~services.generator.fairshare.FairShare` picks among the domains with tasks
waiting, and a domain in :class:`~services.generator.quarantine.Quarantine` is skipped
(its tasks stay in the stream, neither failed nor dead-lettered) except for its probe.
All generator instances share the durables, so each task still goes to one of them.

Domains are found from the stream's per-subject message counts (one ``STREAM.INFO``
request with a subject filter, at most every ``refresh_s``), and their durables are
created on first sight.  A tier with nothing to take does not poll: it listens on the
tier's subjects (a core subscription, open only while nothing can be taken, so a busy
generator gets no copies of the tasks) and asks again when a task is published, or every
``idle_refresh_s`` for what becomes available without a publish (a task handed back by
another instance, a quarantined domain's tasks).  Everything else (in-progress
acks, naks, dead letters, the priority gate between tiers) is the pull consumer's, as
for any other consumer: :class:`DomainSource` only decides which durable each message
comes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import Task
from services.generator.fairshare import FairShare
from services.generator.quarantine import Quarantine
from services.runtime.bus import Bus
from services.runtime.consumer import Consumer, ConsumerTuning, Handler, max_deliveries_advisory
from services.runtime.deadletter import DeadLetters
from services.runtime.jetstream import ConsumerSpec, ensure_consumer
from services.runtime.logs import get_logger
from services.runtime.metrics import ServiceMetrics
from services.runtime.pull import Puller

#: The tier-wide durable of FIFO intake; its domain durables are ``generator-<domain>``.
DURABLE = "generator"
#: Longest wait for the stream's backlog before the intake asks again.
REFRESH_TIMEOUT_S = 1.0


def domain_durable(domain: str) -> str:
    return f"{DURABLE}-{subjects.token(domain, 'domain')}"


@dataclass(frozen=True, kw_only=True)
class Fairness:
    """What a tier's intake shares with the others: one share and one quarantine."""

    share: FairShare
    quarantine: Quarantine
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
    """Tasks per domain in one tier stream, as the last ``STREAM.INFO`` counted them
    (delivered but unacknowledged tasks included: a work queue keeps them until acked)."""

    def __init__(self, js: JetStreamContext, stream: str, tier: int) -> None:
        self._js = js
        self._stream = stream
        self._filter = subjects.task_tier(tier)
        self._prefix = self._filter.removesuffix(">")
        self.counts: dict[str, int] = {}
        self.at = float("-inf")

    async def refresh(self, now: float) -> None:
        # Bounded well below the JetStream API timeout: while the stream elects a new leader
        # the request goes unanswered, and the intake should ask again soon, not wait 5 s.
        async with asyncio.timeout(REFRESH_TIMEOUT_S):
            info = await self._js.stream_info(self._stream, subjects_filter=self._filter)
        counts: dict[str, int] = {}
        for subject, count in (info.state.subjects or {}).items():
            domain = subject.removeprefix(self._prefix)
            if count > 0 and domain != subject and "." not in domain:
                counts[domain] = count
        self.counts = counts
        self.at = now

    def drained(self, domain: str) -> None:
        """Its durable had nothing to hand out now (what is left is in flight)."""
        self.counts.pop(domain, None)


class Wake:
    """A core subscription to a tier's task subjects: set when a task is published."""

    def __init__(self, subscription: Subscription, published: asyncio.Event) -> None:
        self._subscription = subscription
        self._published = published

    @classmethod
    async def open(cls, nc: NATS, subject: str) -> Wake:
        published = asyncio.Event()

        async def on_task(_: Msg) -> None:
            published.set()

        return cls(await nc.subscribe(subject, cb=on_task), published)

    async def wait(self, timeout_s: float) -> bool:
        """True once a task was published (and clears that), False after the timeout."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._published.wait()
        published = self._published.is_set()
        self._published.clear()
        return published

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._subscription.unsubscribe()


class DomainSource:
    """The message source of one tier: a :class:`Puller` per domain durable."""

    def __init__(
        self, nc: NATS, js: JetStreamContext, spec: ConsumerSpec, tier: int, fair: Fairness
    ) -> None:
        self._nc = nc
        self._js = js
        self._spec = spec
        self._tier = tier
        self._fair = fair
        self._backlog = Backlog(js, spec.stream, tier)
        self._pullers: dict[str, Puller] = {}
        #: Open while the tier is idle (nothing in its stream).
        self._wake: Wake | None = None
        self._log = get_logger(stream=spec.stream)

    async def fetch(self, count: int, wait_s: float) -> list[Msg]:
        """Up to ``count`` tasks, fairly across domains; waits up to ``wait_s`` for any."""
        deadline = self._fair.clock() + wait_s
        while True:
            msgs = await self._take(count)
            if msgs and self._wake is not None:
                await self._wake.close()  # busy: no copies of every task needed
                self._wake = None
            left = deadline - self._fair.clock()
            if msgs or left <= 0:
                return msgs
            await self._wait(left)

    async def _wait(self, left: float) -> None:
        """Nothing could be taken: wait for a publish on the tier (or ``left`` seconds)."""
        if self._wake is None:
            self._wake = await Wake.open(self._nc, subjects.task_tier(self._tier))
            self._backlog.at = float("-inf")  # ask once more: from now on no publish is missed
        elif await self._wake.wait(left):
            self._backlog.at = float("-inf")

    def _refresh_due(self, now: float) -> bool:
        every = self._fair.refresh_s if self._wake is None else self._fair.idle_refresh_s
        return now - self._backlog.at >= every

    async def _take(self, count: int) -> list[Msg]:
        now = self._fair.clock()
        if self._refresh_due(now):
            await self._backlog.refresh(now)
        quarantine = self._fair.quarantine
        waiting = [d for d in self._backlog.counts if quarantine.may_start(d, now)]
        msgs: list[Msg] = []
        while len(msgs) < count and waiting:
            domain = self._fair.share.pick(waiting)
            assert domain is not None  # waiting is not empty
            got = await (await self._puller(domain)).take_now(1)
            if not got:
                self._backlog.drained(domain)
                waiting.remove(domain)
                continue
            self._fair.share.started(domain, waiting)
            quarantine.started(domain, now)
            if not quarantine.may_start(domain, now):
                waiting.remove(domain)  # its probe is out: nothing more until it reports
            msgs.extend(got)
        return msgs

    async def _puller(self, domain: str) -> Puller:
        puller = self._pullers.get(domain)
        if puller is None:
            spec = ConsumerSpec(
                stream=self._spec.stream,
                durable=domain_durable(domain),
                filter_subject=subjects.task(self._tier, domain),
                ack_wait_s=self._spec.ack_wait_s,
                max_deliver=self._spec.max_deliver,
                max_ack_pending=self._spec.max_ack_pending,
            )
            await ensure_consumer(self._js, spec)
            puller = Puller(self._nc, spec.stream, spec.durable)
            await puller.start()
            self._pullers[domain] = puller
            self._log.info("domain_consumer", domain=domain, durable=spec.durable)
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
