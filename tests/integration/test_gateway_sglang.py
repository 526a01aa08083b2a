"""The gateway generating on the real CPU SGLang server: a two-turn conversation through the
official ``openai`` client is recorded as the server generated it, and its next turn
extends the first token for token, as on the torch engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from protocol import subjects
from protocol.codec import Codec
from protocol.messages import CallResult
from services.engines.sglang.server import SGLangServer
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.generator.service import GeneratorService
from tests.integration.support import Tap, client, runtime
from tests.integration.test_gateway_generation import engine_sample
from tests.integration.test_generator_sglang import sglang_generator

KEY = "sk-sglang-0123456789abcdef"


async def test_a_conversation_through_the_gateway_on_sglang(
    nats_url: str, sglang_server: SGLangServer, tiny_model: Path
) -> None:
    generator = sglang_generator(nats_url, sglang_server, tiny_model, instance="gen-gw-sglang")
    gateway = GatewaySettings(
        runtime=runtime(nats_url, instance="gw-sglang"),
        port=0,
        model=tiny_model,
        keys=json.dumps({"keys": [{"key": KEY, "tenant": "acme", "rate_per_s": 0}]}),
        call_timeout_s=60,
        max_tokens=8,
    )
    answers = Tap(Codec(CallResult))
    async with (
        client(nats_url) as nc,
        GeneratorService(generator),
        GatewayService(gateway) as service,
    ):
        assert isinstance(service, GatewayService)
        await nc.subscribe(subjects.gateway_replies("gw-sglang"), cb=answers.on_msg)
        await nc.flush()
        openai = AsyncOpenAI(
            base_url=f"{service.url}/v1",
            api_key=KEY,
            default_headers={"X-Temper-Session": "on-sglang"},
            max_retries=0,
        )
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 2?"}]
        first = await openai.chat.completions.create(
            model="temper-policy", messages=messages, logprobs=True
        )
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "Are you sure?"}]
        await openai.chat.completions.create(model="temper-policy", messages=messages)
        one, two = await answers.wait(2)
        session = service.sessions.get(service.keys.lookup(KEY).key_id, "on-sglang")
        assert session is not None
        [trajectory] = session.trajectories
    assert {r.engine for r in (*one.rollouts, *two.rollouts)} == {"sglang"}
    prompt1, completion1, logprobs1 = engine_sample(one)
    prompt2, completion2, _ = engine_sample(two)
    assert prompt2[: len(prompt1) + len(completion1)] == prompt1 + completion1
    assert trajectory.prompt + trajectory.completion == prompt2 + completion2
    content = first.choices[0].logprobs
    assert content is not None and content.content is not None
    assert [t.logprob for t in content.content] == pytest.approx(logprobs1)
