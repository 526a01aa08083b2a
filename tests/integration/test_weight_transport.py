"""``weight_transport = distributed`` end to end: the learner's weight server broadcasts
into the real CPU SGLang server through a generator service (real nats-server).

The session shares one SGLang server; the test leaves it serving the tiny model's weights.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from safetensors.torch import load_file, save_file

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, WeightSyncAck
from services.engines.sglang.broadcast import GlooWeightSender
from services.engines.sglang.engine import SGLangEngine
from services.engines.sglang.server import SGLangServer
from services.generator.service import GeneratorService
from services.learner.broadcast import BroadcastSettings, Sender, WeightServer
from services.learner.trainer import Exported
from services.model.weights import WEIGHTS_FILE, directory_digest
from services.runtime import RuntimeSettings, Service
from tests.integration.support import client, runtime
from tests.integration.test_generator_sglang import sglang_generator
from tests.integration.test_sglang_engine import (
    assert_close,
    greedy,
    perturbed_tensors,
    prompt_ids,
    reference_logprobs,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ACKS: Codec[WeightSyncAck] = Codec(WeightSyncAck)


@dataclass
class Faults:
    """Shared with every sender the host makes: the next broadcast dies half-way."""

    die_next: bool = False
    died: int = 0


@dataclass
class DyingSender:
    """The learner's real sender, except that on request it sends half of the tensors and
    then drops the group, as a learner that dies mid-broadcast would."""

    real: GlooWeightSender
    faults: Faults = field(default_factory=Faults)

    def connect(self) -> None:
        self.real.connect()

    def broadcast(self, named_tensors: Sequence[tuple[str, Any]]) -> None:
        if not self.faults.die_next:
            self.real.broadcast(named_tensors)
            return
        self.faults.die_next = False
        self.faults.died += 1
        self.real.broadcast(named_tensors[: len(named_tensors) // 2])
        self.real.close()
        raise RuntimeError("the learner went away mid-broadcast")

    def close(self) -> None:
        self.real.close()


class WeightHost(Service):
    """The learner's weight server alone, in a service of its own."""

    name = "learner"

    def __init__(self, runtime_settings: RuntimeSettings, faults: Faults) -> None:
        super().__init__(runtime_settings)

        def sender(offer: Any, timeout_s: float) -> Sender:
            real = GlooWeightSender(
                master_address=offer.master_address,
                master_port=offer.master_port,
                world_size=offer.world_size,
                group_name=offer.group,
                timeout_s=timeout_s,
            )
            return DyingSender(real, faults)

        self.weights = WeightServer(
            BroadcastSettings(timeout_s=60), self.instance, self.log, sender
        )

    async def setup(self) -> None:
        self.weights.listen(self)

    async def teardown(self) -> None:
        await self.weights.close()


def publish_dir(source: Path, target: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A published directory: the start model's files with ``tensors`` as its weights."""
    shutil.copytree(source, target)
    save_file(tensors, target / WEIGHTS_FILE, metadata={"format": "pt"})
    return target


@pytest.fixture
def versions(tiny_model: Path, tmp_path: Path) -> dict[str, Path]:
    original = load_file(tiny_model / WEIGHTS_FILE)
    twice = perturbed_tensors(perturbed_tensors(original))
    return {
        "a": publish_dir(tiny_model, tmp_path / "a", perturbed_tensors(original)),
        "b": publish_dir(tiny_model, tmp_path / "b", twice),
        "original": tiny_model,
    }


@dataclass
class Stack:
    host: WeightHost
    generator: GeneratorService
    engine: SGLangEngine
    nc: NATS
    acks: asyncio.Queue[WeightSyncAck]
    faults: Faults

    async def publish(self, version: int, path: Path) -> WeightSyncAck:
        """Announce ``path`` as ``version`` the way the learner does; wait for the ack."""
        exported = Exported(version=version, path=path, digest=directory_digest(path))
        plain = PolicyUpdate(version=version, uri=str(path), digest=exported.digest)
        update = await self.host.weights.offer(exported, plain)
        await self.nc.publish(subjects.policy_update(), encode(update))
        self.host.weights.announced(version)
        async with asyncio.timeout(180):
            while True:
                ack = await self.acks.get()
                if ack.version >= version or not ack.ok:
                    return ack


@pytest.fixture
async def stack(
    nats_url: str, sglang_server: SGLangServer, tiny_model: Path
) -> AsyncIterator[Stack]:
    faults = Faults()
    settings = sglang_generator(
        nats_url,
        sglang_server,
        tiny_model,
        instance="gen-dist",
        weight_update_timeout_s=120,
        weight_disk_fallback=False,
    )
    acks: asyncio.Queue[WeightSyncAck] = asyncio.Queue()

    async def on_ack(msg: Msg) -> None:
        acks.put_nowait(ACKS.decode(msg.data))

    host = WeightHost(runtime(nats_url, instance="learner-dist"), faults)
    async with (
        client(nats_url) as nc,
        host,
        GeneratorService(settings) as generator,
        SGLangEngine([sglang_server.url]) as engine,
    ):
        await nc.subscribe(subjects.weight_ack("generator"), cb=on_ack)
        await nc.flush()
        assert isinstance(generator, GeneratorService)
        yield Stack(host, generator, engine, nc, acks, faults)


async def assert_serves(stack: Stack, model_dir: Path, version: int) -> None:
    prompt = prompt_ids(24, seed=11)
    sample = await greedy(stack.engine, prompt)
    assert sample.version == version
    assert_close(sample.logprobs, reference_logprobs(model_dir, prompt, sample.output_ids))


async def test_versions_arrive_by_broadcast_and_a_broken_one_is_acked_as_failed(
    stack: Stack, versions: dict[str, Path]
) -> None:
    base = stack.generator.version
    weights = stack.host.weights

    first = await stack.publish(base + 1, versions["a"])
    assert first.ok, first.error
    assert first.version == base + 1
    await assert_serves(stack, versions["a"], base + 1)
    assert weights.groups_opened == 1

    second = await stack.publish(base + 2, versions["b"])
    assert second.ok, second.error
    await assert_serves(stack, versions["b"], base + 2)
    assert weights.groups_opened == 1, "the second version goes over the same group"
    assert weights.broadcasts == 2

    stack.faults.die_next = True
    broken = await stack.publish(base + 3, versions["a"])
    assert stack.faults.died == 1
    assert not broken.ok
    assert broken.version == base + 3
    assert "receive" in (broken.error or ""), broken.error
    assert stack.generator.version == base + 2
    await assert_serves(stack, versions["b"], base + 2)
    assert weights.failures == 1
    assert weights.statistics()["weight_groups"] == 0, "the learner closed the broken group"

    recovered = await stack.publish(base + 4, versions["original"])
    assert recovered.ok, recovered.error
    assert weights.groups_opened == 2, "the next version opened a new group"
    await assert_serves(stack, versions["original"], base + 4)
    assert stack.generator.statistics()["weight_broadcast_failures"] == 1
