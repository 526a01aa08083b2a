"""A short supervised warm-up of a policy directory, in place.

A randomly initialised policy almost never writes the answer format, so reinforcement
learning from it sees no reward at all.  Supervised training on reference completions
of a domain's *train* split teaches the format and gives a weak start on the task.
The warm-up stops as soon as the policy answers ``target_accuracy`` of a fixed set of
train problems greedily (checked every ``check_every`` steps), or after ``steps``: a
start that can sample the right answer often but does not yet give it reliably, which
is where reinforcement learning shows.  Held-out problems are never looked at here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.domains import Domain
from services.model.load import load_causal_lm
from services.model.tokens import ChatTokenizer


@dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    #: Most supervised steps.
    steps: int = 40
    batch: int = 32
    lr: float = 3e-3
    examples: int = 512
    #: Stop once greedy accuracy on ``probe`` train problems reaches this; 0 never checks.
    target_accuracy: float = 0.0
    check_every: int = 25
    probe: int = 128
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class WarmupResult:
    steps: int
    loss: float
    #: Greedy accuracy on the train probe at the end (None when never checked).
    train_accuracy: float | None


def supervised_warmup(model_dir: Path, domain: Domain, config: WarmupConfig) -> WarmupResult:
    """Train ``model_dir`` on ``domain``'s reference completions, in place."""

    torch.manual_seed(config.seed)
    tokenizer = ChatTokenizer.load(model_dir)
    pairs = [
        (tokenizer.render(e.task.prompt), tokenizer.encode(e.reference) + list(tokenizer.eos_ids))
        for e in domain.examples(config.examples, split="train", seed=config.seed)
    ]
    probe = _Probe.of(domain, tokenizer, config) if config.target_accuracy else None
    model = load_causal_lm(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rng = random.Random(config.seed)
    loss, accuracy, step = float("nan"), None, 0
    while step < config.steps:
        ids, labels = _batch(rng.sample(pairs, min(config.batch, len(pairs))))
        out = model(input_ids=ids, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        loss, step = float(out.loss.detach()), step + 1
        if probe is not None and step % config.check_every == 0:
            accuracy = probe.accuracy(model)
            if accuracy >= config.target_accuracy:
                break
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return WarmupResult(steps=step, loss=loss, train_accuracy=accuracy)


@dataclass(frozen=True, kw_only=True)
class _Probe:
    """Greedy accuracy on a fixed set of train problems."""

    tokenizer: ChatTokenizer
    prompts: list[list[int]]
    answers: list[str]
    domain: Domain

    @classmethod
    def of(cls, domain: Domain, tokenizer: ChatTokenizer, config: WarmupConfig) -> _Probe:
        examples = domain.examples(config.probe, split="train", seed=config.seed + 1)
        return cls(
            tokenizer=tokenizer,
            prompts=[tokenizer.render(e.task.prompt) for e in examples],
            answers=[str(e.task.metadata["answer"]) for e in examples],
            domain=domain,
        )

    def accuracy(self, model: Any) -> float:
        from services.model.greedy import answer_is, greedy_texts

        texts = greedy_texts(model, self.tokenizer, self.prompts, self.domain.max_tokens)
        return sum(map(answer_is, texts, self.answers)) / len(texts)


def _batch(pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids; labels only on the completion (-100 elsewhere, as HF expects)."""
    length = max(len(p) + len(c) for p, c in pairs)
    ids = torch.zeros((len(pairs), length), dtype=torch.long)
    labels = torch.full((len(pairs), length), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(pairs):
        end = len(prompt) + len(completion)
        ids[row, :end] = torch.tensor(prompt + completion)
        labels[row, len(prompt) : end] = torch.tensor(completion)
    return ids, labels
