"""The learner's loss and trainer on the tiny model: advantages, the direction of an
update, exact resume, and published weights that the engine loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from protocol.messages import (
    ChatMessage,
    Rollout,
    ScoredRollout,
    ScoreStatus,
    Segment,
    Task,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.learner.loss import LossConfig, group_advantages, policy_loss, token_logprobs
from services.learner.trainer import Trainer, TrainerConfig
from services.runtime.weights import directory_digest

PROMPT = [1, 341, 203, 317, 309, 2, 203, 1, 347, 203]


def test_group_advantages_normalise_within_each_group() -> None:
    adv = group_advantages([1.0, 0.0, 1.0, 1.0, 0.5], ["a", "a", "b", "b", "c"])
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2:].tolist() == [0.0, 0.0, 0.0]  # equal rewards and a lone sample carry no signal


def test_policy_loss_clips_and_weights() -> None:
    current = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0]])
    loss, stats = policy_loss(current, behaviour, torch.tensor([1.0]), mask, LossConfig(is_cap=2))
    loss.backward()  # type: ignore[no-untyped-call]
    # Second token: proximal/behaviour = e^2 > cap, so its weight is truncated to 2.
    assert stats.is_weight_mean == pytest.approx((1 + 2) / 2)
    assert current.grad is not None and current.grad.tolist() == [[-0.5, -1.0]]
    assert stats.approx_kl == pytest.approx((0 + -2) / 2)
    assert stats.tokens == 2 and stats.clip_fraction == 0.0


def _item(
    task_id: str, index: int, completion: list[int], reward: float, lp: float
) -> ScoredRollout:
    task = Task(id=task_id, domain="unit", prompt=[ChatMessage(role="user", content="q")], n=2)
    rollout = Rollout(
        id=f"{task_id}/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32(PROMPT + completion),
        prompt_len=len(PROMPT),
        logprobs=pack_f32([lp] * len(completion)),
        loss_mask=pack_u8([1] * len(completion)),
        segments=[Segment(start=0, end=len(completion), version=0)],
    )
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, status=ScoreStatus.SCORED)


def _completion_logprob(trainer: Trainer, completion: list[int]) -> float:
    tokens = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        lp = token_logprobs(trainer.model(input_ids=tokens).logits, tokens)
    return float(lp[0, len(PROMPT) - 1 :].sum())


def test_training_raises_the_rewarded_completion(tiny_model: Path, tmp_path: Path) -> None:
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=3e-3))
    good, bad = [22, 23, 24], [40, 41, 42]
    before = _completion_logprob(trainer, good) - _completion_logprob(trainer, bad)
    batch = [_item("g", 0, good, 1.0, -7.6), _item("g", 1, bad, 0.0, -7.6)]
    for _ in range(5):
        result = trainer.train(batch)
    after = _completion_logprob(trainer, good) - _completion_logprob(trainer, bad)
    assert after > before + 1.0
    assert result.step == 5 and result.samples == 2 and result.reward_mean == 0.5
    assert math.isfinite(result.loss.loss) and result.loss.tokens == 6


def test_checkpoint_resumes_exactly(tiny_model: Path, tmp_path: Path) -> None:
    batch = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    first = Trainer(tiny_model, tmp_path / "a", TrainerConfig(lr=1e-3))
    first.train(batch)
    first.export(keep=2)
    first.save_checkpoint()
    second = Trainer(tiny_model, tmp_path / "a", TrainerConfig(lr=1e-3))
    assert second.resume()
    assert (second.step, second.version) == (1, 1)
    first.train(batch)
    second.train(batch)
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[name]), name


def test_exported_weights_load_in_the_engine_and_old_versions_are_pruned(
    tiny_model: Path, tmp_path: Path
) -> None:
    import asyncio

    from services.generator.engine import GenerateRequest, Sampling
    from services.generator.torch_engine import TorchEngine

    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-2))
    batch = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    exported = None
    for _ in range(3):
        trainer.train(batch)
        exported = trainer.export(keep=2)
    assert exported is not None and exported.version == 3
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
    assert exported.digest == directory_digest(exported.path)
    assert (exported.path / "tokenizer.json").is_file()

    async def greedy(source: Path | None) -> list[float]:
        engine = TorchEngine(tiny_model)
        await engine.start()
        try:
            if source is not None:
                await engine.load_weights(3, str(source))
            request = GenerateRequest(
                prompt_ids=PROMPT, sampling=Sampling(temperature=0, max_new_tokens=3)
            )
            [sample] = await engine.generate(request)
            return sample.logprobs
        finally:
            await engine.close()

    assert asyncio.run(greedy(exported.path)) != asyncio.run(greedy(None))
