"""The shape every Temper service has.

A subclass declares its consumers and responders in :meth:`Service.setup`; the
base class owns the connection, the tasks (one TaskGroup), heartbeats, stats,
metrics and the shutdown order: stop intake -> wait in-flight up to the grace
period -> cancel and hand back the rest -> teardown -> flush and close.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Coroutine, Mapping
from typing import Any, ClassVar, TypedDict, TypeVar

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import Heartbeat, Message, ServiceState, Stats
from protocol.streams import StreamSpec
from services.runtime.batch import BatchConsumer, BatchHandler
from services.runtime.bus import Bus, ConnectOptions
from services.runtime.consumer import Consumer, ConsumerTuning, Handler, PullConsumer
from services.runtime.deadletter import DeadLetters
from services.runtime.jetstream import ConsumerSpec, ensure_streams
from services.runtime.logs import get_logger
from services.runtime.metrics import MetricsServer, ServiceMetrics
from services.runtime.responder import Decoder, Request, RequestHandler, Responder
from services.runtime.settings import RuntimeSettings

M = TypeVar("M")
C = TypeVar("C", bound=PullConsumer[Any, Any])


class _ConsumerDeps(TypedDict):
    """What a service gives each of its pull consumers."""

    bus: Bus
    dead_letters: DeadLetters
    metrics: ServiceMetrics
    tuning: ConsumerTuning


#: Metrics source label of the health and ping responders.
CONTROL = "control-plane"
#: How long a stop waits for its cancelled tasks before it cancels them again.
CANCEL_RETRY_S = 1.0


class ServiceNotStarted(RuntimeError):
    """The service's connection is needed before ``start()`` or after ``stop()``."""


class _IgnorePayload:
    """Health probes may carry any payload (or none): it is not read."""

    def decode(self, data: bytes) -> None:
        return None


