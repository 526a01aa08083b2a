"""The whole asynchronous RL loop in one process over a real nats-server: generator
(torch engine, tiny policy) -> validator -> replay -> learner -> PolicyUpdate ->
generator.  Nobody waits for anybody: the generator keeps producing with the version it
has, and later rollouts carry the newer versions the learner published."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from protocol import subjects
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, ScoredRollout, Task
from services.domains import load_registry
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings, SamplingSettings, WeightSettings
from services.learner.trainer import TrainerConfig
from services.replay.service import ReplayService, ReplaySettings
from services.validator.service import ValidatorService
from services.validator.settings import ValidatorSettings
from tests.integration.support import client, describe, raise_if_crashed, runtime


def _tasks(count: int, seed: int) -> list[Task]:
    domain = load_registry(None).get("arithmetic")
    return [
        # A group of 4: advantages need more than one.  A random policy often runs to the
        # token limit, which the domain filters out of the loss: keep those samples here.
        Task(**{**_fields(task), "n": 4, "metadata": {**task.metadata, "overlong": "keep"}})
        for task in domain.make_tasks(count, split="train", seed=seed)
    ]


def _fields(task: Task) -> dict[str, object]:
    return {name: getattr(task, name) for name in task.__struct_fields__ if name != "v"}


@pytest.mark.timeout(300)
async def test_policy_versions_flow_back_to_the_generator(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    scored: list[ScoredRollout] = []
    updates: list[PolicyUpdate] = []

    async def on_scored(msg: Msg) -> None:
        scored.append(Codec(ScoredRollout).decode(msg.data))

    async def on_update(msg: Msg) -> None:
        updates.append(Codec(PolicyUpdate).decode(msg.data))

    generator = GeneratorService(
        GeneratorSettings(
            runtime=runtime(nats_url, instance="gen"),
            model=tiny_model,
            tools="local",
            fetch_wait_s=0.2,
            prefix_cache_mb=16,
        )
    )
    validator = ValidatorService(ValidatorSettings(runtime=runtime(nats_url, instance="val")))
    replay = ReplayService(ReplaySettings(runtime=runtime(nats_url, instance="rep")))
    learner = LearnerService(
        LearnerSettings(
            runtime=runtime(nats_url, instance="lrn"),
            model=tiny_model,
            out_dir=tmp_path / "learner",
            sampling=SamplingSettings(batch_size=8, min_samples=4, sample_wait_s=0.5),
            # A random policy scores 0 everywhere: without skip_zero_advantage=False, a
            # batch with no advantage changes no weight and is not a step.
            trainer=TrainerConfig(lr=1e-3, skip_zero_advantage=False),
            # Every version stays on disk: the learner may publish several before the checks.
            weights=WeightSettings(keep_versions=1000),
        )
    )
    async with client(nats_url) as nc:
        await nc.subscribe(subjects.scored_all(), cb=on_scored)
        await nc.subscribe(subjects.policy_update(), cb=on_update)
        async with generator, validator, replay, learner:
            js = nc.jetstream()
            # Tasks keep coming, as in a run: the first ones may all be generated before
            # the learner's first step, and only later ones can carry a newer version.
            rounds = iter(range(1, 1000))
            services = (generator, validator, replay, learner)
            deadline = asyncio.get_running_loop().time() + 150
            while not any((s.rollout.policy_version or 0) >= 1 for s in scored):
                raise_if_crashed(*services)
                if asyncio.get_running_loop().time() > deadline:
                    # Printed as well as raised: a stop that hangs afterwards still shows it.
                    state = (
                        f"no rollout of version >= 1 after 150 s: learner step "
                        f"{learner.trainer.step}, generator version {generator.version}, "
                        f"{len(scored)} scored, {len(updates)} updates; {describe(*services)}"
                    )
                    print(state, flush=True)
                    pytest.fail(state)
                for task in _tasks(4, seed=next(rounds)):
                    await js.publish(
                        subjects.of_task(task),
                        encode(task),
                        headers={"Nats-Msg-Id": task.id},
                    )
                await asyncio.sleep(0.5)
            assert learner.trainer.step >= 1
            assert generator.version >= 1

    assert updates and updates[0].version == 1
    assert Path(updates[0].uri).is_dir()
    versions = {s.rollout.policy_version for s in scored}
    assert 0 in versions and any((v or 0) >= 1 for v in versions)
    assert (tmp_path / "learner" / "metrics.jsonl").read_text().count("\n") >= 1
