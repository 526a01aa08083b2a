"""A session scored by a domain's validators: the agent asks the gateway for a problem of
a domain (it gets the question, never the answer key), answers it through the official
``openai`` client, and closes the session with an empty body; the real validator service
scores its rollouts with the problem's answer key, like any rollout of that domain."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client as NATS

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import ScoredRollout, ScoreStatus
from services.domains import load_registry
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.generator.service import GeneratorService
from services.validator import ValidatorService
from tests.integration import test_gateway_generation as generation
from tests.integration.support import Tap, runtime
from tests.integration.test_gateway_generation import KEY, MODEL, openai_at
from tests.integration.test_generator_service import _settings as generator_settings
from tests.integration.test_validator_service import settings as validator_settings

DOMAIN = "arithmetic_sum4"
SESSION = "solve-1"

# A plain connection of the test's own, as the generation tests make it.
nc = generation.nc


@pytest.fixture
async def gateway(nats_url: str, tiny_model: Path) -> AsyncIterator[GatewayService]:
    settings = GatewaySettings(
        runtime=runtime(nats_url, instance="gw-problems"),
        port=0,
        model_id=MODEL,
        model=tiny_model,
        keys=json.dumps({"keys": [{"key": KEY, "tenant": "acme", "rate_per_s": 0}]}),
        call_timeout_s=60,
        max_tokens=24,
    )
    async with (
        ValidatorService(validator_settings(nats_url, instance="v-gw")),
        GeneratorService(generator_settings(nats_url, tiny_model)),
        GatewayService(settings) as service,
    ):
        assert isinstance(service, GatewayService)
        yield service


async def post(gateway: GatewayService, path: str, body: object) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway.url}{path}", json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_a_session_bound_to_a_problem_is_scored_by_its_domains_validators(
    nc: NATS, gateway: GatewayService
) -> None:
    status, problem = await post(
        gateway, f"/v1/temper/sessions/{SESSION}/problem", {"domain": DOMAIN}
    )
    assert status == 200, problem
    # The agent is told the question and the tools, nothing of the answer.
    assert set(problem) == {"object", "session", "domain", "problem", "messages", "tools"}
    assert problem["domain"] == DOMAIN and problem["session"] == SESSION
    session = gateway.sessions.get(gateway.keys.lookup(KEY).key_id, SESSION)
    assert session is not None and session.problem is not None
    bound = session.problem.problem
    assert problem["problem"] == bound.key

    openai = openai_at(gateway.url, KEY, SESSION)
    reply = await openai.chat.completions.create(model=MODEL, messages=problem["messages"])  # type: ignore[arg-type]
    scored_tap = Tap(Codec(ScoredRollout))
    await nc.subscribe(subjects.scored_for_task(session.id), cb=scored_tap.on_msg)
    await nc.flush()

    # A number from the agent is refused: the validators score this session.
    status, refused = await post(gateway, f"/v1/temper/sessions/{SESSION}/reward", {"reward": 1})
    assert status == 409 and refused["error"]["code"] == "scored_by_validators"  # type: ignore[index]
    status, closed = await post(gateway, f"/v1/temper/sessions/{SESSION}/reward", {})
    assert status == 200 and closed["scored_by"] == DOMAIN, closed
    [scored] = await scored_tap.wait(1)

    domain = load_registry().get(DOMAIN)
    assert scored.id == closed["rollouts"][0]  # type: ignore[index]
    assert scored.status is ScoreStatus.SCORED and scored.validator != "gateway"
    assert [d.name for d in scored.details] == [spec.label for spec in domain.validators]
    assert 0.0 <= scored.reward <= 1.0
    # Scored against the bound problem's answer key, on what the agent was answered.
    rollout = scored.rollout
    assert rollout.task.domain == DOMAIN and rollout.task.tenant == "acme"
    assert rollout.task.metadata["answer"] == bound.metadata["answer"]
    assert rollout.task.metadata["key"] == bound.key
    assert rollout.completion_text == reply.choices[0].message.content
    assert gateway.sessions.get(gateway.keys.lookup(KEY).key_id, SESSION) is None
