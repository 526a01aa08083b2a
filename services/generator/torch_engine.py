"""The embedded torch engine: a Hugging Face causal LM through transformers, on CPU or one GPU.

- Token ids in, token ids out: the engine never sees text (no tokenizer is loaded).
- Requests are **serialized**: one worker thread runs one request at a time, in arrival
  order (a FIFO asyncio lock in front of a single-thread executor), so the event loop stays
  free while torch computes.  The ``n`` samples of a request are one batch: the prompt is
  prefilled once, its KV repeated to ``n`` rows, and the rows decoded together (identical
  lengths, so no padding or attention mask).  A finished row leaves the batch.
  Micro-batching different prompts would need padding and per-row positions; on the CPU
  the prefix cache buys more than that would.
- Prefix cache: a token-level radix tree (:mod:`services.generator.radix`) of per-token
  KV.  The longest cached prefix of ``prompt[:-1]`` is reused (at least one prompt token
  always runs, to get the logits of the first new token).  After prefill the prompt is
  stored; when a sample finishes, prompt + its output (all but the last token, whose KV was
  never computed) is stored too, so the next agent turn (prompt + output + tool output)
  hits.  The cache is flushed on every weight update.
- Behaviour logprob of a token = log-softmax of the raw logits (temperature 1, before any
  top-k/top-p filtering) at the sampled token, in float32: what a fresh forward pass of
  the learner computes for the same tokens.
- A stop token (``stop_token_ids`` or the model's eos ids) ends a sample and is included in
  its output with its logprob (the policy chose to stop; the learner trains on it).
- ``cached_tokens`` of a sample = prompt tokens whose KV came from the prefix cache; the
  statistics count each request's prompt once (it is prefilled once for all ``n`` samples).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from services.generator.engine import (
    EngineCounters,
    EngineError,
    EngineStatistics,
    FinishKind,
    GenerateRequest,
    InvalidRequestError,
    Sample,
    Sampling,
    WeightUpdateError,
)
from services.generator.radix import Match, Node, RadixCache, RadixStatistics
from services.generator.torch_weights import (
    apply_state_dict,
    check_state_dict,
    read_state_dict,
    source_path,
)
from services.runtime.logs import get_logger

log = get_logger(component="torch_engine")

#: transformers' from_pretrained is not thread-safe (two engines loading at once in two
#: threads get meta tensors and untied heads): loads are serialized process-wide.
_LOAD_LOCK = threading.Lock()

P = ParamSpec("P")
R = TypeVar("R")

#: Default prefix-cache bound.  A 0.5B Qwen2 in bf16 takes 12 KiB of KV per token.
DEFAULT_CACHE_BYTES = 512 * 1024**2
#: Axis of the token positions in a radix node's ``[layers, 2, kv_heads, tokens, head_dim]``.
KV_SEQ_DIM = 3


@dataclass
class _Row:
    """One sample being decoded."""

    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishKind | None = None


class TorchEngine:
    """:class:`~services.generator.engine.Engine` over a local transformers model."""

    name = "torch"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        cache_outputs: bool = True,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # bf16 on a GPU; float32 on the CPU, where bf16 is several times slower.
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.cache_bytes = cache_bytes
        self.cache_outputs = cache_outputs
        self._version = version
        self._model: PreTrainedModel | None = None
        self._prefix: RadixCache | None = None
        self._cache_kw = "cache"
        self._eos: frozenset[int] = frozenset()
        self._counters = EngineCounters()
        self._closed = False
        # Single worker thread: torch work is serialized however callers are cancelled.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-engine")
        # FIFO in front of the executor: a weight update waits for requests that came first.
        self._lock = asyncio.Lock()
        self._running: threading.Event | None = None

    # ------------------------------------------------------------------ Engine API

    async def start(self) -> None:
        if self._model is not None:
            return
        try:
            await self._call(self._load_model)
        except Exception as exc:
            raise EngineError(f"cannot load a model from {self.model_dir}: {exc!r}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._running is not None:
            self._running.set()  # the current request stops at its next decode step
        await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)
        self._model = None
        self._prefix = None

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self._check_open()
        self._check_request(request)
        cancel = threading.Event()
        async with self._lock:
            self._check_open()
            self._running = cancel
            try:
                samples, cached = await self._call(self._generate, request, cancel)
            except asyncio.CancelledError:
                cancel.set()
                if self._closed and not _cancelling():
                    # close() dropped the queued work: a failure, not a cancellation.
                    raise EngineError("torch engine closed during the request") from None
                raise
            except (EngineError, InvalidRequestError):
                raise
            except Exception as exc:  # torch/transformers failure: infrastructure, typed
                raise EngineError(f"torch engine failed: {exc!r}") from exc
            finally:
                self._running = None
        self._count(request, samples, cached)
        return samples

    async def load_weights(self, version: int, source: str) -> None:
        self._check_open()
        cancel = threading.Event()
        async with self._lock:  # in-flight and earlier requests finish first
            try:
                await self._call(self._load_weights, version, source, cancel)
            except asyncio.CancelledError:
                cancel.set()  # a caller's timeout: give up unless the copy already began
                raise
            except WeightUpdateError:
                raise
            except Exception as exc:
                raise WeightUpdateError(version, repr(exc)) from exc
        log.info("weights_loaded", version=version, source=source)

    async def healthy(self) -> bool:
        return self._model is not None and not self._closed

    def statistics(self) -> EngineStatistics:
        return self._counters.snapshot(self._version)

    # ------------------------------------------------------------------ extras

    def cache_statistics(self) -> RadixStatistics:
        """The prefix cache's own figures (all zero when it is disabled)."""
        return self._prefix.statistics() if self._prefix is not None else RadixStatistics()

    @property
    def max_context(self) -> int:
        """Prompt + output tokens the model's positions allow."""
        return int(self._loaded().config.max_position_embeddings)

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ plumbing

    async def _call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn`` on the worker thread (after whatever was submitted before it)."""
        future = self._executor.submit(fn, *args, **kwargs)
        return await asyncio.wrap_future(future)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("torch engine is closed")
        if self._model is None:
            raise EngineError("torch engine is not started")

    def _check_request(self, request: GenerateRequest) -> None:
        prompt = request.prompt_ids
        vocab = int(self._loaded().config.vocab_size)
        if not prompt:
            raise InvalidRequestError("empty prompt")
        if len(prompt) >= self.max_context:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens leaves no room in a {self.max_context} context"
            )
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidRequestError(f"prompt token id outside the vocabulary [0, {vocab})")
        if request.n < 1:
            raise InvalidRequestError(f"n must be >= 1, got {request.n}")

    def _count(self, request: GenerateRequest, samples: list[Sample], cached: int) -> None:
        c = self._counters
        c.requests += 1
        c.prompt_tokens += len(request.prompt_ids)
        c.cached_tokens += cached
        c.generated_tokens += sum(len(s.output_ids) for s in samples)

    def _loaded(self) -> PreTrainedModel:
        if self._model is None:
            raise EngineError("torch engine is not started")
        return self._model

    # ------------------------------------------------------------------ worker thread

    def _load_model(self) -> None:
        with _LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype)
        # nn.Module.to: PreTrainedModel.to's decorator confuses type checkers.
        torch.nn.Module.to(model, self.device)
        model.train(False)  # eval mode (dropout off)
        model.requires_grad_(False)
        # transformers 5 renamed ``past_key_values`` to ``cache`` (old name deprecated).
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._eos = _eos_ids(self.model_dir, model)
        self._model = model
        self._prefix = self._new_prefix_cache(model)
        log.info(
            "model_loaded",
            path=str(self.model_dir),
            device=str(self.device),
            dtype=str(self.dtype),
            prefix_cache_bytes=self._prefix.max_bytes if self._prefix else 0,
        )

    def _new_prefix_cache(self, model: PreTrainedModel) -> RadixCache | None:
        if self.cache_bytes <= 0:
            return None
        layers = DynamicCache(config=model.config).layers
        if any(type(layer) is not DynamicLayer for layer in layers):
            # Sliding-window or recurrent layers do not keep one K/V per token.
            log.warning("prefix_cache_disabled", reason="model has non-full-attention layers")
            return None
        return RadixCache(self.cache_bytes, seq_dim=KV_SEQ_DIM)

    def _load_weights(self, version: int, source: str, cancel: threading.Event) -> None:
        """Read and check everything first; the model changes only once nothing can fail.

        A cancel that arrives during the (short, in-memory) copy does not stop it: the new
        version is then live, as ``statistics().version`` says.
        """
        model = self._loaded()
        try:
            state = read_state_dict(source_path(source))
            check_state_dict(model, state)
        except (OSError, ValueError) as exc:
            raise WeightUpdateError(version, str(exc)) from exc
        except Exception as exc:  # e.g. a corrupt safetensors header
            raise WeightUpdateError(version, repr(exc)) from exc
        if cancel.is_set():
            raise WeightUpdateError(version, "cancelled before the weights were swapped")
        apply_state_dict(model, state)
        self._counters.weight_updates += 1
        if self._prefix is not None:
            self._prefix.clear()  # KV computed by the old weights is stale
        self._version = version

    @torch.inference_mode()
    def _generate(
        self, request: GenerateRequest, cancel: threading.Event
    ) -> tuple[list[Sample], int]:
        """(samples, prompt tokens served from the prefix cache)."""
        prompt = list(request.prompt_ids)
        sampling = request.sampling
        budget = min(sampling.max_new_tokens, self.max_context - len(prompt))
        if budget <= 0:
            return [self._sample(_Row(finish="length"), 0) for _ in range(request.n)], 0
        with self._prefix_lease(prompt) as lease:
            logits = self._prefill(prompt, lease)
            rows = self._decode(prompt, lease, logits, sampling, request.n, budget, cancel)
        return [self._sample(row, lease.cached) for row in rows], lease.cached

    def _sample(self, row: _Row, cached: int) -> Sample:
        return Sample(
            output_ids=row.output,
            logprobs=row.logprobs,
            finish=row.finish or "abort",
            cached_tokens=cached,
            version=self._version,
        )

    def _prefix_lease(self, prompt: list[int]) -> _Lease:
        return _Lease(self._prefix, prompt, self._new_cache)

    def _new_cache(self, kv: torch.Tensor | None) -> DynamicCache:
        cache = DynamicCache(config=self._loaded().config)
        if kv is not None:
            for layer, (keys, values) in enumerate(kv):
                cache.update(keys.unsqueeze(0), values.unsqueeze(0), layer)
        return cache

    def _prefill(self, prompt: list[int], lease: _Lease) -> torch.Tensor:
        ids = torch.tensor([prompt[lease.cached :]], device=self.device)
        logits = self._forward(ids, lease.cache)
        lease.store(prompt, lease.cached, row=0, pin=True)
        return logits

    def _decode(
        self,
        prompt: list[int],
        lease: _Lease,
        logits: torch.Tensor,
        sampling: Sampling,
        n: int,
        budget: int,
        cancel: threading.Event,
    ) -> list[_Row]:
        """Sample ``n`` continuations from the prefill ``logits`` ([1, vocab])."""
        generator = _generator(self.device, sampling.seed)
        stop = self._eos | set(sampling.stop_token_ids)
        rows = [_Row() for _ in range(n)]
        active = list(range(n))  # batch position -> row
        if n > 1:  # one prefill, n rows (repeat_interleave copies even for 1)
            lease.cache.batch_repeat_interleave(n)
            logits = logits.expand(n, -1)
        while active:
            tokens, logprobs = sample_tokens(logits, sampling, generator)
            for r, token, logprob in zip(active, tokens.tolist(), logprobs.tolist(), strict=True):
                _append(rows[r], token, logprob, stop, budget)
            if cancel.is_set():
                break
            keep = [i for i, r in enumerate(active) if rows[r].finish is None]
            if len(keep) < len(active):
                self._retire(prompt, lease, rows, active, keep)
                active = [active[i] for i in keep]
            if active:
                last = torch.tensor([[rows[r].output[-1]] for r in active], device=self.device)
                logits = self._forward(last, lease.cache)
        return rows

    def _retire(
        self, prompt: list[int], lease: _Lease, rows: list[_Row], active: list[int], keep: list[int]
    ) -> None:
        """Store the finished rows' KV, then drop them from the batch."""
        if self.cache_outputs:
            for i, r in enumerate(active):
                if rows[r].finish is not None:
                    lease.store(prompt + rows[r].output[:-1], len(prompt), row=i)
        if keep:
            lease.cache.batch_select_indices(torch.tensor(keep, device=self.device))

    def _forward(self, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Logits of the last position, float32, [batch, vocab]; ``cache`` grows in place."""
        kwargs = {self._cache_kw: cache}
        out = self._loaded()(input_ids=ids, use_cache=True, logits_to_keep=1, **kwargs)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits.float()


class _Lease:
    """A request's hold on the prefix cache: its matched KV and the nodes it pins.

    A context manager so that the pin is released however decoding ends.
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

    def __enter__(self) -> _Lease:
        match: Match | None = None
        if self.prefix is not None:
            # Never the whole prompt: its last token must run to give the next logits.
            match = self.prefix.match(self.prompt[:-1])
            self._pin(match.node)
        self.cached = match.length if match is not None else 0
        self.cache = self.new_cache(match.value if match is not None else None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.prefix is not None and self.node is not None:
            self.prefix.unlock(self.node)
            self.node = None

    def store(self, tokens: list[int], offset: int, *, row: int, pin: bool = False) -> None:
        """Insert ``tokens``, whose KV from ``offset`` on is batch row ``row`` of the cache.

        ``pin`` moves this request's pin to the stored node (the prompt: every output of
        the request is stored under it later).
        """
        if self.prefix is None or len(tokens) <= offset:
            return
        kv = torch.stack([_row_kv(layer, row, offset, len(tokens)) for layer in self.cache.layers])
        node = self.prefix.insert(tokens, kv, offset=offset)
        if pin:
            self._pin(node)

    def _pin(self, node: Node) -> None:
        assert self.prefix is not None
        self.prefix.lock(node)
        if self.node is not None:
            self.prefix.unlock(self.node)
        self.node = node


def _row_kv(layer: object, row: int, start: int, end: int) -> torch.Tensor:
    """[2, kv_heads, end - start, head_dim] of one batch row of one cache layer."""
    # The prefix cache is only enabled when every layer is a plain DynamicLayer.
    assert isinstance(layer, DynamicLayer)
    keys, values = layer.keys, layer.values
    assert keys is not None and values is not None
    return torch.stack((keys[row, :, start:end], values[row, :, start:end]))


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# ---------------------------------------------------------------------- sampling


def sample_tokens(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, behaviour logprobs) for each row of float32 ``logits`` [batch, vocab].

    The logprob is taken from the raw distribution (temperature 1, unfiltered) whatever
    the sampling parameters: it is what the learner recomputes.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    if sampling.temperature <= 0:
        tokens = logits.argmax(dim=-1)
    else:
        scores = filter_top_p(
            filter_top_k(logits / sampling.temperature, sampling.top_k), sampling.top_p
        )
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)


def filter_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` best scores of each row (ties at the k-th kept); -1 or 0 keeps all."""
    if k <= 0 or k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def filter_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of best tokens whose probability reaches ``p`` (at least one)."""
    if p >= 1.0:
        return scores
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    # A token is dropped when the tokens before it already reach p.
    drop = (probs.cumsum(dim=-1) - probs) >= p
    drop[..., 0] = False
    return scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def _append(row: _Row, token: int, logprob: float, stop: frozenset[int], budget: int) -> None:
    row.output.append(token)
    row.logprobs.append(logprob)
    if token in stop:
        row.finish = "stop"
    elif len(row.output) >= budget:
        row.finish = "length"


def _generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A per-request generator: the same seed gives the same samples."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _eos_ids(model_dir: Path, model: PreTrainedModel) -> frozenset[int]:
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
