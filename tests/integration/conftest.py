"""Fixtures of the sandbox agent's tests on the host (a real agent process, no Docker)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.sandbox.agent_client import AgentClient
from tests.integration.test_sandbox_agent import RunningAgent, start_agent


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    with start_agent(tmp_path) as running:
        yield running


@pytest.fixture
async def client(agent: RunningAgent) -> AsyncIterator[AgentClient]:
    connected = await AgentClient.connect(agent.socket, timeout_s=10.0)
    try:
        yield connected
    finally:
        await connected.close()
