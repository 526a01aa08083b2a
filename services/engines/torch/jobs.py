"""The torch engine's bookkeeping of a request: its rows, its job and its prefix-cache lease."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from services.engines.engine import FinishKind, GenerateRequest, Sample
from services.engines.torch.radix import Match, Node, RadixCache


@dataclass
class Row:
    """One sample being decoded."""

    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishKind | None = None


@dataclass(eq=False)
class Job:
    """A request from admission to its samples.

    ``done`` belongs to the event loop; the rest to the worker thread once admitted.
    """

    request: GenerateRequest
    done: asyncio.Future[tuple[list[Sample], int]]
    cancel: threading.Event = field(default_factory=threading.Event)
    prompt: list[int] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    lease: Lease | None = None
    generator: torch.Generator | None = None
    stop: frozenset[int] = frozenset()
    budget: int = 0
    result: tuple[list[Sample], int] | None = None

    @property
    def finished(self) -> bool:
        return all(row.finish is not None for row in self.rows)


class Lease:
    """A request's hold on the prefix cache: its matched KV and the node it pins.

    ``acquire`` on admission, ``release`` once the request leaves the batch (finished,
    cancelled or failed), so that the tree never evicts what a request still extends.
    """

    def __init__(
        self,
        prefix: RadixCache | None,
        prompt: list[int],
        new_cache: Callable[[torch.Tensor | None], DynamicCache],
    ) -> None:
        self.prefix = prefix
        self.prompt = prompt
        self.new_cache = new_cache
        self.node: Node | None = None
        self.cached = 0
        self.cache = DynamicCache()

    def acquire(self) -> Lease:
        match: Match | None = None
        if self.prefix is not None:
            # Never the whole prompt: its last token must run to give the next logits.
            match = self.prefix.match(self.prompt[:-1])
            self._pin(match.node)
        self.cached = match.length if match is not None else 0
        self.cache = self.new_cache(match.value if match is not None else None)
        return self

    def release(self) -> None:
        if self.prefix is not None and self.node is not None:
            self.prefix.unlock(self.node)
            self.node = None

    def store(self, tokens: list[int], kv: torch.Tensor, offset: int, *, pin: bool = False) -> None:
        """Insert ``tokens`` whose KV from ``offset`` on is ``kv``.

        ``pin`` moves this request's pin to the stored node (the prompt: every output of
        the request is stored under it later).
        """
        if self.prefix is None or len(tokens) <= offset:
            return
        node = self.prefix.insert(tokens, kv, offset=offset)
        if pin:
            self._pin(node)

    def _pin(self, node: Node) -> None:
        assert self.prefix is not None
        self.prefix.lock(node)
        if self.node is not None:
            self.prefix.unlock(self.node)
        self.node = node


def resolve(job: Job) -> None:
    """Hand a finished request its samples (on the event loop's thread)."""
    if job.result is not None and not job.done.done():
        job.done.set_result(job.result)


def append_token(row: Row, token: int, logprob: float, stop: frozenset[int], budget: int) -> None:
    row.output.append(token)
    row.logprobs.append(logprob)
    if token in stop:
        row.finish = "stop"
    elif len(row.output) >= budget:
        row.finish = "length"


def eos_ids(model_dir: Path, model: PreTrainedModel) -> frozenset[int]:
    """End-of-sequence ids from generation_config.json and config (int or list in either)."""
    found: set[int] = set()
    sources: list[object] = [getattr(model.config, "eos_token_id", None)]
    generation = model_dir / "generation_config.json"
    if generation.is_file():
        sources.append(json.loads(generation.read_text()).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list):
            found.update(v for v in value if isinstance(v, int))
    return frozenset(found)
