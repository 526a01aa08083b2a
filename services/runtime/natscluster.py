"""Run a JetStream cluster of real ``nats-server`` processes on this machine.

Each server is a :class:`NatsServer` with its own client port, route port and store
directory; all of them route to each other.  ``start()`` returns once the JetStream
meta leader is elected, when streams can be declared.  Used by ``temper up
--nats-cluster 3`` and the cluster tests; a production cluster puts one server per
host (docs/operations.md, "NATS cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import nats
import nats.errors
import nats.js.errors

from services.runtime.natsserver import (
    RANDOM_PORT,
    ClusterRoutes,
    NatsServer,
    NatsServerError,
    NatsServerSettings,
)

#: nats-server's Raft election timeout, drawn anew for each election from this range and
#: fixed in the server: how long the survivors of a lost leader wait before they elect one.
ELECTION_TIMEOUT_S: Final = (4.0, 9.0)
#: How often a forming cluster is asked for its meta leader.
_LEADER_POLL_S: Final = 0.2
#: What asking the JetStream API gives while there is no meta leader: mostly silence.
_NO_LEADER_YET: Final = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.APIError,
)


@dataclass(frozen=True, kw_only=True)
class NatsClusterSettings:
    """The servers of one cluster, all on ``host``; ``ports`` and ``route_ports`` pair up."""

    #: Each server stores under ``store_dir/<server name>``.
    store_dir: Path
    #: Client port of each server (``RANDOM_PORT``: each picks one); their count is the size.
    ports: tuple[int, ...]
    #: Route port of each server: fixed, since every server names all of them.
    route_ports: tuple[int, ...]
    name: str = "temper"
    host: str = "127.0.0.1"
    #: Starting servers, then electing the meta leader, must not take longer than this.
    leader_timeout_s: float = 30.0
    binary: str | None = None

    def __post_init__(self) -> None:
        if not self.ports or len(self.ports) != len(self.route_ports):
            raise ValueError(
                f"a cluster needs one route port per server: {self.ports} / {self.route_ports}"
            )

    @classmethod
    def consecutive(
        cls, store_dir: Path, size: int, port: int, route_port: int, host: str = "127.0.0.1"
    ) -> NatsClusterSettings:
        """``size`` servers on client ports ``port, port+1, ...`` and route ports likewise.

        ``port`` ``RANDOM_PORT`` lets each server pick its client port; ``route_port`` 0
        takes route ports free right now.
        """
        ports = [port] * size if port == RANDOM_PORT else range(port, port + size)
        routes = free_ports(host, size) if route_port == 0 else range(route_port, route_port + size)
        return cls(store_dir=store_dir, ports=tuple(ports), route_ports=tuple(routes), host=host)

    def server_names(self) -> list[str]:
        return [f"nats-{index + 1}" for index in range(len(self.ports))]

    def servers(self) -> list[NatsServerSettings]:
        routes = tuple(f"nats-route://{self.host}:{port}" for port in self.route_ports)
        return [
            NatsServerSettings(
                store_dir=self.store_dir / name,
                host=self.host,
                port=port,
                binary=self.binary,
                server_name=name,
                cluster=ClusterRoutes(name=self.name, port=route_port, routes=routes),
            )
            for name, port, route_port in zip(
                self.server_names(), self.ports, self.route_ports, strict=True
            )
        ]


class NatsCluster:
    """The servers of a cluster.  ``start()`` returns once JetStream has its meta leader."""

    def __init__(self, settings: NatsClusterSettings) -> None:
        self.settings = settings
        self.servers = tuple(NatsServer(server) for server in settings.servers())

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Every server's client URL, comma-separated: what ``TEMPER_NATS_URL`` takes."""
        return ",".join(self.urls)

    async def start(self) -> str:
        """Start every server, then wait for the meta leader; returns :attr:`url`.

        Call it from the event loop's own thread (see ``NatsServer.start_async``).
        """
        deadline = time.monotonic() + self.settings.leader_timeout_s
        try:
            for server in self.servers:
                await server.start_async()
            await wait_for_meta_leader(self.urls, deadline - time.monotonic())
        except BaseException:
            self.kill()
            raise
        return self.url

    def stop(self) -> None:
        """Graceful stop of every server (each: SIGTERM, then SIGKILL after its grace)."""
        for server in self.servers:
            server.stop()

    def kill(self) -> None:
        for server in self.servers:
            server.kill()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports nothing listens on (all held open until all are found)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


async def wait_for_meta_leader(urls: list[str], timeout_s: float) -> None:
    """Return once the cluster at ``urls`` answers JetStream API requests.

    Without a meta leader the API stays silent (or says it is unavailable), so an answer
    to an account-info request is the sign that streams can be declared now.
    """
    deadline = time.monotonic() + timeout_s
    nc = await nats.connect(urls, max_reconnect_attempts=0, allow_reconnect=False)
    js = nc.jetstream(timeout=1.0)
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(*_NO_LEADER_YET):
                await js.account_info()
                return
            await asyncio.sleep(_LEADER_POLL_S)
    finally:
        await nc.close()
    raise NatsServerError(f"no JetStream meta leader after {timeout_s:.0f}s")
