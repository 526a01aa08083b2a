"""Routing of requests over SGLang servers: sticky by trajectory, else least loaded."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass
class ServerState:
    url: str
    in_flight: int = 0
    requests: int = 0
    healthy: bool = True
    version: int = 0


class StickyRouter:
    """Chooses a server per request: sticky by trajectory, else least requests in flight.

    Pure bookkeeping (no I/O), so it is tested without servers.  When every server is
    marked unhealthy all are candidates again: a mark is a hint, and a server that comes
    back is used without waiting for a health probe.
    """

    def __init__(self, urls: Sequence[str], capacity: int = 65_536) -> None:
        if not urls:
            raise ValueError("StickyRouter needs at least one server")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate server URLs: {list(urls)}")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.servers: dict[str, ServerState] = {url: ServerState(url) for url in urls}
        self.capacity = capacity
        self._sticky: OrderedDict[str, str] = OrderedDict()

    def choose(self, trajectory_id: str = "") -> str:
        """The server for the next request of ``trajectory_id`` ("" = no stickiness)."""
        pinned = self._sticky.get(trajectory_id) if trajectory_id else None
        if pinned is not None and self.servers[pinned].healthy:
            self._sticky.move_to_end(trajectory_id)
            return pinned
        url = self._least_loaded()
        if trajectory_id:
            self._sticky[trajectory_id] = url
            self._sticky.move_to_end(trajectory_id)
            while len(self._sticky) > self.capacity:
                self._sticky.popitem(last=False)
        return url

    def _least_loaded(self) -> str:
        states = list(self.servers.values())
        candidates = [s for s in states if s.healthy] or states
        # Ties go to the server that served fewer requests, then to list order.
        return min(candidates, key=lambda s: (s.in_flight, s.requests)).url

    @contextlib.contextmanager
    def lease(self, trajectory_id: str = "") -> Iterator[str]:
        """Choose a server and count the request as in flight on it until the block ends."""
        url = self.choose(trajectory_id)
        state = self.servers[url]
        state.in_flight += 1
        state.requests += 1
        try:
            yield url
        finally:
            state.in_flight -= 1

    def pinned(self, trajectory_id: str) -> str | None:
        return self._sticky.get(trajectory_id)

    def forget(self, trajectory_id: str) -> None:
        self._sticky.pop(trajectory_id, None)

    def mark(self, url: str, *, healthy: bool) -> None:
        self.servers[url].healthy = healthy

    def __len__(self) -> int:
        return len(self._sticky)
