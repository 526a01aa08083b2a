"""A client that goes away mid-call (the official ``openai`` client timing out): the
gateway cancels the call on the generators, the generator serving it stops and frees its
place, nothing is answered for it and nothing of it is recorded in its session.

The call is held at the generator's staleness admission (a task ahead of the learner
fills it) so that the client is certainly gone before anything was generated; the
engines' own stop of rows in flight is tested with each engine (tests/unit)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import openai
import pytest
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import CallResult
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.generator.service import GeneratorService
from tests.integration import test_gateway_generation as generation
from tests.integration.support import Tap, runtime
from tests.integration.test_gateway_generation import KEY, MODEL, SESSION, openai_at
from tests.integration.test_generator_service import _settings as generator_settings
from tests.integration.test_generator_service import _submit, _task

#: Samples the generator may start ahead of the learner: one task of two fills it.
BUDGET = 2

# A plain connection of the test's own, as the generation tests make it.
nc = generation.nc


@pytest.fixture
async def generator(nats_url: str, tiny_model: Path) -> AsyncIterator[GeneratorService]:
    settings = generator_settings(nats_url, tiny_model, admission_samples=BUDGET)
    async with GeneratorService(settings) as service:
        assert isinstance(service, GeneratorService)
        yield service


@pytest.fixture
async def gateway(
    nats_url: str, tiny_model: Path, generator: GeneratorService
) -> AsyncIterator[GatewayService]:
    settings = GatewaySettings(
        runtime=runtime(nats_url, instance="gw-cancel"),
        port=0,
        model_id=MODEL,
        model=tiny_model,
        keys=json.dumps({"keys": [{"key": KEY, "tenant": "acme", "rate_per_s": 0}]}),
        call_timeout_s=60,
        max_tokens=8,
    )
    async with GatewayService(settings) as service:
        assert isinstance(service, GatewayService)
        yield service


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.05)


async def test_a_client_gone_mid_call_cancels_it_and_nothing_is_recorded(
    nc: NATS, generator: GeneratorService, gateway: GatewayService
) -> None:
    answers = Tap(Codec(CallResult))
    await nc.subscribe(subjects.gateway_replies("gw-cancel"), cb=answers.on_msg)
    await nc.flush()
    await _submit(nc.jetstream(), _task("ahead", n=BUDGET))
    await until(lambda: generator.admission.started == BUDGET)

    impatient = openai_at(gateway.url, KEY, SESSION).with_options(timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        await impatient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is 2 + 3?"}]
        )
    # The generator stops the call it held and frees its place; the gateway kept nothing.
    await until(lambda: generator.cancels.stopped == 1)
    await until(lambda: generator.in_flight == 0)
    assert gateway.statistics()["calls_cancelled"] == 1
    assert gateway.sessions.get(gateway.keys.lookup(KEY).key_id, SESSION) is None

    # Room again (the learner trained the task ahead): the cancelled call stays unanswered,
    # and the next call is served as usual.
    generator.admission.learner_trained(BUDGET)
    patient = openai_at(gateway.url, KEY, SESSION)
    reply = await patient.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 4 + 5?"}]
    )
    [result] = await answers.wait(1)
    assert reply.choices and result.rollouts
    session = gateway.sessions.get(gateway.keys.lookup(KEY).key_id, SESSION)
    assert session is not None and len(session.trajectories) == 1
    assert generator.statistics()["calls_cancelled_running"] == 1
