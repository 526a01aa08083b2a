"""What the replay buffer lets go untrained (stale, or excluded with its group) reaches the
generators' admission through the learner's PolicyUpdate, over a real nats-server with
the real replay and learner services.  Counted only as trained, every drop stayed
"ahead" at admission for good: a long tool run filled its budget and stopped starting
work."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.msg import Msg

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import PolicyUpdate, ScoredRollout, ScoreStatus
from services.generator.scheduling.admission import StalenessAdmission
from services.generator.service import settled_samples
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings, SamplingSettings
from services.replay.service import ReplayService, ReplaySettings
from tests.integration.support import client, runtime
from tests.unit.test_replay_buffer import scored

#: Where the learner starts (a PolicyUpdate kept in the policy stream).
VERSION, TRAINED = 5, 640


async def _publish(js: object, items: list[ScoredRollout]) -> None:
    for item in items:
        subject = subjects.scored(item.rollout.task.domain, item.rollout.task.id)
        await js.publish(subject, encode(item), headers={"Nats-Msg-Id": item.id})  # type: ignore[attr-defined]


def _learner(url: str, model: Path, out_dir: Path) -> LearnerSettings:
    return LearnerSettings(
        runtime=runtime(url, instance="lrn-settled"),
        model=model,
        out_dir=out_dir,
        tensorboard=False,
        sampling=SamplingSettings(batch_size=8, min_samples=1, sample_wait_s=0.5),
    )


async def test_stale_and_excluded_samples_settle_at_the_generators_admission(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    updates: list[PolicyUpdate] = []

    async def on_update(msg: Msg) -> None:
        updates.append(Codec(PolicyUpdate).decode(msg.data))

    async with client(nats_url) as nc:
        js = nc.jetstream()
        await js.add_stream(name=streams.POLICY.name, subjects=list(streams.POLICY.subjects))
        start = PolicyUpdate(
            version=VERSION, uri="/run/v5", digest="sha256:" + "0" * 64, trained_samples=TRAINED
        )
        await js.publish(subjects.policy_update(), encode(start))
        await nc.subscribe(subjects.policy_update(), cb=on_update)
        replay = ReplayService(ReplaySettings(runtime=runtime(nats_url, "rep"), max_staleness=1))
        async with replay:
            await _publish(
                js,
                [
                    # Two versions behind the bound: dropped when the learner asks.
                    scored("old", 0, version=VERSION - 3),
                    scored("old", 1, version=VERSION - 3),
                    # One member usable, one an infra failure: the failure leaves untrained.
                    scored("mixed", 0, version=VERSION),
                    scored("mixed", 1, version=VERSION, status=ScoreStatus.INFRA_FAILURE),
                    scored("fresh", 0, version=VERSION),
                    scored("fresh", 1, version=VERSION),
                ],
            )
            async with asyncio.timeout(30):
                while len(replay.buffer) < 6:
                    await asyncio.sleep(0.02)
            async with LearnerService(_learner(nats_url, tiny_model, tmp_path)):
                async with asyncio.timeout(60):
                    while not any(u.trained_samples > TRAINED for u in updates):
                        await asyncio.sleep(0.05)
    update = next(u for u in updates if u.trained_samples > TRAINED)
    trained = 3  # "mixed"/0 and both of "fresh"
    assert update.trained_samples == TRAINED + trained
    assert update.settled_samples == TRAINED + trained + 2 + 1

    admission = StalenessAdmission(budget=8)
    admission.started = TRAINED + 6  # everything above was started by this generator
    admission.learner_trained(settled_samples(update))
    assert admission.ahead() == 0
