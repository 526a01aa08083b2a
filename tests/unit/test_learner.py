"""The learner's loss and trainer on the tiny model: advantages, the direction of an
update, exact resume, and published weights that the engine loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest
import torch

from protocol.messages import (
    ChatMessage,
    FinishReason,
    Rollout,
    ScoredRollout,
    ScoreStatus,
    Segment,
    Task,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from services.domains.ranges import ScoreRange
from services.learner.forward import trained_logprobs
from services.learner.loss import (
    LossConfig,
    LossStats,
    TokenTerms,
    group_advantages,
    policy_loss,
    token_logprobs,
)
from services.learner.metrics import step_line
from services.learner.reward_bounds import RewardBounds
from services.learner.trainer import Trainer, TrainerConfig, _cut, _Part
from services.model.weights import directory_digest

PROMPT = [1, 341, 203, 317, 309, 2, 203, 1, 347, 203]


def test_group_advantages_normalise_within_each_group() -> None:
    adv = group_advantages([1.0, 0.0, 1.0, 1.0, 0.5], ["a", "a", "b", "b", "c"])
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2:].tolist() == [0.0, 0.0, 0.0]  # equal rewards and a lone sample carry no signal


def _loss(
    current: torch.Tensor,
    proximal: list[float],
    behaviour: list[float],
    advantage: float,
    config: LossConfig,
    **extra: torch.Tensor,
) -> tuple[torch.Tensor, LossStats]:
    terms = TokenTerms(
        current=current,
        proximal=torch.tensor([proximal]),
        behaviour=torch.tensor([behaviour]),
        mask=torch.ones_like(current),
        **extra,
    )
    return policy_loss(terms, torch.tensor([advantage]), config)


def test_importance_weight_is_truncated_against_behaviour() -> None:
    current = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss, stats = _loss(current, [-1.0, -1.0], [-1.0, -3.0], 1.0, LossConfig(is_cap=2))
    loss.backward()  # type: ignore[no-untyped-call]
    # Second token: proximal/behaviour = e^2 > cap, so its weight is truncated to 2.
    assert stats.is_weight_mean == pytest.approx((1 + 2) / 2)
    assert stats.is_truncated == pytest.approx(0.5)
    assert current.grad is not None and current.grad.tolist() == [[-0.5, -1.0]]
    assert stats.behaviour_kl == pytest.approx((0 - 2) / 2)
    assert stats.tokens == 2 and stats.clip_fraction == 0.0 and stats.approx_kl == 0.0


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_ratio_to_the_proximal_policy_is_clipped(advantage: float) -> None:
    # Token 0 moved up by 0.5 nats since the batch started, token 1 down by 0.5.
    current = torch.tensor([[-0.5, -1.5]], requires_grad=True)
    loss, stats = _loss(current, [-1.0, -1.0], [-1.0, -1.0], advantage, LossConfig(clip_eps=0.2))
    loss.backward()  # type: ignore[no-untyped-call]
    up, down = math.exp(0.5), math.exp(-0.5)
    assert current.grad is not None
    if advantage > 0:
        # Pessimistic bound: the token that rose is clipped at 1.2 (no gradient), the one
        # that fell keeps its ratio.
        assert loss.item() == pytest.approx(-(1.2 + down) / 2, rel=1e-5)
        assert current.grad[0].tolist() == pytest.approx([0.0, -down / 2], rel=1e-5)
    else:
        assert loss.item() == pytest.approx((up + 0.8) / 2, rel=1e-5)
        assert current.grad[0].tolist() == pytest.approx([up / 2, 0.0], rel=1e-5)
    assert stats.clip_fraction == 1.0
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-6)  # mean of +0.5 and -0.5


def test_reference_kl_is_k3_and_entropy_is_a_bonus() -> None:
    current = torch.tensor([[-1.0]], requires_grad=True)
    reference = torch.tensor([[-1.0 + math.log(2)]])
    config = LossConfig(kl_coef=0.5)
    loss, stats = _loss(current, [-1.0], [-1.0], 0.0, config, reference=reference)
    loss.backward()  # type: ignore[no-untyped-call]
    assert stats.reference_kl == pytest.approx(2 - math.log(2) - 1)
    assert loss.item() == pytest.approx(0.5 * (2 - math.log(2) - 1))
    # d/dc [e^(r-c) - (r-c) - 1] = 1 - e^(r-c) = -1 here, times the coefficient.
    assert current.grad is not None and current.grad.item() == pytest.approx(-0.5)
    entropy = torch.tensor([[0.7]], requires_grad=True)
    bonus, stats = _loss(
        current.detach(), [-1.0], [-1.0], 0.0, LossConfig(entropy_coef=0.1), entropy=entropy
    )
    assert bonus.item() == pytest.approx(-0.07) and stats.entropy == pytest.approx(0.7)


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
    """Model, optimizer, RNG (the minibatch shuffle), step, version and the caller's extra
    state (the ledger position) come back; the next steps then match bit for bit."""
    batch = [_item(f"g{i}", j, [22 + i, 23 + j], float(j), -7.0) for i in range(3) for j in (0, 1)]
    config = TrainerConfig(lr=1e-3, minibatches=2, epochs=2)
    first = Trainer(tiny_model, tmp_path / "a", config)
    first.train(batch)
    first.dropped = 4
    first.export(keep=2)
    first.save_checkpoint({"ledger": {"position": 123}})
    second = Trainer(tiny_model, tmp_path / "a", config)
    loaded = second.resume()
    assert loaded is not None and loaded.state["extra"] == {"ledger": {"position": 123}}
    assert (second.step, second.version, second.consumed, second.settled) == (1, 1, 6, 10)
    for _ in range(2):
        first.train(batch)
        second.train(batch)
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[name]), name
    moments = first.optimizer.state_dict()["state"], second.optimizer.state_dict()["state"]
    for index, state in moments[0].items():
        assert torch.equal(state["exp_avg_sq"], moments[1][index]["exp_avg_sq"]), index


def test_exported_weights_load_in_the_engine_and_old_versions_are_pruned(
    tiny_model: Path, tmp_path: Path
) -> None:
    import asyncio

    from services.engines.engine import GenerateRequest, Sampling
    from services.engines.torch.engine import TorchEngine

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


def test_an_exported_directory_is_the_trained_model_as_hugging_face_loads_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-2))
    trainer.train([_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)])
    exported = trainer.export(keep=2)
    loaded = AutoModelForCausalLM.from_pretrained(str(exported.path), dtype=torch.float32)
    ours = trainer.model.state_dict()
    assert set(loaded.state_dict()) == set(ours)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ours[name]), name
    # The LM head is tied to the embedding and saved once, as save_pretrained does.
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert [p.name for p in exported.path.glob("*.safetensors")] == ["model.safetensors"]
    assert (exported.path / "config.json").read_text() == trainer.model.config.to_json_string()
    start = sorted(p.name for p in tiny_model.iterdir())
    assert sorted(p.name for p in exported.path.iterdir()) == start
    assert exported.digest == directory_digest(exported.path)


def test_the_learning_rate_decays_linearly_then_holds(tiny_model: Path, tmp_path: Path) -> None:
    config = TrainerConfig(lr=1e-2, lr_decay_steps=2, lr_final=0.1)
    assert [config.lr_at(step) for step in (0, 1, 2, 5)] == pytest.approx(
        [1e-2, 5.5e-3, 1e-3, 1e-3]
    )
    assert TrainerConfig(lr=1e-2).lr_at(1000) == 1e-2
    with pytest.raises(ValueError, match="lr_final"):
        TrainerConfig(lr_final=2.0)
    trainer = Trainer(tiny_model, tmp_path, config)
    batch = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    used = [trainer.train(batch).lr for _ in range(3)]
    assert used == pytest.approx([1e-2, 5.5e-3, 1e-3])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_a_step_reports_its_gradient_norm_before_clipping(tiny_model: Path, tmp_path: Path) -> None:
    batch = [_item("g", 0, [22, 23, 24], 1.0, -7.6), _item("g", 1, [40, 41, 42], 0.0, -7.6)]
    free = Trainer(tiny_model, tmp_path / "free", TrainerConfig(grad_clip=1e9)).train(batch)
    clipped = Trainer(tiny_model, tmp_path / "clip", TrainerConfig(grad_clip=1e-3))
    result = clipped.train(batch)
    # The same first gradient either way: the norm is read before the clip scales it.
    assert free.loss.grad_norm > 1e-3
    assert result.loss.grad_norm == pytest.approx(free.loss.grad_norm, rel=1e-5)
    grads = [p.grad for p in clipped.model.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= 1.001e-3


def test_several_updates_per_batch_clip_against_the_batch_start(
    tiny_model: Path, tmp_path: Path
) -> None:
    batch = [_item("g", 0, [22, 23, 24], 1.0, -7.6), _item("g", 1, [40, 41, 42], 0.0, -7.6)]
    one = Trainer(tiny_model, tmp_path / "one", TrainerConfig(lr=5e-2)).train(batch)
    assert one.updates == 1 and one.loss.clip_fraction == 0.0 and one.loss.approx_kl == 0.0
    config = TrainerConfig(lr=5e-2, epochs=2, minibatches=2)
    many = Trainer(tiny_model, tmp_path / "many", config).train(batch)
    # Later updates see a policy that moved since the batch started: the ratio acts.
    assert many.updates == 4 and many.step == 1
    assert many.loss.clip_fraction > 0.0 and many.loss.approx_kl != 0.0


def test_zero_advantage_groups_skip_the_forward_pass(tiny_model: Path, tmp_path: Path) -> None:
    batch = [
        _item("g", 0, [22, 23], 1.0, -7.0),
        _item("g", 1, [40, 41], 0.0, -7.0),
        _item("flat", 0, [22, 23], 1.0, -7.0),
        _item("flat", 1, [40, 41], 1.0, -7.0),
    ]
    result = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3)).train(batch)
    assert (result.samples, result.trained, result.step) == (4, 2, 1)
    assert result.reward_mean == 0.75 and result.diversity == 1.0
    nothing = Trainer(tiny_model, tmp_path / "b", TrainerConfig(lr=1e-3)).train(batch[2:])
    assert nothing.skipped and nothing.step == 0 and nothing.trained == 0


def test_malformed_rollouts_are_refused_by_name_and_the_step_goes_on(
    tiny_model: Path, tmp_path: Path
) -> None:
    good = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    huge = _item("h", 0, [22, 10**6], 1.0, -7.0)
    nan = _item("n", 0, [22, 23], 1.0, float("nan"))
    result = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3)).train([*good, huge, nan])
    reasons = {r.rollout_id: r.reason for r in result.refused}
    assert set(reasons) == {"h/0", "n/0"}
    assert "vocabulary" in reasons["h/0"] and "not finite" in reasons["n/0"]
    assert result.step == 1 and result.samples == 2 and not result.skipped


def test_a_rollout_newer_than_the_learner_is_refused_as_negative_staleness(
    tiny_model: Path, tmp_path: Path
) -> None:
    good = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    future = _sampled_at(_item("f", 0, [22, 23], 1.0, -7.0), 5)
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3))
    trainer.version = 4
    result = trainer.train([*good, future])
    [refusal] = result.refused
    assert (refusal.rollout_id, refusal.kind) == ("f/0", "negative_staleness")
    assert "5 > learner version 4" in refusal.reason
    assert result.staleness_mean >= 0


def _sampled_at(item: ScoredRollout, version: int) -> ScoredRollout:
    segments = [msgspec.structs.replace(item.rollout.segments[0], version=version)]
    return msgspec.structs.replace(
        item, rollout=msgspec.structs.replace(item.rollout, segments=segments)
    )


def test_staleness_counts_are_samples_per_version_behind(tiny_model: Path, tmp_path: Path) -> None:
    versions = {("g", 0): 4, ("g", 1): 2, ("h", 0): 2, ("h", 1): 1, ("k", 0): 2}
    batch = [
        _sampled_at(_item(task, index, [22 + index, 23], float(index), -7.0), version)
        for (task, index), version in versions.items()
    ]
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3))
    trainer.version = 4
    result = trainer.train(batch)
    assert result.staleness_counts == {0: 1, 2: 3, 3: 1}
    assert sum(result.staleness_counts.values()) == result.samples == len(batch)
    assert result.staleness_mean == pytest.approx(sum(4 - v for v in versions.values()) / 5)
    line = json.loads(json.dumps(step_line(result, trainer.version, 0, {})))
    assert line["staleness_counts"] == {"0": 1, "2": 3, "3": 1}


def test_a_non_finite_loss_skips_the_update(tiny_model: Path, tmp_path: Path) -> None:
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3))
    with torch.no_grad():
        trainer.model.model.norm.weight[0] = float("nan")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.train([_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)])
    assert result.skipped and result.updates == 0 and trainer.step == 0
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value.nan_to_num(), before[name].nan_to_num()), name


def test_completion_logits_match_a_full_forward_pass(tiny_model: Path, tmp_path: Path) -> None:
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(skip_zero_advantage=False))
    short = _item("s", 0, [22, 23, 24], 1.0, -7.0)
    long_prompt = [*PROMPT, 309, 310]
    task = short.rollout.task
    rollout = Rollout(
        id="l/0",
        task=task,
        sample_index=0,
        tokens=pack_i32([*long_prompt, 40, 41]),
        prompt_len=len(long_prompt),
        logprobs=pack_f32([-7.0, -7.0]),
        loss_mask=pack_u8([1, 1]),
    )
    items = [short, ScoredRollout(id="l/0", rollout=rollout, reward=0.0)]
    rows = trainer._rows(items)
    assert rows is not None and rows.first == len(PROMPT) - 1
    got = trainer._logprobs(trainer.model, rows)
    for row, ids in enumerate([[*PROMPT, 22, 23, 24], [*long_prompt, 40, 41]]):
        tokens = torch.tensor([ids])
        with torch.no_grad():
            full = token_logprobs(trainer.model(input_ids=tokens).logits, tokens)[0, rows.first :]
        trained = rows.mask[row, : len(full)].bool()
        assert int(trained.sum()) == (3, 2)[row]  # the completion's tokens, no more
        assert torch.allclose(got[row, : len(full)][trained], full[trained], atol=1e-5)


def test_the_output_head_runs_on_trained_positions_only(tiny_model: Path, tmp_path: Path) -> None:
    # Tool output in the middle of a completion and a short row padded to a long one:
    # with a 150k vocabulary, logits for those positions are what made a step slow.
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(skip_zero_advantage=False))
    task = _item("m", 0, [22], 1.0, -7.0).rollout.task
    rollout = Rollout(
        id="m/1",
        task=task,
        sample_index=1,
        tokens=pack_i32([*PROMPT, 40, 41, 500, 501, 502, 503, 42, 43]),
        prompt_len=len(PROMPT),
        logprobs=pack_f32([-7.0] * 8),
        loss_mask=pack_u8([1, 1, 0, 0, 0, 0, 1, 1]),
    )
    items = [_item("m", 0, [22], 1.0, -7.0), ScoredRollout(id="m/1", rollout=rollout, reward=0.0)]
    rows = trainer._rows(items)
    assert rows is not None
    seen: list[int] = []
    head = trainer.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    try:
        got = trainer._logprobs(trainer.model, rows)
    finally:
        hook.remove()
    assert seen == [int(rows.mask.sum())] == [5]
    assert bool((got[rows.mask == 0] == 0).all()) and bool((got[rows.mask > 0] < 0).all())


def test_rows_of_one_prompt_run_it_once_with_the_same_logprobs_and_gradient(
    tiny_model: Path, tmp_path: Path
) -> None:
    # A group's samples share their prompt: the forward pass runs it once, not per row.
    other_prompt = [*PROMPT, 309, 310, 311]
    items = [_item("g", i, [22 + i, 23, 24][: 1 + i % 3], float(i % 2), -7.0) for i in range(6)]
    for i, completion in enumerate(([40, 41], [42])):
        item = _item("h", i, completion, float(i), -7.0)
        rollout = msgspec.structs.replace(
            item.rollout,
            tokens=pack_i32([*other_prompt, *completion]),
            prompt_len=len(other_prompt),
        )
        items.append(msgspec.structs.replace(item, rollout=rollout))
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3, skip_zero_advantage=False))
    rows = trainer._rows(items)
    assert rows is not None
    shapes: list[tuple[int, ...]] = []
    embed = trainer.model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda _m, args, _out: shapes.append(tuple(args[0].shape)))
    try:
        got = trained_logprobs(trainer.model, rows, slice(None)).logprobs
    finally:
        hook.remove()
    # Two prompts (the longer one's width), then eight completions (the longest's length).
    assert shapes == [(2, len(other_prompt)), (8, 3)]
    weights = rows.mask * rows.advantages.unsqueeze(-1)
    (got * weights).sum().backward()
    shared = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    # Row by row, each sequence whole through the model: the same logprobs and gradient.
    trainer.model.zero_grad()
    for row in range(len(rows)):
        ids = rows.tokens[row : row + 1, : int(rows.attention[row].sum())]
        logprobs = token_logprobs(trainer.model(input_ids=ids).logits, ids)[0, rows.first :]
        trained = rows.mask[row, : len(logprobs)] > 0
        assert torch.allclose(got[row, : len(logprobs)][trained], logprobs[trained], atol=1e-5)
        (logprobs * weights[row, : len(logprobs)]).sum().backward()
    whole = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    assert torch.allclose(shared, whole, atol=1e-5)


def test_rows_are_ordered_a_prompt_at_a_time_by_their_longest(
    tiny_model: Path, tmp_path: Path
) -> None:
    def on(prompt: list[int], index: int, completion: list[int]) -> ScoredRollout:
        item = _item(str(prompt[-1]), index, completion, float(index % 2), -7.0)
        rollout = msgspec.structs.replace(
            item.rollout, tokens=pack_i32([*prompt, *completion]), prompt_len=len(prompt)
        )
        return msgspec.structs.replace(item, rollout=rollout)

    a, b, c = [*PROMPT, 301], [*PROMPT, 302], [*PROMPT, 303]
    items = [on(a, 0, [5]), on(b, 0, [5] * 9), on(c, 0, [5] * 3), on(a, 1, [5] * 6)]
    items += [on(b, 1, [5, 5]), on(c, 1, [5] * 4), on(a, 2, [5] * 2)]
    trainer = Trainer(tiny_model, tmp_path, TrainerConfig(skip_zero_advantage=False))
    rows = trainer._rows(items)
    assert rows is not None
    order = rows.longest_first().tolist()
    # b (its longest 9), then a (6), then c (4); within each, longest first.
    assert order == [1, 4, 3, 6, 0, 5, 2]
    assert rows.longest_first(torch.tensor([0, 2, 5])).tolist() == [5, 2, 0]


def test_micro_batches_cut_by_length_give_the_same_logprobs_and_gradient(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Rows are ordered longest first and each micro-batch runs only to its longest row:
    # neither may change a logprob or the step's gradient.
    items = [
        _item("a", 0, [22], 1.0, -7.0),
        _item("a", 1, [40, 41, 42, 43, 44, 45, 46], 0.0, -7.0),
        _item("b", 0, [23, 24, 25], 1.0, -7.0),
        _item("b", 1, [26, 27], 0.0, -7.0),
    ]
    got, grads = [], []
    # Whole, a row at a time, and cut by a token budget that splits the batch unevenly.
    for micro, tokens in ((16, 4096), (1, 4096), (16, 40)):
        config = TrainerConfig(
            lr=1e-3, micro_batch=micro, micro_tokens=tokens, skip_zero_advantage=False
        )
        trainer = Trainer(tiny_model, tmp_path / f"{micro}-{tokens}", config)
        rows = trainer._rows(items)
        assert rows is not None
        got.append(trainer._logprobs(trainer.model, rows))
        trainer.optimizer.zero_grad()
        trainer._update(_Part(rows=rows, proximal=None, reference=None, seen=[]))
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    for other in (1, 2):
        assert torch.allclose(got[0], got[other], atol=1e-5)
        assert torch.allclose(grads[0], grads[other], atol=1e-6)


def test_a_micro_batch_holds_at_most_its_token_budget_padded_to_its_longest_row() -> None:
    lengths = [2000, 5000, 600, 600, *[220] * 20, 30]
    lengths.sort(reverse=True)
    cut = _cut(lengths, 16, 4096)
    assert [i for s in cut for i in range(len(lengths))[s]] == list(range(len(lengths)))
    for part in cut:
        rows = lengths[part]
        assert len(rows) <= 16
        assert len(rows) == 1 or len(rows) * rows[0] <= 4096
    # 5000 alone; 2000 with one more (4096 // 2000); six from the other 600 on
    # (4096 // 600); the last sixteen rows.
    assert [s.stop - s.start for s in cut] == [1, 2, 6, 16]
    # Rows a prompt at a time are not longest first throughout: a later, longer row
    # widens the micro-batch it joins.
    assert _cut([300, 100, 1000, 100], 16, 1200) == [slice(0, 2), slice(2, 3), slice(3, 4)]


def test_truncated_samples_leave_the_loss_where_the_domain_filters_them(
    tiny_model: Path, tmp_path: Path
) -> None:
    def cut(item: ScoredRollout, overlong: str) -> ScoredRollout:
        task = Task(**{**_task_fields(item.rollout.task), "metadata": {"overlong": overlong}})
        rollout = msgspec.structs.replace(
            item.rollout, task=task, finish_reason=FinishReason.LENGTH
        )
        return msgspec.structs.replace(item, rollout=rollout)

    stopped = _item("g", 0, [22, 23], 0.0, -7.0)
    filtered = cut(_item("g", 1, [40, 41], 1.0, -7.0), "filter")
    kept = cut(_item("g", 2, [40, 42], 1.0, -7.0), "keep")
    result = Trainer(tiny_model, tmp_path, TrainerConfig(lr=1e-3)).train([stopped, filtered, kept])
    # The filtered sample still counts in its group's advantages, never in the loss.
    assert (result.samples, result.trained, result.loss.tokens) == (3, 2, 4)
    assert result.truncated == pytest.approx(2 / 3)


def _task_fields(task: Task) -> dict[str, object]:
    return {f: getattr(task, f) for f in task.__struct_fields__ if f != "v"}


def test_a_reward_outside_its_domains_range_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    good = [_item("g", 0, [22, 23], 1.0, -7.0), _item("g", 1, [40, 41], 0.0, -7.0)]
    inflated = _item("x", 0, [22, 23], 20.0, -7.0)
    config = TrainerConfig(lr=1e-3, rewards=RewardBounds({"unit": ScoreRange(0.0, 1.0)}))
    result = Trainer(tiny_model, tmp_path, config).train([*good, inflated])
    [refusal] = result.refused
    assert refusal.rollout_id == "x/0"
    assert refusal.reason == "reward 20 is outside its range [0, 1] (domain 'unit')"
    assert result.samples == 2 and result.reward_mean == 0.5
    # The same reward in a domain declared to reach it is trained on.
    wide = TrainerConfig(lr=1e-3, rewards=RewardBounds({"unit": ScoreRange(0.0, 20.0)}))
    assert not Trainer(tiny_model, tmp_path / "wide", wide).train([*good, inflated]).refused


def test_on_a_gpu_the_forward_runs_in_bf16_over_float32_master_weights() -> None:
    """Named as such: this machine has no GPU, so only the chosen precision is checked."""
    import contextlib
    import warnings

    from services.learner.forward import _compute_precision

    assert isinstance(_compute_precision(torch.device("cpu")), contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast warns that CUDA is missing here
        gpu = _compute_precision(torch.device("cuda"))
    assert isinstance(gpu, torch.autocast) and gpu.fast_dtype is torch.bfloat16
