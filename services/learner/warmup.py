"""A short supervised warm-up of a policy directory, in place.

A randomly initialised policy almost never writes the answer format, so reinforcement
learning from it sees no reward at all.  A few steps of supervised training on
reference completions of a domain's *train* split teach the format (and give a weak
start on the task); reinforcement learning then does the rest, measured on reward.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.domains import Domain
from services.generator.tokens import ChatTokenizer


@dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    steps: int = 40
    batch: int = 32
    lr: float = 3e-3
    examples: int = 512
    seed: int = 0


def supervised_warmup(model_dir: Path, domain: Domain, config: WarmupConfig) -> float:
    """Train ``model_dir`` on ``domain``'s reference completions; returns the last loss."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(config.seed)
    tokenizer = ChatTokenizer.load(model_dir)
    pairs = [
        (tokenizer.render(e.task.prompt), tokenizer.encode(e.reference) + list(tokenizer.eos_ids))
        for e in domain.examples(config.examples, split="train", seed=config.seed)
    ]
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rng = random.Random(config.seed)
    loss = float("nan")
    for _ in range(config.steps):
        ids, labels = _batch(rng.sample(pairs, min(config.batch, len(pairs))))
        out = model(input_ids=ids, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        loss = float(out.loss.detach())
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return loss


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
