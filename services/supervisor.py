"""The embedded stack: nats-server plus every registered service, each its own process.

A crashed service is restarted with back-off, and so is a crashed nats-server: on the
same port and store directory, so streams, stored messages and durable consumers are
there again and the services (which reconnect by themselves) carry on.  On stop
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
from services.runtime.jetstream import ensure_streams
from services.runtime.natsserver import NatsServer, NatsServerError, NatsServerSettings
from services.runtime.procs import child_preexec

Say = Callable[[str], None]
#: The name nats-server goes by in what the supervisor says.
NATS_SERVER = "nats-server"


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    run_dir: Path = Path("run")
    nats_host: str = "127.0.0.1"
    nats_port: int = 4222
    #: Use this NATS instead of starting one.
    nats_url: str | None = None
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
        self._nats: NatsServer | None = None
        self._server = Child(NATS_SERVER)
        self._children = {name: Child(name) for name in settings.services}
        self._stopping = False
        self.nats_url = settings.nats_url or ""

    @property
    def children(self) -> Mapping[str, Child]:
        return self._children

    @property
    def nats_pid(self) -> int | None:
        """The running nats-server's pid (None with an external NATS)."""
        return self._nats.pid if self._nats is not None else None

    @property
    def nats_server(self) -> Child:
        """nats-server's record (restarts, back-off); meaningless with an external NATS."""
        return self._server

    async def start(self) -> None:
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.run_dir / "logs").mkdir(exist_ok=True)
        if self.settings.nats_url is None:
            self._nats = NatsServer(
                NatsServerSettings(
                    store_dir=self.settings.run_dir / "nats",
                    host=self.settings.nats_host,
                    port=self.settings.nats_port,
                )
            )
            # Started from this thread on purpose: the kernel's parent-death signal is tied to the
            # thread that forked, and a pool thread may exit while nats-server should live on.
            self.nats_url = self._nats.start()
            self._server.started_at = time.monotonic()
            self._say_nats_started()
        await self._declare_streams()
        for child in self._children.values():
            await self._spawn(child)

    def _say_nats_started(self) -> None:
        assert self._nats is not None
        self._say(f"{NATS_SERVER}  {self.nats_url}  (pid {self._nats.pid})")

    async def _declare_streams(self) -> None:
        nc = await nats.connect(self.nats_url, max_reconnect_attempts=0, allow_reconnect=False)
        try:
            await ensure_streams(nc.jetstream(), streams.ALL)
        finally:
            await nc.close()

    async def _spawn(self, child: Child) -> None:
        log_path = self.settings.run_dir / "logs" / f"{child.name}.log"
        env = {**os.environ, **self.settings.env, "TEMPER_NATS_URL": self.nats_url}
        # A service must hand its work back before the supervisor's own grace runs out.
        env.setdefault("TEMPER_GRACE_S", f"{max(self.settings.stop_grace_s - 2.0, 0.1):g}")
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
            if self._nats is not None:
                waits[asyncio.ensure_future(self._nats.exited())] = self._server
            stopper = asyncio.ensure_future(stop.wait())
            done, pending = await asyncio.wait(
                [stopper, *waits], return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                if task in waits and not stop.is_set():
                    if waits[task] is self._server:
                        await self._restart_nats(task.result(), stop)
                    else:
                        await self._restart(waits[task], stop)

    async def _restart(self, child: Child, stop: asyncio.Event) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        ran, wait = child.back_off(self.settings)
        self._say(f"{child.name:<12} exited with {code} after {ran:.1f}s; restart in {wait:.1f}s")
        if not await _stopped_within(stop, wait):
            await self._spawn(child)

    async def _restart_nats(self, code: int, stop: asyncio.Event) -> None:
        """Start nats-server again on its port and store, backing off as long as it fails.

        Same port: the services and clients reconnect to the URL they know.  Same store: the
        streams come back with their messages and durable consumers.
        """
        assert self._nats is not None
        ran, wait = self._server.back_off(self.settings)
        why = f"exited with {code} after {ran:.1f}s"
        while True:
            self._say(f"{NATS_SERVER:<12} {why}; restart in {wait:.1f}s")
            if await _stopped_within(stop, wait):
                return
            self._server.started_at = time.monotonic()
            try:
                await self._nats.start_async()
                break
            except (NatsServerError, OSError) as error:
                why = f"did not start ({error})"
                _, wait = self._server.back_off(self.settings)
        self._say_nats_started()
        await self._declare_streams_again()

    async def _declare_streams_again(self) -> None:
        """Streams live in the store and so survive; declared again in case it was lost."""
        try:
            await self._declare_streams()
        except (OSError, nats.errors.Error, TimeoutError) as error:
            self._say(
                f"{NATS_SERVER:<12} streams not declared again ({error!r}); "
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
        if self._nats is not None:
            self._nats.stop()
            self._say("nats-server stopped")

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
