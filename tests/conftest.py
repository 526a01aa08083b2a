"""Shared fixtures.  Integration tests get their own real nats-server on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsserver import RANDOM_PORT, NatsServer, NatsServerSettings


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream, storing under the test's tmp dir.

    There is no skip path: nats-server comes from a required dependency, so a
    missing binary is a broken install and the test must fail.
    """
    server = NatsServer(NatsServerSettings(store_dir=tmp_path / "nats", port=RANDOM_PORT))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url
