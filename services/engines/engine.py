"""The one interface every inference engine implements.

An engine takes prompt token ids and returns, per sample, the generated token ids
with the behaviour logprob of each, the finish reason and how many prompt tokens
came from its prefix cache.  Text never crosses this boundary: the agent loop keeps
conversations as token ids so nothing is re-tokenized between turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishKind = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """The engine failed to serve a request (not the model's fault): ``infra_failure``."""


class TurnTimeout(EngineError):
    """A turn ran past its time limit (retried like an engine failure, counted apart)."""


class InvalidRequestError(ValueError):
    """The request itself is unusable (empty prompt, prompt filling the context, token ids
    outside the vocabulary): the task is ``invalid``, the engine is fine."""


class WeightUpdateError(EngineError):
    """A weight update did not complete; the engine keeps serving its previous version."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(f"weight update to version {version} failed: {reason}")
        self.version = version
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Sampling parameters of one request (engine-neutral)."""

    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 disables top-k.
    top_k: int = -1
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    prompt_ids: Sequence[int]
    sampling: Sampling = field(default_factory=Sampling)
    #: Samples of the same prompt (a GRPO group), decoded together where the engine can.
    n: int = 1
    #: Routing key: requests with the same key go to the same server, whose prefix cache
    #: holds what they share.  The agent loop uses the task id for every turn of every sample.
    trajectory_id: str = ""


@dataclass(frozen=True, kw_only=True)
class Sample:
    output_ids: list[int]
    #: Behaviour logprob of each output token under the policy that sampled it.
    logprobs: list[float]
    finish: FinishKind
    #: Prompt tokens served from the prefix cache for this sample.
    cached_tokens: int
    #: Policy version that produced the tokens.
    version: int
    #: The server that generated it; empty for an embedded engine.
    server: str = ""


@dataclass(frozen=True, kw_only=True)
class EngineStatistics:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    version: int = 0
    weight_updates: int = 0

    @property
    def cache_hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(kw_only=True)
class EngineCounters:
    """Running totals kept by an engine; :meth:`snapshot` is what ``statistics()`` returns."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    weight_updates: int = 0

    def snapshot(self, version: int) -> EngineStatistics:
        return EngineStatistics(
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            generated_tokens=self.generated_tokens,
            version=version,
            weight_updates=self.weight_updates,
        )


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving one policy version at a time."""

    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """``request.n`` samples; raises :class:`EngineError` on failure, never a made-up output."""
        ...

    async def load_weights(self, version: int, source: str) -> None:
        """Serve ``version`` from ``source`` (a Hugging Face directory) from the next request on.

        A transaction: in-flight requests finish first (or are paused), the prefix cache is
        flushed, and a failure raises :class:`WeightUpdateError` leaving the old weights live.
        """
        ...

    async def healthy(self) -> bool: ...

    def statistics(self) -> EngineStatistics: ...

    def batch_statistics(self) -> dict[str, float]:
        """How the engine batches requests on its side: ``decode_steps``, ``decode_rows``,
        ``rows_per_step``, ``peak_rows``, ``prefill_passes``, ``prefill_prompts``,
        ``decode_s`` and ``prefill_s``.  Empty for an engine whose server batches out of
        sight (SGLang): there is nothing of its own to report."""
        ...