class Service:
    """Base class.  ``async with Service(...)`` starts it and stops it gracefully."""

    name: ClassVar[str] = "service"
    #: Streams declared (idempotently) at start-up.
    streams: ClassVar[tuple[StreamSpec, ...]] = streams.ALL

    def __init__(self, runtime: RuntimeSettings) -> None:
        self.runtime = runtime
        self.instance = runtime.instance_id()
        self.metrics = ServiceMetrics(self.name)
        self.metrics.export_figures(self._exported_figures)
        self.stopped = asyncio.Event()
        #: Set when a task of the service failed; the entry point then stops it and exits non-zero.
        self.crashed = asyncio.Event()
        self.failure: BaseException | None = None
        self.state = ServiceState.STARTING
        self.started_at = 0.0
        self._bus: Bus | None = None
        self._dead: DeadLetters | None = None
        self._consumers: list[PullConsumer[Any, Any]] = []
        self._responders: list[Responder[Any]] = []
        self._control: list[Responder[Any]] = []
        self._work: list[asyncio.Task[None]] = []
        self._runner: asyncio.Task[None] | None = None
        #: Every task of the runner's TaskGroup, so a stop can cancel each one again.
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics_server: MetricsServer | None = None
        self._starting = False
        self._stopping = False
        self.log = get_logger(instance=self.instance)

    # ------------------------------------------------------------------ subclass hooks

    async def setup(self) -> None:
        """Declare consumers and responders here (``self.consume``, ``self.respond``)."""

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """Long-running work of the service (refill loops, reapers), owned by its TaskGroup.

        A failure there crashes the service (and the supervisor restarts it), like any task.
        """
        return []

    async def teardown(self) -> None:
        """Release what ``setup`` acquired; runs after in-flight work is done or handed back."""

    async def intake_stopped(self) -> None:
        """Runs once intake has stopped, before in-flight work is awaited: a service holding
        work that cannot finish while draining hands it back here."""

    async def intake_ended(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until no consumer can receive a message any more,
        so a message handed back now cannot come straight back; False on the timeout."""
        waits = [asyncio.ensure_future(c.intake_ended()) for c in self._consumers]
        if not waits:
            return True
        _, pending = await asyncio.wait(waits, timeout=timeout_s)
        for wait in pending:
            wait.cancel()
        return not pending

    async def reconnected(self) -> None:
        """Runs in the service's TaskGroup each time the connection to NATS came back.

        Core NATS messages sent while it was away are lost to it (JetStream consumers
        resume by themselves): a service catches up here on what it must not miss.  A
        failure crashes the service, like any of its tasks.
        """

    def served_policy_version(self) -> int | None:
        """The policy version this instance serves, reported in its heartbeats (generators)."""
        return None

    def health(self) -> tuple[bool, str]:
        """(healthy, detail) as reported in heartbeats and to ``temper check``."""
        return self.state is ServiceState.RUNNING and self.bus.nc.is_connected, ""

    def statistics(self) -> dict[str, float]:
        """Published on the stats subject; subclasses extend the runtime's own figures."""
        values = {"in_flight": float(self.in_flight), "uptime_s": time.time() - self.started_at}
        values.update(_counter_totals(self.metrics))
        return values

    def _exported_figures(self) -> dict[str, float]:
        """``statistics()`` for ``/metrics``, less the counter totals Prometheus has already."""
        try:
            values = self.statistics()
        except Exception as error:  # a scrape mid-shutdown still gets the runtime's metrics
            self.log.warning("statistics_failed", error=repr(error))
            return {}
        counted = _counter_totals(self.metrics)
        return {key: value for key, value in values.items() if key not in counted}

    # ------------------------------------------------------------------ declarations

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise ServiceNotStarted(f"{self.name} is not connected")
        return self._bus

    @property
    def dead_letters(self) -> DeadLetters:
        if self._dead is None:
            raise ServiceNotStarted(f"{self.name} is not connected")
        return self._dead

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self._consumers) + sum(
            r.in_flight for r in self._responders
        )

    def consume(
        self,
        spec: ConsumerSpec,
        codec: Codec[M],
        handler: Handler[M],
        tuning: ConsumerTuning | None = None,
    ) -> Consumer[M]:
        return self._add_consumer(Consumer(spec, codec, handler, **self._consumer_deps(tuning)))

    def consume_batch(
        self,
        spec: ConsumerSpec,
        codec: Codec[M],
        handler: BatchHandler[M],
        tuning: ConsumerTuning | None = None,
    ) -> BatchConsumer[M]:
        """Like :meth:`consume`, but ``handler`` takes a whole fetch and returns an outcome
        per message (see ``services.runtime.batch``)."""
        consumer = BatchConsumer(spec, codec, handler, **self._consumer_deps(tuning))
        return self._add_consumer(consumer)

    def _consumer_deps(self, tuning: ConsumerTuning | None) -> _ConsumerDeps:
        return {
            "bus": self.bus,
            "dead_letters": self.dead_letters,
            "metrics": self.metrics,
            "tuning": tuning or ConsumerTuning(),
        }

    def _add_consumer(self, consumer: C) -> C:
        self._consumers.append(consumer)
        return consumer

    def respond(
        self,
        subject: str,
        codec: Decoder[M],
        handler: RequestHandler[M],
        *,
        queue: str | None = None,
        max_in_flight: int = 64,
    ) -> Responder[M]:
        """Serve ``subject``; instances share requests in a queue group (default: service name)."""
        responder = self._responder(subject, codec, handler, queue or self.name, max_in_flight)
        self._responders.append(responder)
        return responder

    def listen(
        self,
        subject: str,
        codec: Decoder[M],
        handler: RequestHandler[M],
        *,
        observer: bool = False,
    ) -> Responder[M]:
        """Receive every message on ``subject`` (no queue group): events such as heartbeats.
        An ``observer`` never replies nor dead-letters (see :class:`Responder`)."""
        responder = self._responder(subject, codec, handler, None, 64, observer=observer)
        self._responders.append(responder)
        return responder

    def _responder(
        self,
        subject: str,
        codec: Decoder[M],
        handler: RequestHandler[M],
        queue: str | None,
        limit: int,
        source: str | None = None,
        *,
        observer: bool = False,
    ) -> Responder[M]:
        return Responder(
            subject,
            codec,
            handler,
            queue=queue,
            source=source or self.name,
            bus=self.bus,
            dead_letters=self.dead_letters,
            metrics=self.metrics,
            max_in_flight=limit,
            observer=observer,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect, declare, subscribe, and start the tasks.  Idempotent."""
        if self._starting:
            return
        self._starting = True
        self.started_at = time.time()
        self._bus = await Bus.connect(self._connect_options())
        self._dead = DeadLetters(self._bus, self.name, self.instance, self.metrics)
        await ensure_streams(
            self._bus.js, streams.with_replicas(self.streams, self.runtime.stream_replicas)
        )
        await self.setup()
        self._control = [
            self._responder(
                subjects.health(self.name),
                _IgnorePayload(),
                self._heartbeat_reply,
                None,
                8,
                CONTROL,
            ),
            self._responder(
                subjects.ping(), _IgnorePayload(), self._heartbeat_reply, None, 8, CONTROL
            ),
        ]
        for responder in (*self._responders, *self._control):
            await responder.subscribe()
        # Once start() returns the server knows every subscription, so a request sent right
        # after is answered instead of getting "no responders".
        await self._bus.flush()
        await self._start_metrics()
        self._runner = asyncio.create_task(self._run(), name=f"{self.name}-runner")
        self.state = ServiceState.RUNNING
        self.metrics.up.labels(service=self.name).set(1)
        self.log.info(
            "service_started", consumers=len(self._consumers), responders=len(self._responders)
        )

    def _connect_options(self) -> ConnectOptions:
        return ConnectOptions(
            url=self.runtime.nats_url,
            name=f"temper-{self.name}-{self.instance}",
            connect_timeout_s=self.runtime.connect_timeout_s,
            reconnect_wait_s=self.runtime.reconnect_wait_s,
        )

    async def _start_metrics(self) -> None:
        host, port = self.runtime.metrics_host, self.runtime.metrics_port
        if port is None:
            return
        server = MetricsServer(self.metrics, host, port)
        try:
            await server.start()
        except OSError as error:
            # Metrics are not worth the work: a busy port (a second stack on this machine)
            # leaves this instance without them, and its heartbeat says so.
            self.log.warning("metrics_unavailable", host=host, port=port, error=str(error))
            return
        self._metrics_server = server
        self.log.info("metrics_listening", url=self.metrics_url)

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server else None

    @property
    def metrics_url(self) -> str:
        """Where ``/metrics`` is served; empty when it is not."""
        port = self.metrics_port
        if port is None:
            return ""
        host = self.runtime.metrics_host
        if host in ("", "0.0.0.0", "::"):  # every interface: this host's name reaches it
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/metrics"

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                intake = [c.run() for c in self._consumers] + [r.run() for r in self._responders]
                self._work = [group.create_task(work) for work in intake]
                self._tasks = [*self._work, *(group.create_task(w) for w in self._loops())]
        except* Exception as group_error:
            self.failure = group_error
            self.log.error("service_failed", error=repr(group_error.exceptions[0]))
            self.crashed.set()

    def _loops(self) -> list[Coroutine[Any, Any, None]]:
        """What the runner runs besides intake (``_work``, which a stop waits for)."""
        return [
            *(control.run() for control in self._control),
            self._every(self.runtime.heartbeat_s, self._send_heartbeat),
            self._every(self.runtime.stats_s, self._send_stats),
            self._follow_reconnects(),
            *self.background(),
        ]

    async def _follow_reconnects(self) -> None:
        reconnects = self.bus.reconnects
        handled = reconnects.count
        while True:
            if reconnects.count == handled:
                await reconnects.wait()
            # One call covers every reconnect counted so far, also those during the last call.
            handled = reconnects.count
            self.log.info("reconnected", reconnects=handled)
            await self.reconnected()

    async def stop(self) -> None:
        """Graceful stop; safe to call twice and from several tasks."""
        if self._stopping:
            await self.stopped.wait()
            return
        self._stopping = True
        try:
            if self._bus is not None:
                await self._drain()
        finally:
            self.state = ServiceState.STOPPED
            self.stopped.set()

    async def _drain(self) -> None:
        self.state = ServiceState.DRAINING
        await self._quietly(self._send_heartbeat)
        for consumer in self._consumers:
            consumer.stop_intake()
        for responder in self._responders:
            await responder.stop_intake()
        self.log.info("intake_stopped", in_flight=self.in_flight)
        await self.intake_stopped()
        await self._wait_in_flight()
        for responder in self._control:
            await responder.stop_intake()
        await self._stop_runner()
        await self.teardown()
        self.state = ServiceState.STOPPED
        self.metrics.up.labels(service=self.name).set(0)
        await self._quietly(self._send_heartbeat)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
            self._metrics_server = None  # metrics_port is None again, instead of raising
        await self.bus.close()
        self.log.info("service_stopped")

    async def _wait_in_flight(self) -> None:
        work = [task for task in self._work if not task.done()]
        if not work:
            return
        _, pending = await asyncio.wait(work, timeout=self.runtime.grace_s)
        if pending:
            handed_back = sum(await asyncio.gather(*(c.hand_back() for c in self._consumers)))
            handed_back += sum(r.cancel_in_flight() for r in self._responders)
            self.log.warning("grace_expired", handed_back=handed_back, grace_s=self.runtime.grace_s)
            await asyncio.wait(pending)
        self.log.info("in_flight_done")

    async def _stop_runner(self) -> None:
        runner = self._runner
        while runner is not None and not runner.done():
            # Python 3.11's asyncio.wait_for, inside nats-py's request and fetch, returns a
            # result that arrives together with the cancel and drops the cancel: a loop
            # answered at that moment runs on.  Cancel what still runs until it has stopped.
            runner.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.wait([runner], timeout=CANCEL_RETRY_S)

    async def wait_stopped(self) -> None:
        await self.stopped.wait()

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ control plane

    def heartbeat(self) -> Heartbeat:
        healthy, detail = self.health() if self._bus is not None else (False, "not connected")
        return Heartbeat(
            service=self.name,
            instance=self.instance,
            state=self.state,
            healthy=healthy,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=self.started_at,
            sent_at=time.time(),
            in_flight=self.in_flight,
            detail=detail,
            policy_version=self.served_policy_version(),
            metrics_url=self.metrics_url,
        )

    async def _heartbeat_reply(self, _: None, request: Request) -> Message | None:
        return self.heartbeat()

    async def _send_heartbeat(self) -> None:
        await self.bus.emit(subjects.heartbeat(self.name), self.heartbeat())

    async def _send_stats(self) -> None:
        stats = Stats(
            service=self.name, instance=self.instance, sent_at=time.time(), values=self.statistics()
        )
        await self.bus.emit(subjects.stats(self.name), stats)

    async def _every(self, interval_s: float, action: Any) -> None:
        while True:
            await self._quietly(action)
            await asyncio.sleep(interval_s)

    async def _quietly(self, action: Any) -> None:
        try:
            await action()
        except Exception as error:  # a lost heartbeat is not worth a crash
            self.log.debug("control_publish_failed", error=repr(error))


def _counter_totals(metrics: ServiceMetrics) -> Mapping[str, float]:
    totals: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.type != "counter":
            continue
        for sample in family.samples:
            # Health probes are not work: they stay in Prometheus but out of the totals.
            if sample.name.endswith("_total") and sample.labels.get("source") != CONTROL:
                key = sample.name.removeprefix("temper_").removesuffix("_total")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals
