"""Policy versions strictly increase across a learner restart that lost its checkpoint:
the learner numbers on from the newest PolicyUpdate kept in TEMPER_POLICY."""

from __future__ import annotations

from pathlib import Path

from protocol import streams, subjects
from protocol.codec import encode
from protocol.messages import PolicyUpdate
from services.learner.service import LearnerService, LearnerSettings
from tests.integration.support import client, runtime


def _settings(url: str, model: Path, out_dir: Path) -> LearnerSettings:
    return LearnerSettings(
        runtime=runtime(url, instance="lrn-lineage"),
        model=model,
        out_dir=out_dir,
        tensorboard=False,
        sample_wait_s=0.2,
    )


async def test_a_learner_without_its_checkpoint_numbers_on_from_the_newest_version(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    async with client(nats_url) as nc:
        js = nc.jetstream()
        await js.add_stream(name=streams.POLICY.name, subjects=list(streams.POLICY.subjects))
        lost = PolicyUpdate(
            version=5, uri="/lost/run/v5", digest="sha256:" + "0" * 64, trained_samples=640
        )
        await js.publish(subjects.policy_update(), encode(lost))
    async with LearnerService(_settings(nats_url, tiny_model, tmp_path / "fresh")) as learner:
        assert (learner.trainer.version, learner.trainer.consumed) == (5, 640)
        exported = learner.trainer.export(keep=2)
    assert exported.version == 6


async def test_a_resumed_learner_ahead_of_what_was_announced_keeps_its_versions(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from services.learner.trainer import Trainer

    out_dir = tmp_path / "own"
    trainer = Trainer(
        tiny_model, out_dir, _settings(nats_url, tiny_model, out_dir).trainer_config()
    )
    trainer.export(keep=3)
    trainer.export(keep=3)
    trainer.save_checkpoint()
    async with client(nats_url) as nc:
        js = nc.jetstream()
        await js.add_stream(name=streams.POLICY.name, subjects=list(streams.POLICY.subjects))
        older = PolicyUpdate(version=1, uri="/old/v1", digest="sha256:" + "1" * 64)
        await js.publish(subjects.policy_update(), encode(older))
    async with LearnerService(_settings(nats_url, tiny_model, out_dir)) as learner:
        assert learner.trainer.version == 2
        assert learner.trainer.export(keep=3).version == 3
