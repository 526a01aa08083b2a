"""The embedded stack: nats-server plus every registered service, each its own process.

nats-server runs alone, or as a JetStream cluster of several servers whose streams are
kept in several copies (``nats_cluster``, ``stream_replicas``).  A crashed service is
restarted with back-off, and so is a crashed nats-server: on the same port and store
directory, so streams, stored messages and durable consumers are there again and the
services (which reconnect by themselves, to any server of a cluster) carry on.  On stop
(Ctrl-C / SIGTERM) the services get SIGTERM first and drain, stragglers are killed
after the grace period, and nats-server goes last.  Children run in their own
sessions (so a terminal's Ctrl-C reaches only the supervisor, which keeps the order)
and get SIGTERM from the kernel if the supervisor itself dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors

from protocol import streams
from protocol.servers import server_list
from services.runtime.jetstream import ensure_streams
from services.runtime.natscluster import NatsCluster, NatsClusterSettings
from services.runtime.natsserver import NatsServer, NatsServerError, NatsServerSettings
from services.runtime.procs import child_preexec

Say = Callable[[str], None]
#: The name nats-server goes by in what the supervisor says (each of a cluster: its own).
NATS_SERVER = "nats-server"
#: Copies of a stream beyond this add write latency and protect against nothing more here.
MAX_DEFAULT_REPLICAS = 3


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    run_dir: Path = Path("run")
    nats_host: str = "127.0.0.1"
    nats_port: int = 4222
    #: Use this NATS instead of starting one (several servers: comma-separated).
    nats_url: str | None = None
    #: Servers of the embedded NATS: 1 runs one, 3 a JetStream cluster (``nats-1``...) on
    #: ports ``nats_port...`` with routes on ``nats_route_port...`` (0: free ports).
    nats_cluster: int = 1
    nats_route_port: int = 6222
    #: Copies of each stream; ``None``: one per embedded server up to 3, else 1.
    stream_replicas: int | None = None
    services: tuple[str, ...] = ()
    restart_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    #: A service that ran this long without crashing gets its back-off reset.
    stable_after_s: float = 60.0
    stop_grace_s: float = 30.0
    #: Stopped, and waited for, before the other services.
    stop_first: tuple[str, ...] = ("learner",)
    #: Extra environment for every service (settings: ``TEMPER_<SERVICE>_<FIELD>``).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Service -> its ``/metrics`` port (0: a free one); a service not named serves none
    #: unless its own environment says otherwise.
    metrics_ports: Mapping[str, int] = field(default_factory=dict)

    def replicas(self) -> int:
        """Copies of each stream: as set, else one per embedded server (at most 3)."""
        if self.stream_replicas is not None:
            return self.stream_replicas
        if self.nats_url is not None:
            return 1
        return min(self.nats_cluster, MAX_DEFAULT_REPLICAS)


@dataclass
class Child:
    """One supervised process: its restarts and their back-off."""

    name: str
    #: ``None`` for nats-server, whose process the ``NatsServer`` holds.
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0

    def back_off(self, settings: StackSettings) -> tuple[float, float]:
        """(seconds it ran, seconds to wait before the next start): the wait doubles at each
        restart, up to the maximum, and starts over after a stable run."""
        ran = time.monotonic() - self.started_at
        if ran >= settings.stable_after_s:
            self.backoff_s = 0.0
        self.backoff_s = min(
            max(self.backoff_s * 2, settings.restart_backoff_s), settings.max_backoff_s
        )
        self.restarts += 1
        return ran, self.backoff_s


class Supervisor:
    def __init__(self, settings: StackSettings, say: Say = print) -> None:
        self.settings = settings
        self._say = say
        #: The embedded servers by name, and their restart records; empty with an external NATS.
        self._nats: dict[str, NatsServer] = {}
        self._nats_children: dict[str, Child] = {}
        self._children = {name: Child(name) for name in settings.services}
        self._stopping = False
        self.nats_url = settings.nats_url or ""

    @property
    def children(self) -> Mapping[str, Child]:
        return self._children

    @property
    def nats_pid(self) -> int | None:
        """The pid of the (first) embedded nats-server; None with an external NATS."""
        return next((server.pid for server in self._nats.values()), None)

    @property
    def nats_servers(self) -> Mapping[str, NatsServer]:
        """The embedded servers by name: ``nats-server`` alone, ``nats-1``... in a cluster."""
        return self._nats

    @property
    def nats_server(self) -> Child:
        """The (first) nats-server's record (restarts, back-off); blank with an external NATS."""
        return next(iter(self._nats_children.values()), Child(NATS_SERVER))

    def nats_record(self, name: str) -> Child:
        """The restart record of the embedded server ``name``."""
        return self._nats_children[name]

    async def start(self) -> None:
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.run_dir / "logs").mkdir(exist_ok=True)
        if self.settings.nats_url is None:
            self.nats_url = await self._start_nats()
        await self._declare_streams()
        for child in self._children.values():
            await self._spawn(child)

    async def _start_nats(self) -> str:
        """Start the embedded server, or cluster; returns the URL (list) services get."""
        if self.settings.nats_cluster > 1:
            cluster = NatsCluster(self._cluster_settings())
            servers = {server.settings.server_name: server for server in cluster.servers}
            url = await cluster.start()
        else:
            server = NatsServer(
                NatsServerSettings(
                    store_dir=self.settings.run_dir / "nats",
                    host=self.settings.nats_host,
                    port=self.settings.nats_port,
                )
            )
            servers = {NATS_SERVER: server}
            # Started from this thread on purpose: the kernel's parent-death signal is tied to the
            # thread that forked, and a pool thread may exit while nats-server should live on.
            url = server.start()
        for name, server in servers.items():
            self._nats[name] = server
            self._nats_children[name] = Child(name, started_at=time.monotonic())
            self._say_nats_started(name)
        return url

    def _cluster_settings(self) -> NatsClusterSettings:
        return NatsClusterSettings.consecutive(
            self.settings.run_dir / "nats-cluster",
            self.settings.nats_cluster,
            port=self.settings.nats_port,
            route_port=self.settings.nats_route_port,
            host=self.settings.nats_host,
        )

    def _say_nats_started(self, name: str) -> None:
        server = self._nats[name]
        self._say(f"{name:<12} {server.url}  (pid {server.pid})")

    async def _declare_streams(self) -> None:
        nc = await nats.connect(
            server_list(self.nats_url), max_reconnect_attempts=0, allow_reconnect=False
        )
        try:
            specs = streams.with_replicas(streams.ALL, self.settings.replicas())
            await ensure_streams(nc.jetstream(), specs)
        finally:
            await nc.close()

    async def _spawn(self, child: Child) -> None:
        log_path = self.settings.run_dir / "logs" / f"{child.name}.log"
        env = {
            **os.environ,
            **self.settings.env,
            "TEMPER_NATS_URL": self.nats_url,
            # Services declare the streams too, and must ask for the copies the stack keeps.
            "TEMPER_STREAM_REPLICAS": str(self.settings.replicas()),
        }
        # A service must hand its work back before the supervisor's own grace runs out.
        env.setdefault("TEMPER_GRACE_S", f"{max(self.settings.stop_grace_s - 2.0, 0.1):g}")
        port = self.settings.metrics_ports.get(child.name)
        if port is not None:  # a port the user set for this service stays
            env.setdefault(f"TEMPER_{child.name.upper()}_RUNTIME_METRICS_PORT", str(port))
        with log_path.open("ab") as log:
            child.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services",
                "serve",
                child.name,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=child_preexec(),
            )
        child.started_at = time.monotonic()
        self._say(f"{child.name:<12} started (pid {child.proc.pid}, log {log_path})")

    async def watch(self, stop: asyncio.Event) -> None:
        """Restart crashed children, and a crashed nats-server, until ``stop`` is set."""
        while not stop.is_set():
            waits = {
                asyncio.ensure_future(c.proc.wait()): c for c in self._children.values() if c.proc
            }
            for name, server in self._nats.items():
                waits[asyncio.ensure_future(server.exited())] = self._nats_children[name]
            stopper = asyncio.ensure_future(stop.wait())
            done, pending = await asyncio.wait(
                [stopper, *waits], return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                if task in waits and not stop.is_set():
                    if waits[task].name in self._nats:
                        await self._restart_nats(waits[task], task.result(), stop)
                    else:
                        await self._restart(waits[task], stop)

    async def _restart(self, child: Child, stop: asyncio.Event) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        ran, wait = child.back_off(self.settings)
        self._say(f"{child.name:<12} exited with {code} after {ran:.1f}s; restart in {wait:.1f}s")
        if not await _stopped_within(stop, wait):
            await self._spawn(child)

    async def _restart_nats(self, record: Child, code: int, stop: asyncio.Event) -> None:
        """Start a nats-server again on its port and store, backing off as long as it fails.

        Same port: the services and clients reconnect to the URL they know.  Same store: the
        streams come back with their messages and durable consumers.  A server of a cluster
        rejoins it and catches up on what the others stored meanwhile.
        """
        server = self._nats[record.name]
        ran, wait = record.back_off(self.settings)
        why = f"exited with {code} after {ran:.1f}s"
        while True:
            self._say(f"{record.name:<12} {why}; restart in {wait:.1f}s")
            if await _stopped_within(stop, wait):
                return
            record.started_at = time.monotonic()
            try:
                await server.start_async()
                break
            except (NatsServerError, OSError) as error:
                why = f"did not start ({error})"
                _, wait = record.back_off(self.settings)
        self._say_nats_started(record.name)
        await self._declare_streams_again(record.name)

    async def _declare_streams_again(self, name: str) -> None:
        """Streams live in the store and so survive; declared again in case it was lost."""
        try:
            await self._declare_streams()
        except (OSError, nats.errors.Error, TimeoutError) as error:
            self._say(
                f"{name:<12} streams not declared again ({error!r}); "
                "each service declares its own when it starts"
            )

    async def stop(self) -> None:
        """Services first (SIGTERM, grace, SIGKILL), then nats-server.  Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        for wave in self._stop_waves():
            running = [c for c in wave if c.proc and c.proc.returncode is None]
            for child in running:
                _signal(child, signal.SIGTERM)
            if running:
                names = ", ".join(c.name for c in running)
                self._say(f"stopping {names} (grace {self.settings.stop_grace_s:.0f}s)")
                await self._reap(running)
        for name, server in self._nats.items():
            server.stop()
            self._say(f"{name} stopped")

    def _stop_waves(self) -> list[list[Child]]:
        """Services named in ``stop_first`` stop (and finish) before the rest: the learner's
        last commit needs the replay buffer still answering."""
        first = [c for c in self._children.values() if c.name in self.settings.stop_first]
        rest = [c for c in self._children.values() if c.name not in self.settings.stop_first]
        return [wave for wave in (first, rest) if wave]

    async def _reap(self, children: Sequence[Child]) -> None:
        waits = [c.proc.wait() for c in children if c.proc]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout=self.settings.stop_grace_s)
        except TimeoutError:
            for child in children:
                if child.proc and child.proc.returncode is None:
                    self._say(f"{child.name:<12} did not stop in time: killed")
                    _signal(child, signal.SIGKILL)
            await asyncio.gather(*(c.proc.wait() for c in children if c.proc))


async def _stopped_within(stop: asyncio.Event, wait_s: float) -> bool:
    """Wait up to ``wait_s``; True if ``stop`` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=wait_s)
    return stop.is_set()


def _signal(child: Child, sig: int) -> None:
    if child.proc is not None and child.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.proc.pid, sig)
