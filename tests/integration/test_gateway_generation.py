"""The gateway generating through a real generator (torch engine, tiny policy) on a real
nats-server, driven by the official ``openai`` client: answers in OpenAI's shape, the
session recorded token for token as the engine generated it, a multi-turn call that
extends its trajectory without re-tokenizing, streaming, and a reward that turns the
session into scored rollouts on the bus."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from openai import AsyncOpenAI, BadRequestError

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import CallResult, Rollout, ScoredRollout
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.generator.service import GeneratorService
from tests.integration.support import Tap, client, runtime
from tests.integration.test_generator_service import _settings as generator_settings

KEY = "sk-gen-0123456789abcdef"
OTHER_KEY = "sk-other-0123456789abcdef"
MODEL = "temper-policy"
SESSION = "agent-7"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Runs Python code and returns what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


@pytest.fixture
async def stack(nats_url: str, tiny_model: Path) -> AsyncIterator[GatewayService]:
    gateway = GatewaySettings(
        runtime=runtime(nats_url, instance="gw-gen"),
        port=0,
        model_id=MODEL,
        model=tiny_model,
        keys=json.dumps(
            {
                "keys": [
                    {"key": KEY, "tenant": "acme", "rate_per_s": 0},
                    {"key": OTHER_KEY, "tenant": "rival", "rate_per_s": 0},
                ]
            }
        ),
        call_timeout_s=60,
        max_tokens=12,
    )
    async with (
        GeneratorService(generator_settings(nats_url, tiny_model, check_domains=True)),
        GatewayService(gateway) as service,
    ):
        assert isinstance(service, GatewayService)
        yield service


@pytest.fixture
async def answers(nc: NATS) -> Tap:
    """The generators' answers to the gateway's calls, as they crossed the bus."""
    tap = Tap(Codec(CallResult))
    await nc.subscribe(subjects.gateway_replies("gw-gen"), cb=tap.on_msg)
    await nc.flush()
    return tap


def openai_at(url: str, key: str, session: str) -> AsyncOpenAI:
    """The official client on a gateway at ``url``, every call in ``session``."""
    return AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=key,
        default_headers={"X-Temper-Session": session},
        max_retries=0,
        timeout=60,
    )


def openai_client(gateway: GatewayService, session: str = SESSION) -> AsyncOpenAI:
    return openai_at(gateway.url, KEY, session)


def engine_sample(result: CallResult, index: int = 0) -> tuple[list[int], list[int], list[float]]:
    rollout: Rollout = result.rollouts[index]
    ids = [int(i) for i in rollout.token_ids]
    return ids[: rollout.prompt_len], ids[rollout.prompt_len :], list(rollout.behaviour_logprobs)


async def test_a_chat_call_is_answered_and_recorded_as_the_engine_generated_it(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack)
    reply = await openai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        logprobs=True,
        n=2,
        seed=3,
    )
    [result] = await answers.wait(1)
    assert reply.model == MODEL and reply.object == "chat.completion" and len(reply.choices) == 2
    session = stack.sessions.get(stack.keys.lookup(KEY).key_id, SESSION)
    assert session is not None and len(session.trajectories) == 2
    for index, choice in enumerate(reply.choices):
        prompt, completion, logprobs = engine_sample(result, index)
        assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(logprobs)
        # The session holds exactly what the engine was fed and what it sampled.
        trajectory = session.trajectories[index]
        assert trajectory.prompt == prompt and trajectory.completion == completion
        assert trajectory.logprobs == pytest.approx(logprobs) and set(trajectory.mask) == {1}
    assert stack.statistics()["calls_sent"] == 1


async def test_the_next_turn_extends_the_trajectory_token_for_token(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack)
    messages: list[Any] = [
        {"role": "system", "content": "You can use python."},
        {"role": "user", "content": "What is 12345 * 6789?"},
    ]
    first = await openai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    # What an agent does: send back the answer as received, then its tool's output.
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": "call_0", "content": "83810205"}]
    second = await openai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    one, two = await answers.wait(2)
    # Both turns routed as the one trajectory: the server with its prefix serves both.
    assert [r.rollouts[0].task.call.route for r in (one, two)] == [f"{SESSION}/0"] * 2
    prompt1, completion1, _ = engine_sample(one)
    prompt2, completion2, logprobs2 = engine_sample(two)
    # Turn 2's prompt is turn 1's prompt and sampled ids, never re-tokenized, then the rest.
    assert prompt2[: len(prompt1) + len(completion1)] == prompt1 + completion1
    assert stack.statistics()["prompts_extended"] == 1
    session = stack.sessions.get(stack.keys.lookup(KEY).key_id, SESSION)
    assert session is not None and len(session.trajectories) == 1
    [trajectory] = session.trajectories
    assert trajectory.prompt + trajectory.completion == prompt2 + completion2
    between = len(prompt2) - len(prompt1) - len(completion1)
    assert trajectory.mask == [1] * len(completion1) + [0] * between + [1] * len(completion2)
    assert trajectory.logprobs[-len(completion2) :] == pytest.approx(logprobs2)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


async def test_a_rewritten_history_starts_a_new_trajectory(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack)
    messages: list[Any] = [{"role": "user", "content": "Say hi."}]
    first = await openai.chat.completions.create(model=MODEL, messages=messages)
    # The agent edits what the model said before going on.
    edited = {"role": "assistant", "content": (first.choices[0].message.content or "") + "!"}
    await openai.chat.completions.create(
        model=MODEL, messages=[*messages, edited, {"role": "user", "content": "Again."}]
    )
    got = await answers.wait(2)
    session = stack.sessions.get(stack.keys.lookup(KEY).key_id, SESSION)
    assert session is not None and len(session.trajectories) == 2
    assert stack.statistics()["prompts_extended"] == 0
    assert [r.rollouts[0].task.call.route for r in got] == [f"{SESSION}/0", f"{SESSION}/1"]


async def test_a_streamed_call_sends_the_same_answer_in_chunks(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack, session="streamed")
    stream = await openai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to three."}],
        stream=True,
        logprobs=True,
    )
    chunks = [chunk async for chunk in stream]
    [result] = await answers.wait(1)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == result.rollouts[0].completion_text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    streamed = [
        token.logprob
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for token in chunk.choices[0].logprobs.content or []
    ]
    assert streamed == pytest.approx(engine_sample(result)[2])


async def test_a_reward_publishes_the_session_as_scored_rollouts_once(
    stack: GatewayService, answers: Tap, nc: NATS
) -> None:
    scored = Tap(Codec(ScoredRollout))
    await nc.subscribe(subjects.scored_all(), cb=scored.on_msg)
    await nc.flush()
    openai = openai_client(stack)
    await openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2
    )
    [result] = await answers.wait(1)
    # A session is its key's: another key's reward for the same name finds none.
    rival = openai_client(stack).with_options(api_key=OTHER_KEY)
    with pytest.raises(Exception, match="no open session"):
        await rival.post(f"/temper/sessions/{SESSION}/reward", body={"reward": 1}, cast_to=object)
    # The reward route is Temper's own: posted through the client's plain JSON call.
    reward = await openai.post(
        f"/temper/sessions/{SESSION}/reward", body={"rewards": [1.0, 0.25]}, cast_to=object
    )
    assert isinstance(reward, dict) and len(reward["rollouts"]) == 2
    got = await scored.wait(2)
    assert [s.reward for s in got] == [1.0, 0.25]
    for index, item in enumerate(got):
        assert item.rollout.task.domain == "gateway" and item.rollout.task.tenant == "acme"
        assert [int(i) for i in item.rollout.token_ids] == [
            int(i) for i in result.rollouts[index].token_ids
        ]
    # The session is closed: a second reward finds nothing to publish.
    with pytest.raises(Exception, match="no open session"):
        await openai.post(f"/temper/sessions/{SESSION}/reward", body={"reward": 1}, cast_to=object)
    assert stack.statistics()["rollouts_published"] == 2


async def test_a_call_over_the_models_context_is_refused_before_it_is_generated(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack, session="long")
    with pytest.raises(BadRequestError) as refused:
        await openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=10**6
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert error["param"] == "messages" and "context is" in error["message"]
    assert answers.got == [] and stack.statistics().get("calls_sent", 0) == 0


async def test_a_long_call_gets_the_models_context_not_a_generators_task_budget(
    stack: GatewayService, answers: Tap
) -> None:
    # Past the generator's default budget for its own tasks (2048), within the model's.
    prompt = [7] * 2100
    openai = openai_client(stack, session="long-prompt")
    reply = await openai.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    [result] = await answers.wait(1)
    assert reply.usage is not None and reply.usage.prompt_tokens == 2100
    assert engine_sample(result)[0] == prompt
