"""The weight transaction over a real nats-server: acks collected from the live generators
with a bound, a generator that never loads reported lagging (by the learner's round and by
``temper.v1.control.status``), and a generator that was cut off catching up at once when
its connection comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, StackStatus, WeightSyncAck
from services.control import ControlService, ControlSettings
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.learner.acks import AckSettings, GeneratorReport, WeightAcks
from services.model.tiny import TinyModelSpec, init_model
from services.model.weights import directory_digest
from services.runtime.service import Service
from services.runtime.settings import RuntimeSettings
from tests.integration.support import client, runtime


class LearnerStandIn(Service):
    """Owns a WeightAcks the way the learner does: subscribed in setup, rounds in the background."""

    name = "learner"
    streams = (streams.POLICY,)

    def __init__(self, runtime: RuntimeSettings, settings: AckSettings) -> None:
        super().__init__(runtime)
        self.acks = WeightAcks(settings, structlog.get_logger())

    async def setup(self) -> None:
        self.acks.listen(self)


class StuckGenerator(Service):
    """Heartbeats as a generator serving ``version``, and never loads anything."""

    name = "generator"
    streams = ()

    def __init__(self, runtime: RuntimeSettings, version: int) -> None:
        super().__init__(runtime)
        self.version = version

    def served_policy_version(self) -> int:
        return self.version


def generator_settings(url: str, model: Path, instance: str) -> GeneratorSettings:
    return GeneratorSettings(
        runtime=runtime(url, instance=instance),
        model=model,
        tools="local",
        check_domains=False,
        fetch_wait_s=0.2,
        max_concurrent_tasks=1,
        prefix_cache_mb=16,
    )


def weights(path: Path, version: int, seed: int) -> PolicyUpdate:
    made = init_model(path, TinyModelSpec(seed=seed))
    return PolicyUpdate(version=version, uri=str(made), digest=directory_digest(made))


async def test_a_round_reports_the_generator_that_never_loads_as_lagging(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    update = weights(tmp_path / "v1", 1, seed=1)
    fast = runtime(nats_url, instance="learner")
    learner = LearnerStandIn(fast, AckSettings(timeout_s=30.0, live_after_s=2.0))
    control = ControlService(
        ControlSettings(runtime=runtime(nats_url, instance="ctl"), lagging_after_s=0.5)
    )
    async with (
        asyncio.timeout(90),
        client(nats_url) as nc,
        learner,
        control,
        GeneratorService(generator_settings(nats_url, tiny_model, "gen-real")),
        StuckGenerator(runtime(nats_url, instance="gen-stuck"), version=0),
    ):
        await _until(lambda: len(learner.acks.book.live(time.monotonic())) == 2)
        await nc.jetstream().publish(subjects.policy_update(), encode(update))

        started = time.monotonic()
        done = await learner.acks.collect(1, timeout_s=3.0)
        assert 3.0 <= time.monotonic() - started < 5.0
        assert done.acked == (GeneratorReport("gen-real", 1),)
        assert done.lagging == (GeneratorReport("gen-stuck", 0),)
        assert done.failed == ()

        async with await TemperClient.connect(nats_url) as temper:
            status = await _status_until(temper, lambda s: _lagging(s) == {"gen-stuck": 0})
        versions = {s.instance: s.policy_version for s in status.services}
        assert versions["gen-real"] == 1 and versions["ctl"] is None


async def test_a_generator_cut_off_during_an_update_catches_up_when_it_reconnects(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    update = weights(tmp_path / "v7", 7, seed=7)
    acks: list[WeightSyncAck] = []

    async def on_ack(msg: Msg) -> None:
        acks.append(Codec(WeightSyncAck).decode(msg.data))

    async with asyncio.timeout(90), client(nats_url) as nc, Proxy.to(nats_url) as proxy:
        await nc.subscribe(subjects.weight_ack("generator"), cb=on_ack)
        generator = GeneratorService(generator_settings(proxy.url, tiny_model, "gen-cut"))
        async with generator:
            assert generator.version == 0
            await _until_pulling(nc)
            await proxy.cut()
            await _until(lambda: not generator.bus.nc.is_connected)
            # Announced while the generator cannot hear it: only the stream keeps it.
            await nc.jetstream().publish(subjects.policy_update(), encode(update))
            await asyncio.sleep(0.3)
            assert generator.version == 0
            proxy.restore()
            await _until(lambda: generator.version == 7, timeout_s=10.0)
            await _until(
                lambda: [(a.instance, a.version, a.ok) for a in acks] == [("gen-cut", 7, True)]
            )
            assert not generator.crashed.is_set()


class Proxy:
    """A TCP relay to the server that a test can cut: the fault sits at the transport."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._open = True
        self.url = ""

    @classmethod
    @contextlib.asynccontextmanager
    async def to(cls, url: str) -> AsyncIterator[Proxy]:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        proxy = cls(host, int(port))
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.url = f"nats://127.0.0.1:{proxy._server.sockets[0].getsockname()[1]}"
        try:
            yield proxy
        finally:
            await proxy.cut()
            proxy._server.close()
            await proxy._server.wait_closed()

    async def cut(self) -> None:
        """Drop every relayed connection and refuse new ones until :meth:`restore`."""
        self._open = False
        for writer in list(self._links):
            writer.close()
        await asyncio.sleep(0)

    def restore(self) -> None:
        self._open = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._links.update((writer, up_writer))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pipe(reader, up_writer))
                group.create_task(self._pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self._links.discard(end)
                end.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()  # one side ended: end the other, as a dropped link would


async def _until_pulling(nc: NATS) -> None:
    """Until every tier's intake was seen asking its stream for work (the generator polls
    each tier stream's backlog): the service's start-up requests are answered, so a cut
    interrupts intake, which recovers, and nothing else."""
    asked: set[str] = set()
    every = asyncio.Event()

    async def on_info(msg: Msg) -> None:
        asked.add(msg.subject.rsplit(".", 1)[-1])
        if asked >= {spec.name for spec in streams.TASK_STREAMS}:
            every.set()

    sub = await nc.subscribe("$JS.API.STREAM.INFO.*", cb=on_info)
    try:
        async with asyncio.timeout(30):
            await every.wait()
    finally:
        await sub.unsubscribe()


def _lagging(status: StackStatus) -> dict[str, int | None]:
    return {s.instance: s.policy_version for s in status.services if s.lagging}


async def _status_until(temper: TemperClient, predicate: object) -> StackStatus:
    async with asyncio.timeout(10):
        while True:
            status = await temper.status(timeout_s=1.0)
            if predicate(status):  # type: ignore[operator]
                return status
            await asyncio.sleep(0.05)


async def _until(predicate: object, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)
