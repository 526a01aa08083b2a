"""Greedy answers of a model in this process (HF generate, one left-padded batch).

The warm-up's stopping check uses it on train problems; the end-to-end benchmark scores
a peer's snapshots on the held-out set with it (and Temper's start policy, as a check
that it agrees with the held-out evaluation run through the stack).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from services.evaluation.heldout import HeldoutSet
from services.model.load import load_causal_lm
from services.model.tokens import ChatTokenizer

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@torch.no_grad()
def greedy_texts(
    model: Any, tokenizer: ChatTokenizer, prompts: list[list[int]], max_new: int
) -> list[str]:
    was_training = model.training
    model.eval()
    pad = int(model.config.pad_token_id or 0)
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt) :] = torch.tensor(prompt)
        attention[row, length - len(prompt) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=pad,
    )
    model.train(was_training)
    return [tokenizer.decode(row[length:].tolist()) for row in out]


def answer_is(text: str, answer: str) -> bool:
    """The first ``<answer>`` tag holds ``answer`` (the arithmetic validator's rule)."""
    match = _ANSWER.search(text)
    return match is not None and match.group(1).strip() == answer


def heldout_greedy_accuracy(model_dir: Path, heldout: HeldoutSet) -> float:

    tokenizer = ChatTokenizer.load(model_dir)
    model = load_causal_lm(model_dir)
    domain = heldout.domain
    prompts = [tokenizer.render(domain.prompt.messages(p.question)) for p in heldout.problems]
    texts = greedy_texts(model, tokenizer, prompts, domain.max_tokens)
    answers = [str(p.metadata["answer"]) for p in heldout.problems]
    return sum(map(answer_is, texts, answers)) / len(answers)
