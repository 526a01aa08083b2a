"""A gateway killed with ``kill -9`` (a real ``temper serve gateway`` process, a real
generator and nats-server): the session it had closed is on the bus once, before and
after, and the session it held open is reported lost when it starts again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI, NotFoundError

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import ScoredRollout, Stats
from services.generator.service import GeneratorService
from tests.integration.support import Tap, client, serve
from tests.integration.test_cli_harness import free_port
from tests.integration.test_gateway_generation import openai_at
from tests.integration.test_generator_service import _settings as generator_settings

KEY = "sk-kill-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


async def ready(openai: AsyncOpenAI, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                await openai.models.list()
                return
            except Exception:  # not listening yet
                await asyncio.sleep(0.2)


@pytest.fixture
async def generator(nats_url: str, tiny_model: Path) -> AsyncIterator[None]:
    async with GeneratorService(generator_settings(nats_url, tiny_model)):
        yield


async def test_a_killed_gateway_loses_no_closed_session_and_reports_the_open_ones(
    nats_url: str, tiny_model: Path, tmp_path: Path, generator: None
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TEMPER_NATS_URL": nats_url,
        "TEMPER_GATEWAY_MODEL": str(tiny_model),
        "TEMPER_GATEWAY_PORT": str(port),
        "TEMPER_GATEWAY_KEYS": json.dumps({"keys": [{"key": KEY, "tenant": "acme"}]}),
        "TEMPER_GATEWAY_STATE_DIR": str(tmp_path / "state"),
        "TEMPER_GATEWAY_MAX_TOKENS": "6",
        "TEMPER_STATS_S": "0.2",
    }

    def agent(session: str) -> AsyncOpenAI:
        return openai_at(f"http://127.0.0.1:{port}", KEY, session)

    chat = {"model": "temper-policy", "messages": [{"role": "user", "content": "Hi"}]}
    async with client(nats_url) as nc:
        scored, stats = Tap(Codec(ScoredRollout)), Tap(Codec(Stats))
        await nc.subscribe(subjects.scored_all(), cb=scored.on_msg)
        await nc.flush()
        gateway = await serve("gateway", env, tmp_path / "gateway.log")
        try:
            await ready(agent("closed"))
            await agent("closed").chat.completions.create(**chat, n=2)  # type: ignore[call-overload]
            await agent("closed").post(
                "/temper/sessions/closed/reward", body={"reward": 1}, cast_to=object
            )
            await agent("open").chat.completions.create(**chat)  # type: ignore[call-overload]
            await scored.wait(2)
            gateway.send_signal(signal.SIGKILL)
            await gateway.wait()
            await nc.subscribe(subjects.stats("gateway"), cb=stats.on_msg)
            gateway = await serve("gateway", env, tmp_path / "gateway.log")
            await ready(agent("closed"))
            [first] = await stats.wait(1)
            # The closed session is gone from the new gateway, not re-sent by it.
            with pytest.raises(NotFoundError):
                await agent("closed").post(
                    "/temper/sessions/closed/reward", body={"reward": 1}, cast_to=object
                )
            await asyncio.sleep(0.5)  # room for a duplicate to land
        finally:
            if gateway.returncode is None:
                gateway.send_signal(signal.SIGTERM)
                await gateway.wait()
    assert first.values["sessions_lost"] == 1
    ids = [item.id for item in scored.got]
    assert len(ids) == len(set(ids)) == 2
    assert {item.rollout.task.id for item in scored.got} == {scored.got[0].rollout.task.id}


def test_the_journal_counts_what_a_previous_run_left_open(tmp_path: Path) -> None:
    from services.gateway.journal import SessionJournal

    path = tmp_path / "state" / "sessions.journal"
    journal = SessionJournal(path)
    assert journal.recover() == 0
    for session in ("a", "b", "c"):
        journal.opened(session)
    journal.ended("b")
    # Killed here: nothing closed the file.
    assert SessionJournal(path).recover() == 2
    assert SessionJournal(path).recover() == 0  # reported once
    assert SessionJournal(None).recover() == 0


def test_the_journal_keeps_to_the_size_of_what_is_open(tmp_path: Path) -> None:
    from services.gateway.journal import SessionJournal

    path = tmp_path / "sessions.journal"
    journal = SessionJournal(path, compact_after=6)
    journal.recover()
    for number in range(40):
        journal.opened(f"s{number}")
        if number % 4:
            journal.ended(f"s{number}")
        lines = len(path.read_text().splitlines())
        assert lines <= max(6, 2 * (number // 4 + 1)), (number, lines)
    # Killed here: what is open is what the compacted journal says.
    assert SessionJournal(path).recover() == 10
