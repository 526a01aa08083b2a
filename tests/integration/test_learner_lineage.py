"""Policy versions strictly increase across a learner restart that lost its checkpoint:
the learner numbers on from the newest PolicyUpdate kept in TEMPER_POLICY."""

from __future__ import annotations

from pathlib import Path

from protocol import streams, subjects
from protocol.codec import encode
from protocol.messages import PolicyUpdate
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings, SamplingSettings
from tests.integration.support import client, runtime


def _settings(url: str, model: Path, out_dir: Path) -> LearnerSettings:
    return LearnerSettings(
        runtime=runtime(url, instance="lrn-lineage"),
        model=model,
        out_dir=out_dir,
        tensorboard=False,
        sampling=SamplingSettings(sample_wait_s=0.2),
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


async def test_a_learner_resumes_from_a_version_published_after_its_checkpoint(
    nats_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Killed two steps after its checkpoint: the weights of those steps are on disk and
    in the ledger, so the restarted learner takes them instead of training them again."""
    import torch

    from services.learner.ledger import Consumed, Ledger, StepRecord
    from services.learner.ledger_check import check
    from services.learner.trainer import Trainer
    from tests.unit.test_learner import _item

    out_dir = tmp_path / "learner"
    settings = _settings(nats_url, tiny_model, out_dir)
    trainer = Trainer(tiny_model, out_dir, settings.trainer_config())
    ledger = Ledger(out_dir)
    for step in (1, 2, 3):
        batch = [
            _item(f"s{step}", 0, [22, 23], 1.0, -7.0),
            _item(f"s{step}", 1, [40, 41], 0.0, -7.0),
        ]
        trainer.train(batch)
        exported = trainer.export(keep=3)
        ledger.record_step(
            StepRecord(
                step=trainer.step,
                applied=True,
                published=True,
                version=exported.version,
                digest=exported.digest,
                batch=f"b{step}",
                rollouts=[Consumed(rollout_id=i.id, version=0) for i in batch],
            )
        )
        if step == 1:
            trainer.save_checkpoint({"ledger": {"position": ledger.position, "recent": []}})
    async with LearnerService(settings) as learner:
        assert (learner.trainer.version, learner.trainer.step) == (3, 3)
        for name, value in trainer.model.state_dict().items():
            assert torch.equal(value, learner.trainer.model.state_dict()[name]), name
    report = check(out_dir / "ledger.jsonl")
    assert report.abandoned_steps == 0 and report.steps == 3
    assert report.trained_twice == [] and report.version_errors == []
