"""The learner's proof that it trains on what was sampled: its logprobs of the sampled
tokens, before the step's update, against the behaviour logprobs the rollout carries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest
import torch

from protocol.messages import ChatMessage, Rollout, ScoredRollout, ScoreStatus, Segment, Task
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.learner.loss import token_logprobs
from services.learner.metrics import step_line
from services.learner.mismatch import NOT_MEASURED, Mismatch, logprob_mismatch, merge
from services.learner.trainer import StepResult, Trainer, TrainerConfig

PROMPT = [1, 341, 203, 317, 309, 2, 203, 1, 347, 203]
#: Completions of two groups; the last token of each is tool output (mask 0, logprob 0).
COMPLETIONS = {("a", 0): [22, 23, 24, 90], ("a", 1): [40, 41, 91], ("b", 0): [30, 31, 92]}
COMPLETIONS[("b", 1)] = [50, 51, 52, 53, 93]
#: Large enough that one update moves the logprobs far past the float32 bound.
LR = 3e-2


# ---------------------------------------------------------------- the function


def test_mean_and_max_over_the_masked_tokens_only() -> None:
    recomputed = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    behaviour = torch.tensor([[-1.1, -2.0, -3.4], [-0.5, -0.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 9-nat gap is masked out
    found = logprob_mismatch(recomputed, behaviour, mask)
    assert found.tokens == 5
    assert found.mean == pytest.approx((0.1 + 0.0 + 0.4 + 0.0 + 0.2) / 5, abs=1e-6)
    assert found.max == pytest.approx(0.4, abs=1e-6)


def test_nothing_measured_is_zero_tokens_and_no_nan() -> None:
    values = torch.tensor([[-1.0, -2.0]])
    found = logprob_mismatch(values, values - 1, torch.zeros_like(values))
    assert found == NOT_MEASURED
    assert (found.tokens, found.mean, found.max) == (0, 0.0, 0.0)
    empty = torch.zeros((0, 3))
    assert logprob_mismatch(empty, empty, empty) == NOT_MEASURED


def test_bad_shapes_or_mask_values_are_refused_by_name() -> None:
    values = torch.zeros((2, 3))
    with pytest.raises(ValueError, match=r"mask \(2, 2\) must have one shape"):
        logprob_mismatch(values, values, torch.ones((2, 2)))
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        logprob_mismatch(values, values, torch.full((2, 3), 0.5))


def test_parts_merge_to_the_measurement_of_their_union() -> None:
    recomputed = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    behaviour = torch.tensor([[-1.5, -2.0, -3.25, -4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    whole = logprob_mismatch(recomputed, behaviour, mask)
    halves = [
        logprob_mismatch(recomputed[:, s], behaviour[:, s], mask[:, s])
        for s in (slice(0, 2), slice(2, 4))
    ]
    merged = merge([*halves, NOT_MEASURED])
    assert merged.tokens == whole.tokens == 3
    assert merged.mean == pytest.approx(whole.mean) and merged.max == whole.max == 0.5
    assert merge([]) == NOT_MEASURED


# ---------------------------------------------------------------- the trainer's step


def _batch(trainer: Trainer, version: int, shift: float = 0.0) -> list[ScoredRollout]:
    """Each completion with the behaviour logprobs ``trainer``'s model gives it now (its
    first token's shifted by ``shift``), sampled at ``version``; rewards differ per group."""
    return [
        _item(task, index, completion, _logprobs(trainer, completion), version, shift)
        for (task, index), completion in COMPLETIONS.items()
    ]


def _logprobs(trainer: Trainer, completion: list[int]) -> list[float]:
    tokens = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        logprobs = token_logprobs(trainer.model(input_ids=tokens).logits, tokens)
    return logprobs[0, len(PROMPT) - 1 :].tolist()


def _item(
    task_id: str,
    index: int,
    completion: list[int],
    logprobs: list[float],
    version: int,
    shift: float,
) -> ScoredRollout:
    task = Task(id=task_id, domain="unit", prompt=[ChatMessage(role="user", content="q")], n=2)
    behaviour = [logprobs[0] + shift, *logprobs[1:-1], 0.0]  # the tool token carries 0
    rollout = Rollout(
        id=f"{task_id}/{index}",
        task=task,
        sample_index=index,
        tokens=pack_i32(PROMPT + completion),
        prompt_len=len(PROMPT),
        logprobs=pack_f32(behaviour),
        loss_mask=pack_u8([1] * (len(completion) - 1) + [0]),
        segments=[
            Segment(start=0, end=len(completion) - 1, version=version),
            Segment(start=len(completion) - 1, end=len(completion), kind="tool"),
        ],
        engine="torch",
    )
    reward = float(index)
    return ScoredRollout(id=rollout.id, rollout=rollout, reward=reward, status=ScoreStatus.SCORED)


#: Trained tokens of the batch: every completion token but the tool output.
TRAINED = sum(len(c) - 1 for c in COMPLETIONS.values())


def _trainer(tiny_model: Path, tmp_path: Path, **config: int) -> Trainer:
    return Trainer(tiny_model, tmp_path, TrainerConfig(lr=LR, micro_batch=2, **config))


def _measured(result: StepResult) -> Mismatch:
    return Mismatch(
        mean=result.logprob_mismatch,
        max=result.logprob_mismatch_max,
        tokens=result.logprob_mismatch_tokens,
    )


