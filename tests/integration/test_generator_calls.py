"""Gateway calls through the generator (torch engine, real nats-server): a task that
carries a ``GatewayCall`` is generated like any task, and its samples go back to the
call's reply subject as one CallResult, never to the rollout stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.messages import (
    CallResult,
    ChatMessage,
    GatewayCall,
    RolloutStatus,
    SamplingParams,
    Task,
)
from protocol.packed import pack_i32
from services.generator.service import GeneratorService
from services.model.tokens import ChatTokenizer
from tests.integration.support import Tap, client, stream_count
from tests.integration.test_generator_service import RolloutTap, _settings, _submit

RESULTS: Codec[CallResult] = Codec(CallResult)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


def _call(task_id: str, prompt: list[int], *, n: int, new_samples: int) -> Task:
    return Task(
        id=task_id,
        # Not a registered domain: a call is only scheduled by it, never scored by it.
        domain="gateway",
        tenant="acme",
        prompt_tokens=pack_i32(prompt),
        sampling=SamplingParams(max_tokens=6, seed=11),
        n=n,
        call=GatewayCall(
            reply=subjects.gateway_reply("gw-test", task_id),
            route="gw-session/0",
            new_samples=new_samples,
        ),
    )


async def test_a_call_is_answered_on_its_reply_subject_and_never_published(
    nats_url: str, nc: NATS, tiny_model: Path
) -> None:
    replies, tap = Tap(RESULTS), RolloutTap()
    # Only the call's own reply subject: an answer sent anywhere else is never heard.
    await nc.subscribe(subjects.gateway_reply("gw-test", "gw-call-1"), cb=replies.on_msg)
    await nc.subscribe(subjects.rollouts(), cb=tap.on_msg)
    await nc.flush()
    prompt = ChatTokenizer.load(tiny_model).render([ChatMessage(role="user", content="2 + 2?")])
    # Domains are checked (the default registry): the call's domain is not in it.
    settings = _settings(nats_url, tiny_model, check_domains=True, admission_samples=8)
    async with GeneratorService(settings) as service:
        await _submit(nc.jetstream(), _call("gw-call-1", prompt, n=2, new_samples=1))
        [result] = await replies.wait(1)
        await asyncio.sleep(0.3)  # room for a wrong publish to the rollout stream to land
        stats = service.statistics()
        reserved = service.admission.started
    assert result.task_id == "gw-call-1"
    assert [r.sample_index for r in result.rollouts] == [0, 1]
    for rollout in result.rollouts:
        assert rollout.status is RolloutStatus.OK, rollout.error
        assert list(rollout.token_ids[: rollout.prompt_len]) == prompt
        completion = len(rollout.token_ids) - rollout.prompt_len
        assert 1 <= completion <= 6 and len(rollout.behaviour_logprobs) == completion
        assert rollout.segments[0].version == 0
    assert tap.got == []
    assert stats["call_samples_ok"] == 2 and stats["rollouts_ok"] == 0
    # The call waited at the staleness admission but reserved nothing there.
    assert reserved == 0
    assert await stream_count(nc.jetstream(), streams.task_stream_name(1)) == 0
