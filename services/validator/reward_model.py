"""A learned reward: a sequence-scoring model from a Hugging Face directory, batched, on CPU.

The directory holds an ``AutoModelForSequenceClassification`` with one label and
its tokenizer.  Rollouts of every domain that names the same directory share one
:class:`RewardBatcher`: requests wait up to ``max_wait_s`` for company, up to
``max_batch`` at once, and one forward pass (in a worker thread, so the event loop
keeps consuming) scores them all.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from protocol.messages import Rollout
from services.validator.base import InfraFailure, Verdict

ScoreTexts = Callable[[Sequence[str]], list[float]]


class RewardModel:
    """Loads once; ``__call__`` scores a batch of texts (one float each), float32 on CPU."""

    def __init__(self, path: Path, max_length: int = 1024) -> None:
        # Imported here: a validator without a reward model never pays for torch.
        import torch

        from services.model.load import load_sequence_scorer

        self.path = path
        self.max_length = max_length
        self._torch = torch
        self.tokenizer, self.model = load_sequence_scorer(path)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        batch = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with self._torch.inference_mode():
            logits = self.model(**batch).logits
        return [float(v) for v in logits[:, 0].tolist()]


@dataclass
class _Pending:
    text: str
    future: asyncio.Future[float]


class RewardBatcher:
    """Collects score requests into batches; :meth:`run` is owned by the service's TaskGroup."""

    def __init__(self, model: ScoreTexts, max_batch: int, max_wait_s: float) -> None:
        self._model = model
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        # Bounded: callers wait (backpressure) rather than pile up; the consumer's
        # in-flight limit keeps them well under it in practice.
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max(1, 8 * max_batch))
        self.batches = 0
        self.scored = 0

    async def score(self, text: str) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(text, future))
        return await future

    async def run(self) -> None:
        while True:
            batch = await self._collect()
            await self._forward(batch)

    async def _collect(self) -> list[_Pending]:
        batch = [await self._queue.get()]
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while len(batch) < self.max_batch:
            if self._queue.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        batch.append(await self._queue.get())
                except TimeoutError:
                    break
            else:
                batch.append(self._queue.get_nowait())
        return batch

    async def _forward(self, batch: list[_Pending]) -> None:
        # A caller that timed out (its validator's timeout) cancelled its future: skip it.
        live = [item for item in batch if not item.future.done()]
        if not live:
            return
        try:
            scores = await asyncio.to_thread(self._model, [item.text for item in live])
            if len(scores) != len(live):
                raise ValueError(f"{len(scores)} scores for {len(live)} texts")
        except Exception as error:  # the model failing is the machinery failing
            failure = InfraFailure(f"reward model failed: {type(error).__name__}: {error}")
            for item in live:
                if not item.future.done():
                    item.future.set_exception(failure)
            return
        self.batches += 1
        self.scored += len(live)
        for item, value in zip(live, scores, strict=True):
            if not item.future.done():
                item.future.set_result(value)


@dataclass(frozen=True)
class RewardModelScore:
    """The reward model's score of the completion (optionally with the prompt before it)."""

    batcher: RewardBatcher
    transform: Literal["sigmoid", "raw"] = "sigmoid"
    include_prompt: bool = True

    async def score(self, rollout: Rollout) -> Verdict:
        value = await self.batcher.score(self.text(rollout))
        if not math.isfinite(value):
            raise InfraFailure(f"reward model returned {value}")
        if self.transform == "sigmoid":
            return Verdict(
                1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, value)))), f"logit {value:.4f}"
            )
        return Verdict(value, "raw score")

    def text(self, rollout: Rollout) -> str:
        if not self.include_prompt:
            return rollout.completion_text
        prompt = "\n".join(m.content for m in rollout.task.prompt)
        return f"{prompt}\n{rollout.completion_text}"


def init_reward_model(path: Path, *, hidden_size: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """Write a tiny random Qwen2 sequence scorer (one label) and its tokenizer to ``path``.

    For running the stack, the tests and the benchmarks on a CPU without downloads; it
    shares the tiny policy's tokenizer (``temper model init``).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from services.model.tiny import PAD_TOKEN, build_tokenizer

    tokenizer = build_tokenizer(512, seed)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=pad,
    )
    config.num_labels = 1  # one score per sequence
    torch.manual_seed(seed)
    model: Any = Qwen2ForSequenceClassification(config)  # type: ignore[no-untyped-call]
    model = model.to(torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    model.save_pretrained(str(path), safe_serialization=True)
    return path