@pytest.mark.parametrize("updates", [{}, {"minibatches": 2}], ids=["one_update", "proximal"])
def test_samples_of_the_learner_s_version_agree_in_float32(
    tiny_model: Path, tmp_path: Path, updates: dict[str, int]
) -> None:
    trainer = _trainer(tiny_model, tmp_path, **updates)
    batch = _batch(trainer, version=0)
    result = trainer.train(batch)
    assert result.updates == max(1, updates.get("minibatches", 1))
    found = _measured(result)
    assert found.tokens == TRAINED
    assert found.max < 1e-3 and found.mean < 1e-3
    # The step moved the weights: measured after it, the same samples would not agree.
    after = _logprobs(trainer, COMPLETIONS[("a", 0)])[:-1]
    sampled = batch[0].rollout.behaviour_logprobs[:-1]
    assert max(abs(a - float(b)) for a, b in zip(after, sampled, strict=True)) > 1e-2
    assert (result.engine, result.dtype) == ("torch", "float32")


@pytest.mark.parametrize("updates", [{}, {"minibatches": 2}], ids=["one_update", "proximal"])
def test_one_perturbed_token_shows_in_the_max_and_the_mean(
    tiny_model: Path, tmp_path: Path, updates: dict[str, int]
) -> None:
    trainer = _trainer(tiny_model, tmp_path, **updates)
    batch = _batch(trainer, version=0)
    first = batch[0].rollout
    behaviour = first.behaviour_logprobs.copy()
    behaviour[1] -= 0.5
    batch[0] = msgspec.structs.replace(
        batch[0], rollout=msgspec.structs.replace(first, logprobs=pack_f32(behaviour.tolist()))
    )
    found = _measured(trainer.train(batch))
    assert found.tokens == TRAINED
    assert found.max == pytest.approx(0.5, abs=1e-3)
    assert found.mean == pytest.approx(0.5 / TRAINED, abs=1e-3)


def test_samples_of_an_older_version_are_left_out(tiny_model: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model, tmp_path)
    trainer.version = 3
    old = trainer.train(_batch(trainer, version=2))
    assert _measured(old) == NOT_MEASURED and old.engine == ""
    assert old.updates == 1  # trained on, only not measured
    trainer = _trainer(tiny_model, tmp_path / "mixed")
    trainer.version = 3
    batch = _batch(trainer, version=3, shift=-0.5)
    batch[:2] = _batch(trainer, version=2, shift=-0.5)[:2]  # task "a": older, not measured
    found = _measured(trainer.train(batch))
    assert found.tokens == len(COMPLETIONS[("b", 0)]) - 1 + len(COMPLETIONS[("b", 1)]) - 1
    assert found.max == pytest.approx(0.5, abs=1e-3)


def test_weights_moved_past_their_version_are_not_measured(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Steps between publications (``publish_every`` > 1) leave the weights ahead of the
    version the samples name: comparing then would measure learning, not a mismatch."""
    trainer = _trainer(tiny_model, tmp_path)
    assert _measured(trainer.train(_batch(trainer, version=0))).tokens == TRAINED
    moved = trainer.train(_batch(trainer, version=0))
    assert _measured(moved) == NOT_MEASURED
    trainer.save_checkpoint()
    resumed = _trainer(tiny_model, tmp_path)
    assert resumed.resume() is not None
    assert _measured(resumed.train(_batch(resumed, version=0))) == NOT_MEASURED
    exported = resumed.export(keep=2)
    published = resumed.train(_batch(resumed, version=exported.version))
    assert _measured(published).tokens == TRAINED and published.logprob_mismatch < 1e-3


def test_the_metrics_line_carries_the_mismatch_and_what_judges_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_model, tmp_path)
    result = trainer.train(_batch(trainer, version=0, shift=-0.5))
    line = json.loads(json.dumps(step_line(result, trainer.version, 0, {})))
    assert line["logprob_mismatch_tokens"] == TRAINED
    assert line["logprob_mismatch_max"] == pytest.approx(0.5, abs=1e-3)
    assert math.isclose(line["logprob_mismatch"], 0.5 * len(COMPLETIONS) / TRAINED, abs_tol=1e-3)
    assert (line["engine"], line["dtype"]) == ("torch", "float32")


def test_tensorboard_plots_the_mismatch_of_measured_steps_only(
    tiny_model: Path, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from services.learner.metrics import Scalars

    trainer = _trainer(tiny_model, tmp_path / "out")
    measured = trainer.train(_batch(trainer, version=0, shift=-0.5))
    unmeasured = trainer.train(_batch(trainer, version=0))  # the weights moved past v0
    scalars = Scalars(tmp_path / "tb")
    for result in (measured, unmeasured):
        scalars.add(step_line(result, trainer.version, 0, {}), result.step)
    scalars.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    plotted = [(e.step, e.value) for e in events.Scalars("learner/logprob_mismatch_max")]
    # The second step measured nothing: a 0.0 there would read as perfect agreement.
    assert [step for step, _ in plotted] == [measured.step]
    assert plotted[0][1] == pytest.approx(0.5, abs=1e-3)
    tokens = [e.value for e in events.Scalars("learner/logprob_mismatch_tokens")]
    assert tokens == [TRAINED, 0]
