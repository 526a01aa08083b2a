"""A short supervised warm-up of a policy directory, in place.

A randomly initialised policy almost never writes the answer format, so reinforcement
learning from it sees no reward at all.  Supervised training on reference completions
of a domain's *train* split teaches the format and gives a weak start on the task.
The warm-up stops as soon as the policy answers ``target_accuracy`` of a fixed set of
train problems greedily (checked every ``check_every`` steps), or after ``steps``: a
start that can sample the right answer often but does not yet give it reliably, which
is where reinforcement learning shows.  Held-out problems are never looked at here.

Several domains warm up together as a mix: the examples (and the probe's problems) are
shared out by domain weight, each domain getting at least one.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.domains import Domain, Example
from services.model.load import load_causal_lm
from services.model.tokens import TOOL_CALL_END, ChatTokenizer


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
    #: A progress bar on stderr (steps, loss, the last probe's accuracy); not in the repr,
    #: which keys cached warm-ups.
    progress: bool = field(default=False, repr=False, compare=False)


#: Domains with their weights; a single Domain is a mix of one.
Mix = Sequence[tuple[Domain, float]]


@dataclass(frozen=True, kw_only=True)
class WarmupResult:
    steps: int
    loss: float
    #: Greedy accuracy on the train probe at the end (None when never checked).
    train_accuracy: float | None


def supervised_warmup(model_dir: Path, domains: Domain | Mix, config: WarmupConfig) -> WarmupResult:
    """Train ``model_dir`` on the reference completions of ``domains``, in place."""

    torch.manual_seed(config.seed)
    mix = [(domains, 1.0)] if isinstance(domains, Domain) else list(domains)
    tokenizer = ChatTokenizer.load(model_dir)
    pairs = [
        (tokenizer.render(e.task.prompt), *reference_ids(tokenizer, e))
        for e in mixed_examples(mix, config.examples, config.seed)
    ]
    probe = _Probe.of(mix, tokenizer, config) if config.target_accuracy else None
    model = load_causal_lm(model_dir)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rng = random.Random(config.seed)
    loss, accuracy, step = float("nan"), None, 0
    bar = _progress(config)
    while step < config.steps:
        ids, labels = _batch(rng.sample(pairs, min(config.batch, len(pairs))))
        batch_loss = completion_loss(model, ids, labels)
        optimizer.zero_grad(set_to_none=True)
        batch_loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        loss, step = float(batch_loss.detach()), step + 1
        if probe is not None and step % config.check_every == 0:
            accuracy = probe.accuracy(model)
            if accuracy >= config.target_accuracy:
                break
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", train_acc=accuracy, refresh=False)
    if bar is not None:
        bar.close()
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return WarmupResult(steps=step, loss=loss, train_accuracy=accuracy)


def _progress(config: WarmupConfig) -> Any:
    if not config.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=config.steps, desc="warm-up", unit="step", mininterval=2.0, file=sys.stderr)


def shares(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders), each at least 1."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    counts = [max(1, int(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: int(exact[i]) - exact[i])
    for index in order[: max(0, total - sum(counts))]:
        counts[index] += 1
    return counts


def mixed_examples(mix: Mix, total: int, seed: int) -> list[Example]:
    """About ``total`` train examples shared out over the mix by weight, in mix order."""
    counts = shares(total, [weight for _, weight in mix])
    return [
        example
        for (domain, _), count in zip(mix, counts, strict=True)
        for example in domain.examples(count, split="train", seed=seed)
    ]


@dataclass(frozen=True, kw_only=True)
class _Probe:
    """Greedy accuracy on a fixed set of train problems with an ``answer`` to compare."""

    tokenizer: ChatTokenizer
    prompts: list[list[int]]
    answers: list[str]
    max_tokens: int

    @classmethod
    def of(cls, mix: Mix, tokenizer: ChatTokenizer, config: WarmupConfig) -> _Probe | None:
        # A tool task's answer comes after the tool's output, which one greedy turn never
        # sees: probing it would spend minutes of generation to measure nothing.
        examples = [
            e
            for e in mixed_examples(mix, config.probe, config.seed + 1)
            if "answer" in e.task.metadata and not e.tool_outputs
        ]
        if not examples:
            return None
        return cls(
            tokenizer=tokenizer,
            prompts=[tokenizer.render(e.task.prompt) for e in examples],
            answers=[str(e.task.metadata["answer"]) for e in examples],
            max_tokens=max(e.task.sampling.max_tokens for e in examples),
        )

    def accuracy(self, model: Any) -> float:
        from services.model.greedy import answer_is, greedy_texts

        texts = greedy_texts(model, self.tokenizer, self.prompts, self.max_tokens)
        return sum(map(answer_is, texts, self.answers)) / len(texts)


#: The label of a position that is not trained (HF's convention).
IGNORED = -100
#: (prompt ids, completion ids, completion loss mask): one warm-up example.
Pair = tuple[list[int], list[int], list[bool]]


def reference_ids(tokenizer: ChatTokenizer, example: Example) -> tuple[list[int], list[bool]]:
    """The reference as the agent loop would hold it, and which of its tokens are trained.

    A reference with tool calls is cut after each ``</tool_call>``; the call's output goes
    in between as the loop appends it (``ChatTokenizer.observation``, encoded on its own),
    out of the loss, and the next piece starts the next assistant turn.  A reference without
    them is one turn."""
    outputs = example.tool_outputs
    pieces = _after_calls(example.reference) if outputs else [example.reference]
    if len(pieces) != len(outputs) + 1:
        raise ValueError(
            f"task {example.task.id}: {len(outputs)} tool outputs for {len(pieces) - 1} calls"
        )
    ids: list[int] = []
    mask: list[bool] = []
    for index, piece in enumerate(pieces):
        turn = tokenizer.encode(piece.lstrip("\n") if index else piece)
        if index == len(outputs):
            turn += list(tokenizer.eos_ids)
        ids += turn
        mask += [True] * len(turn)
        if index < len(outputs):
            seen = tokenizer.encode(tokenizer.observation(outputs[index]))
            ids += seen
            mask += [False] * len(seen)
    return ids, mask


def _after_calls(text: str) -> list[str]:
    """``text`` cut after each ``</tool_call>`` (the end stays with its call)."""
    pieces = text.split(TOOL_CALL_END)
    return [piece + TOOL_CALL_END for piece in pieces[:-1]] + [pieces[-1]]


def completion_loss(model: Any, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss HF computes from ``labels`` (each position predicts the next
    token; -100 is not trained), with the output layer applied only where a label is
    trained: over a vocabulary, logits for the prompt's positions are most of a warm-up
    step's work and all of them would be thrown away."""
    hidden = model.base_model(input_ids=ids).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    trained = targets != IGNORED
    logits = model.get_output_embeddings()(hidden[trained])
    return torch.nn.functional.cross_entropy(logits.float(), targets[trained])


def _batch(pairs: list[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids; labels only on the completion's trained tokens (-100 elsewhere,
    as HF expects)."""
    length = max(len(p) + len(c) for p, c, _ in pairs)
    ids = torch.zeros((len(pairs), length), dtype=torch.long)
    labels = torch.full((len(pairs), length), IGNORED, dtype=torch.long)
    for row, (prompt, completion, mask) in enumerate(pairs):
        end = len(prompt) + len(completion)
        ids[row, :end] = torch.tensor(prompt + completion)
        trained = [token if keep else IGNORED for token, keep in zip(completion, mask, strict=True)]
        labels[row, len(prompt) : end] = torch.tensor(trained)
    return ids, labels
