"""The measuring sections of ``gpu_check``: each part of Temper against the bare work it wraps.

- generator: the torch engine's generated tokens/s against Hugging Face ``generate``;
- learner: ``Trainer.train`` against a bare forward, backward and AdamW step;
- publication: export + digest check + the engine's load against a bare save and load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from agent_workload import tokens
from bench_learner import _means
from bench_learner import batch as learner_batch
from gpu_check_common import Comparison, Plan, alternate, dtype_name, reset, timed

from services.model.load import load_causal_lm
from services.runtime.stages import Stages

# ---------------------------------------------------------------- generator


def generator_section(plan: Plan, model_dir: Path) -> Comparison:
    from services.engines.torch.engine import TorchEngine

    loop = asyncio.new_event_loop()
    engine = TorchEngine(model_dir, device=str(plan.device), dtype=plan.dtype)
    model = load_causal_lm(model_dir, plan.device, plan.dtype).eval()
    try:
        loop.run_until_complete(engine.start())
        mine, bare = alternate(
            lambda r: loop.run_until_complete(_engine_round(plan, engine, r)),
            lambda r: _hf_round(plan, model, r),
            plan.profile.section_s,
        )
        rows = engine.batch_statistics()["rows_per_step"]
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    p = plan.profile
    return Comparison(
        section="generator",
        unit="tok/s",
        higher_is_better=True,
        ours=mine,
        baseline=bare,
        ours_name="torch engine (TorchEngine)",
        baseline_name="Hugging Face generate",
        notes=[
            f"{p.prompts} prompts of {p.prompt_tokens} tokens at once, up to {p.new_tokens} "
            "new tokens each (temperature 1, new prompts every round); both return every "
            f"token's logprob; the engine decoded {rows:.1f} rows per step",
        ],
    )


def _prompts(plan: Plan, round_: int) -> list[list[int]]:
    p = plan.profile
    return [tokens(round_ * 1000 + i, p.prompt_tokens) for i in range(p.prompts)]


async def _engine_round(plan: Plan, engine: Any, round_: int) -> float:
    from services.engines.engine import GenerateRequest, Sampling

    requests = [
        GenerateRequest(
            prompt_ids=prompt,
            sampling=Sampling(max_new_tokens=plan.profile.new_tokens, seed=round_ * 1000 + i),
        )
        for i, prompt in enumerate(_prompts(plan, round_))
    ]
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    elapsed = time.perf_counter() - started
    return sum(len(s.output_ids) for samples in results for s in samples) / elapsed


def _hf_round(plan: Plan, model: Any, round_: int) -> float:
    ids = torch.tensor(_prompts(plan, round_), device=plan.device)
    stop = model.generation_config.eos_token_id
    eos = {stop} if isinstance(stop, int) else set(stop or [])
    torch.manual_seed(round_)
    plan.sync()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=plan.profile.new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        rows, _ = new.tolist(), logprobs.tolist()
    elapsed = time.perf_counter() - started
    return sum(_until_stop(row, eos) for row in rows) / elapsed


def _until_stop(row: list[int], eos: set[int]) -> int:
    """Tokens generated in a row: up to its first stop token (kept), padding after."""
    for index, token in enumerate(row):
        if token in eos:
            return index + 1
    return len(row)


# ---------------------------------------------------------------- learner


def learner_section(plan: Plan, model_dir: Path) -> Comparison:
    from services.learner.trainer import Trainer, TrainerConfig

    items = learner_batch(model_dir, seed=1)[: plan.profile.batch]
    # Every row trained, one micro-batch: the same work as the bare step.
    config = TrainerConfig(lr=1e-4, micro_batch=len(items), skip_zero_advantage=False)
    trainer = Trainer(model_dir, plan.out / "trainer", config, device=str(plan.device))
    # The trainer's model as it loads it (the one dtype policy: bf16 on a GPU).
    model = load_causal_lm(model_dir, plan.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    stages = Stages()

    def ours(_round: int) -> float:
        def step() -> None:
            result = trainer.train(items)
            for name, seconds in result.seconds.items():
                stages.add(name, seconds)

        return timed(plan, step)

    def bare(_round: int) -> float:
        return timed(plan, lambda: bare_step(model, optimizer, items, plan.device))

    mine, plain = alternate(ours, bare, plan.profile.section_s, warmed=lambda: reset(stages))
    tokens_per_step = sum(len(i.rollout.token_ids) for i in items)
    precision = dtype_name(next(trainer.model.parameters()).dtype)
    return Comparison(
        section="learner",
        unit="ms",
        higher_is_better=False,
        ours=mine,
        baseline=plain,
        ours_name="learner step (Trainer.train)",
        baseline_name="bare forward/backward/AdamW step",
        notes=[
            f"{len(items)} samples ({tokens_per_step} tokens) of arithmetic_sum3, every row "
            f"trained, {precision} weights and AdamW on {plan.device.type}; the bare step takes "
            "logits at every position, the trainer from the first trained one on",
            f"where ours goes: {_means(stages)}",
        ],
    )


def bare_step(model: Any, optimizer: Any, items: Sequence[Any], device: torch.device) -> None:
    """``bench_learner.bare_step`` on ``device``: tensors built on the host and moved once,
    as the trainer does."""
    rows = [i.rollout.token_ids.tolist() for i in items]
    length = max(map(len, rows))
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length - 1))
    for row, (ids_row, item) in enumerate(zip(rows, items, strict=True)):
        ids[row, : len(ids_row)] = torch.tensor(ids_row)
        mask[row, item.rollout.prompt_len - 1 : len(ids_row) - 1] = 1
    advantage = torch.tensor([i.reward - 0.5 for i in items]).unsqueeze(-1).to(device)
    ids, mask = ids.to(device), mask.to(device)
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss = -(advantage * logprobs * mask).sum() / mask.sum()
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


# ---------------------------------------------------------------- publication


def publication_section(plan: Plan, model_dir: Path) -> Comparison:
    from safetensors.torch import load_model, save_model

    from services.engines.torch.engine import TorchEngine
    from services.learner.trainer import Trainer, TrainerConfig
    from services.model.weights import verify_digest

    trainer = Trainer(model_dir, plan.out / "publish", TrainerConfig(), device=str(plan.device))
    engine = TorchEngine(model_dir, device=str(plan.device), dtype=plan.dtype, tune_linears=False)
    model = load_causal_lm(model_dir, plan.device, plan.dtype)
    loop = asyncio.new_event_loop()
    parts, bare_parts = Stages(), Stages()
    bare_file = plan.out / "bare.safetensors"

    def publish() -> None:
        with parts.stage("export"):
            exported = trainer.export(keep=2)
        with parts.stage("digest check"):
            verify_digest(exported.path, exported.digest)
        with parts.stage("engine load"):
            loop.run_until_complete(engine.load_weights(exported.version, str(exported.path)))
            plan.sync()

    def save_and_load() -> None:
        with bare_parts.stage("save"):
            save_model(trainer.model, str(bare_file))
        with bare_parts.stage("load"):
            load_model(model, str(bare_file), device=str(plan.device))
            plan.sync()

    try:
        loop.run_until_complete(engine.start())
        mine, plain = alternate(
            lambda _r: timed(plan, publish),
            lambda _r: timed(plan, save_and_load),
            plan.profile.section_s,
            warmed=lambda: reset(parts, bare_parts),
        )
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    return Comparison(
        section="publication",
        unit="ms",
        higher_is_better=False,
        ours=mine,
        baseline=plain,
        ours_name="export + digest + engine load",
        baseline_name="bare safetensors save + load",
        notes=[
            f"the learner's {dtype_name(next(trainer.model.parameters()).dtype)} weights on "
            f"{plan.device.type} -> a {dtype_name(plan.dtype)} model on the same device, "
            "through the page cache",
            f"where it goes: ours {_means(parts)}; bare {_means(bare_parts)}",
        ],
    )
