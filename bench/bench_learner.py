"""The learner's own overheads, each against the bare torch work it wraps, in one run.

1. A learner step (``Trainer.train``: unpacking the rollouts, advantages, the loss, one
   AdamW step) vs a bare torch forward/backward/step on the same padded tensors with the
   same token-level policy-gradient loss.  Goal (issue 11): <= 1.1x.  The learner runs
   each group's prompt once for its samples and the output head on trained positions
   only; the bare step runs every row whole, as a plain torch loop does.
2. Weight publication: the learner's export (safetensors serialized once in memory and
   digested there, the start model's config and tokenizer files linked beside it), the
   generator's digest check, and the torch engine's verified load, vs writing the same
   model with safetensors and reading it back into a model.  Goal: <= 2x.  Each side's
   parts are printed: where the time goes.

Batches have the learning demo's shape: 256 samples of ``arithmetic_sum3`` (a 45-token
prompt, about 9 completion tokens), rewards of half the groups mixed.  Alternating
rounds, so both sides share the machine's noise; the median of each is reported, with the
range.  Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protocol.messages import Rollout, ScoredRollout, Segment  # noqa: E402
from protocol.packed import pack_f32, pack_i32, pack_u8  # noqa: E402
from services.domains import load_registry  # noqa: E402
from services.learner.trainer import Trainer, TrainerConfig  # noqa: E402
from services.model.tiny import init_model  # noqa: E402
from services.model.tokens import ChatTokenizer  # noqa: E402
from services.model.weights import verify_digest  # noqa: E402
from services.runtime.stages import Stages  # noqa: E402

ROUNDS, GROUP, BATCH = 7, 8, 256


def batch(model_dir: Path, seed: int) -> list[ScoredRollout]:
    tokenizer = ChatTokenizer.load(model_dir)
    rng = random.Random(seed)
    tasks = load_registry(None).get("arithmetic_sum3").make_tasks(BATCH // GROUP, seed=seed)
    items = []
    for task in tasks:
        prompt = tokenizer.render(task.prompt)
        mixed = rng.random() < 0.5
        for index in range(GROUP):
            completion = [rng.randrange(20, 300) for _ in range(rng.randint(7, 11))]
            rollout = Rollout(
                id=f"{task.id}/{index}",
                task=task,
                sample_index=index,
                tokens=pack_i32(prompt + completion),
                prompt_len=len(prompt),
                logprobs=pack_f32([-1.0] * len(completion)),
                loss_mask=pack_u8([1] * len(completion)),
                segments=[Segment(start=0, end=len(completion), version=0)],
            )
            reward = float(index % 2) if mixed else 0.0
            items.append(ScoredRollout(id=rollout.id, rollout=rollout, reward=reward))
    return items


def bare_step(model: Any, optimizer: Any, items: list[ScoredRollout]) -> None:
    """What a step costs without the learner: padded tensors, forward, loss, backward, step."""
    rows = [i.rollout.token_ids.tolist() for i in items]
    length = max(map(len, rows))
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length - 1))
    for row, (tokens, item) in enumerate(zip(rows, items, strict=True)):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, item.rollout.prompt_len - 1 : len(tokens) - 1] = 1
    advantage = torch.tensor([i.reward - 0.5 for i in items]).unsqueeze(-1)
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits[:, :-1]
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss = -(advantage * logprobs * mask).sum() / mask.sum()
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def alternate(first: Callable[[], object], second: Callable[[], object]) -> tuple[list[float], ...]:
    a, b = [], []
    for _ in range(ROUNDS):
        a.append(timed(first))
        b.append(timed(second))
    return a, b


def line(name: str, ours: list[float], bare: list[float], goal: float) -> None:
    ratio = statistics.median(ours) / statistics.median(bare)
    print(
        f"{name}: {statistics.median(ours) * 1000:.1f} ms (range {min(ours) * 1000:.1f}-"
        f"{max(ours) * 1000:.1f}) vs bare {statistics.median(bare) * 1000:.1f} ms (range "
        f"{min(bare) * 1000:.1f}-{max(bare) * 1000:.1f}): ratio {ratio:.2f} (goal <= {goal})"
    )


def learner_step(model_dir: Path, work: Path) -> None:
    from transformers import AutoModelForCausalLM

    items = batch(model_dir, seed=1)
    config = TrainerConfig(lr=1e-4, micro_batch=256, skip_zero_advantage=False)
    trainer = Trainer(model_dir, work / "trainer", config)
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ours, bare = alternate(lambda: trainer.train(items), lambda: bare_step(model, optimizer, items))
    line("learner step (256 samples, every row trained)", ours, bare, 1.1)
    skipping = Trainer(model_dir, work / "skipping", TrainerConfig(lr=1e-4, micro_batch=256))
    skip, bare = alternate(
        lambda: skipping.train(items), lambda: bare_step(model, optimizer, items)
    )
    line("learner step (zero-advantage samples skipped, the default)", skip, bare, 1.1)


def publication(model_dir: Path, work: Path) -> None:
    from safetensors.torch import load_model, save_model
    from transformers import AutoModelForCausalLM

    from services.engines.torch.engine import TorchEngine

    trainer = Trainer(model_dir, work / "publish", TrainerConfig())
    engine = TorchEngine(model_dir, tune_linears=False)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)

    parts, bare_parts = Stages(), Stages()

    def ours() -> None:
        with parts.stage("export"):
            exported = trainer.export(keep=2)
        with parts.stage("digest check"):
            verify_digest(exported.path, exported.digest)
        with parts.stage("engine load"):
            loop.run_until_complete(engine.load_weights(exported.version, str(exported.path)))

    def bare() -> None:
        path = work / "bare.safetensors"
        with bare_parts.stage("save"):
            save_model(trainer.model, str(path))
        with bare_parts.stage("load"):
            load_model(model, str(path))

    mine, plain = alternate(ours, bare)
    loop.run_until_complete(engine.close())
    loop.close()
    line("weight publication (export + digest + engine load)", mine, plain, 2.0)
    print(f"  where it goes: ours {_means(parts)}; bare {_means(bare_parts)}")


def _means(stages: Stages) -> str:
    return ", ".join(
        f"{name} {seconds / stages.counts[name] * 1000:.1f} ms"
        for name, seconds in stages.seconds.items()
    )


def main() -> int:
    torch.set_num_threads(1)  # as the learner runs in the stack: one thread beside the generator
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = init_model(work / "model")
        learner_step(model_dir, work)
        publication(model_dir, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
