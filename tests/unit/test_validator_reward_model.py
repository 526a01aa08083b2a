"""The reward model: a tiny random Qwen2 sequence scorer built here, batching, failures."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from protocol.messages import ChatMessage, Rollout, Task
from services.domains import Domain, DomainRegistry, Problem, ValidatorSpec
from services.validator.base import InfraFailure
from services.validator.compose import Scorer
from services.validator.factory import Resources, RewardModels
from services.validator.reward_model import (
    RewardBatcher,
    RewardModel,
    RewardModelScore,
    init_reward_model,
)

TEXTS = ["3+4=<answer>7</answer>", "hello", "revenue grew 12.5% in Q2 " * 6]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_reward_model(tmp_path_factory.mktemp("rm") / "model")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> RewardModel:
    return RewardModel(model_dir)


def rollout(text: str) -> Rollout:
    task = Task(id="t", domain="d", prompt=[ChatMessage(role="user", content="q")])
    return Rollout(id="t/0", task=task, sample_index=0, completion_text=text)


class Recording:
    """A stand-in model that records the batches it is given."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.fail = fail

    def __call__(self, texts: Sequence[str]) -> list[float]:
        self.batches.append(len(texts))
        if self.fail:
            raise RuntimeError("CUDA error: out of patience")
        return [float(len(t)) for t in texts]


def test_model_scores_are_float32_finite_and_independent_of_batching(model: RewardModel) -> None:
    assert model.model.dtype.is_floating_point and str(model.model.dtype) == "torch.float32"
    batched = model(TEXTS)
    single = [model([text])[0] for text in TEXTS]
    assert all(math.isfinite(v) for v in batched)
    assert batched == pytest.approx(single, abs=1e-5)  # padding does not change a score
    assert model(TEXTS) == batched


async def test_batcher_collects_up_to_the_batch_size() -> None:
    fake = Recording()
    batcher = RewardBatcher(fake, max_batch=4, max_wait_s=5.0)
    callers = [asyncio.create_task(batcher.score("x" * i)) for i in range(10)]
    await asyncio.sleep(0)  # every request is queued before the loop runs
    runner = asyncio.create_task(batcher.run())
    assert await asyncio.gather(*callers[:8]) == [float(i) for i in range(8)]
    assert fake.batches[:2] == [4, 4]
    # The last two wait out max_wait_s for company that never comes; no need: cancel.
    runner.cancel()
    for caller in callers[8:]:
        caller.cancel()
    await asyncio.gather(runner, *callers[8:], return_exceptions=True)


async def test_batcher_sends_a_partial_batch_after_the_wait() -> None:
    fake = Recording()
    batcher = RewardBatcher(fake, max_batch=64, max_wait_s=0.01)
    async with asyncio.TaskGroup() as group:
        runner = group.create_task(batcher.run())
        assert await asyncio.gather(batcher.score("ab"), batcher.score("abc")) == [2.0, 3.0]
        runner.cancel()
    assert fake.batches == [2] and batcher.batches == 1 and batcher.scored == 2


async def test_a_failing_model_fails_every_caller_and_the_loop_goes_on() -> None:
    fake = Recording(fail=True)
    batcher = RewardBatcher(fake, max_batch=8, max_wait_s=0.01)
    async with asyncio.TaskGroup() as group:
        runner = group.create_task(batcher.run())
        results = await asyncio.gather(
            batcher.score("a"), batcher.score("b"), return_exceptions=True
        )
        assert all(isinstance(r, InfraFailure) and "out of patience" in str(r) for r in results)
        fake.fail = False
        assert await batcher.score("ok") == 2.0
        runner.cancel()


async def test_reward_model_validator_through_the_scorer(model_dir: Path) -> None:
    class One:
        def draw(self, rng: random.Random) -> Problem:
            return Problem(key="k", question="q", metadata={})

    spec = ValidatorSpec(kind="reward_model", params={"path": str(model_dir)})
    raw = ValidatorSpec(kind="reward_model", params={"path": str(model_dir), "transform": "raw"})
    domains = DomainRegistry(
        [
            Domain(name="d", source=One(), validators=(spec,)),
            Domain(name="e", source=One(), validators=(raw,)),
        ]
    )
    models = RewardModels(max_batch=8, max_wait_s=0.01)
    scorer = Scorer(
        domains, Resources(reward_models=models), timeout_s=30, validator="v", plugins={}
    )
    assert len(models.batchers) == 1  # both domains share one loaded model
    (batcher,) = models.batchers.values()
    async with asyncio.TaskGroup() as group:
        runner = group.create_task(batcher.run())
        scored = await scorer.score(rollout("<answer>7</answer>"))
        runner.cancel()
    assert scored.status.value == "scored" and 0.0 < scored.reward < 1.0
    assert scored.details[0].message.startswith("logit ")


async def test_non_finite_model_output_is_an_infra_failure() -> None:
    batcher = RewardBatcher(lambda texts: [math.nan] * len(texts), max_batch=2, max_wait_s=0.0)
    judge = RewardModelScore(batcher=batcher)
    async with asyncio.TaskGroup() as group:
        runner = group.create_task(batcher.run())
        with pytest.raises(InfraFailure, match="nan"):
            await judge.score(rollout("x"))
        runner.cancel()


def test_validator_text_includes_the_prompt_unless_told_not_to() -> None:
    batcher = RewardBatcher(Recording(), max_batch=1, max_wait_s=0.0)
    assert RewardModelScore(batcher=batcher).text(rollout("answer")) == "q\nanswer"
    assert (
        RewardModelScore(batcher=batcher, include_prompt=False).text(rollout("answer")) == "answer"
    )
