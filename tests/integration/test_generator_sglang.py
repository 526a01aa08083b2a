"""The generator on the real CPU SGLang server: the same tokens get the same logprobs as
on the torch engine, and the service runs on SGLang as it does on torch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, Rollout, RolloutStatus, SamplingParams, Task
from services.engines.engine import GenerateRequest, Sampling
from services.engines.sglang.engine import SGLangEngine
from services.engines.sglang.server import SGLangServer
from services.engines.torch.engine import TorchEngine
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.model.tokens import ChatTokenizer
from tests.integration.support import client, runtime


def sglang_generator(
    nats_url: str, server: SGLangServer, model: Path, *, instance: str, **overrides: Any
) -> GeneratorSettings:
    """A generator serving from the session's CPU SGLang server, local tools."""
    values: dict[str, Any] = {
        "runtime": runtime(nats_url, instance=instance),
        "model": model,
        "engine": "sglang",
        "sglang_urls": (server.url,),
        "tools": "local",
        "check_domains": False,
        "fetch_wait_s": 0.2,
    }
    return GeneratorSettings(**(values | overrides))


async def test_torch_and_sglang_agree_on_greedy_tokens_and_logprobs(
    sglang_server: SGLangServer, tiny_model: Path
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    prompt = tokenizer.render([ChatMessage(role="user", content="What is 3 + 4?")])
    request = GenerateRequest(
        prompt_ids=prompt, sampling=Sampling(temperature=0.0, max_new_tokens=12), n=1
    )
    sglang = SGLangEngine([sglang_server.url])
    torch_engine = TorchEngine(tiny_model)
    await sglang.start()
    await torch_engine.start()
    try:
        [remote] = await sglang.generate(request)
        [local] = await torch_engine.generate(request)
    finally:
        await sglang.close()
        await torch_engine.close()
    assert remote.output_ids == local.output_ids
    assert len(remote.logprobs) == len(local.logprobs) == len(local.output_ids)
    for a, b in zip(remote.logprobs, local.logprobs, strict=True):
        assert abs(a - b) < 1e-3


async def test_generator_service_on_sglang(
    nats_url: str, sglang_server: SGLangServer, tiny_model: Path
) -> None:
    got: list[Rollout] = []

    async def on_rollout(msg: Msg) -> None:
        got.append(Codec(Rollout).decode(msg.data))

    settings = sglang_generator(nats_url, sglang_server, tiny_model, instance="gen-sglang")
    task = Task(
        id="on-sglang",
        domain="arith",
        prompt=[ChatMessage(role="user", content="2+2=")],
        sampling=SamplingParams(max_tokens=6, seed=3),
        n=2,
    )
    async with client(nats_url) as nc, GeneratorService(settings):
        await nc.subscribe(subjects.rollouts(), cb=on_rollout)
        await nc.jetstream().publish(subjects.task(1, "arith"), encode(task))
        async with asyncio.timeout(60):
            while len(got) < 2:
                await asyncio.sleep(0.05)
    assert {r.id for r in got} == {"on-sglang/0", "on-sglang/1"}
    for rollout in got:
        assert rollout.status is RolloutStatus.OK, rollout.error
        assert rollout.engine == "sglang"
        assert len(rollout.behaviour_logprobs) == len(rollout.token_ids) - rollout.prompt_len > 0
