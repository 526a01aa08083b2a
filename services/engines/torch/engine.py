"""The embedded torch engine: a Hugging Face causal LM through transformers, on CPU or one GPU.

- Token ids in, token ids out: the engine never sees text (no tokenizer is loaded).
- Requests are **batched**: concurrent requests decode together, one token per row per
  step, on one worker thread (so the event loop stays free while torch computes).  The
  requests admitted at a step are prefilled together, each prompt's new tokens after its
  own cached prefix, in passes of similar lengths (``Prefill``); a request's KV is
  repeated to its ``n`` rows, and the rows join the running batch, left-padded to the
  batch's width with per-row positions (:mod:`services.engines.torch.batch`); a
  finished row leaves at once.  A decode step on these machines is bound by reading the
  weights, so rows decoded together cost about what one costs alone.  Each request
  samples from its own rows with its own generator, so a seed gives the same draws
  whatever else is in the batch.
- Weight updates are ordered with requests: an update waits for the requests admitted
  before it, and requests that arrive meanwhile wait for the update.
- Prefix cache: a token-level radix tree (:mod:`services.engines.torch.radix`) of per-token
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

A request's rows, job and prefix-cache lease are in :mod:`services.engines.torch.jobs`;
sampling in :mod:`services.engines.torch.sampling`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

import torch
from transformers import DynamicCache, PreTrainedModel

from services.engines.engine import (
    EngineCounters,
    EngineError,
    EngineStatistics,
    GenerateRequest,
    InvalidRequestError,
    Sample,
    WeightUpdateError,
)
from services.engines.torch import attention, linear_forms
from services.engines.torch.batch import Batch, Prefill, full_attention, prefill_groups
from services.engines.torch.jobs import Job, Lease, Row, append_token, eos_ids, resolve
from services.engines.torch.radix import RadixCache, RadixStatistics, common_prefix
from services.engines.torch.sampling import sample_tokens, seeded_generator
from services.model.load import cache_keyword, default_device, default_dtype, load_causal_lm
from services.model.weights import (
    apply_state_dict,
    check_state_dict,
    read_state_dict,
    source_path,
)
from services.runtime.logs import get_logger
from services.runtime.stages import Stages

log = get_logger(component="torch_engine")

P = ParamSpec("P")
R = TypeVar("R")

#: Default prefix-cache bound.  A 0.5B Qwen2 in bf16 takes 12 KiB of KV per token.
DEFAULT_CACHE_BYTES = 512 * 1024**2
#: Axis of the token positions in a radix node's ``[layers, 2, kv_heads, tokens, head_dim]``.
KV_SEQ_DIM = 3
#: Prompts admitted together are prefilled in one pass (:class:`Prefill`) while it computes
#: at most this many tokens (the rows times the most new tokens of a row): measured on a
#: CPU, four prompts of 120 new tokens take 25% less time in one pass than in four, of
#: 400 about 10% less, while prompts of 1,000 are no faster together (their products
#: already run at full speed, and a larger pass spills out of the caches) ...
MAX_PREFILL_TOKENS = 1024
#: ... and at most this much more than the prompts' new tokens (the rest is padding).
PREFILL_SLACK = 0.25
#: A prompt that shares at least this many uncached tokens with another one admitted
#: with it waits for that one's pass, then takes them from the prefix cache.
MIN_SHARED_TOKENS = 32


class TorchEngine:
    """:class:`~services.engines.engine.Engine` over a local transformers model."""

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
        tune_linears: bool = True,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device) if device else default_device()
        self.dtype = dtype or default_dtype(self.device)
        self.cache_bytes = cache_bytes
        self.cache_outputs = cache_outputs
        #: On a CPU, time the two forms of each linear layer's few-row products at load
        #: and use the faster (:mod:`services.engines.torch.linear_forms`).
        self.tune_linears = tune_linears and self.device.type == "cpu"
        #: Per weight shape, the row counts switched to the transposed form (and the
        #: rows it computes for them).
        self.linear_plan: dict[tuple[int, int], dict[int, int]] = {}
        self._version = version
        self._model: PreTrainedModel | None = None
        self._prefix: RadixCache | None = None
        self._cache_kw = "cache"
        self._eos: frozenset[int] = frozenset()
        self._counters = EngineCounters()
        self._closed = False
        # Single worker thread: torch work is serialized however callers are cancelled.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-engine")
        # FIFO for admissions and weight updates: an update waits for requests that came first.
        self._admission = asyncio.Lock()
        self._waiting: list[Job] = []
        self._serving: asyncio.Task[None] | None = None
        self._quiet = asyncio.Event()  # set: no request admitted and unfinished
        self._quiet.set()
        self._batch: Batch[Job] = Batch(self.device)
        self._batchable = True
        self._mask_dtype = torch.bool
        self.decode_steps = 0
        self.decode_rows = 0
        self.peak_rows = 0
        self.prefill_passes = 0
        self.prefill_prompts = 0
        #: Seconds of the engine thread in decode steps and in prefill passes.
        self.stages = Stages()

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
        if self._serving is not None:
            await asyncio.wait([self._serving])  # ends after the step under way
        await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)
        self._model = None
        self._prefix = None

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self._check_open()
        self._check_request(request)
        async with self._admission:
            self._check_open()
            job = Job(request, asyncio.get_running_loop().create_future())
            self._waiting.append(job)
            self._serve_soon()
        try:
            samples, cached = await job.done
        except asyncio.CancelledError:
            job.cancel.set()  # its rows leave the batch at the next step
            raise
        self._count(request, samples, cached)
        return samples

    async def load_weights(self, version: int, source: str) -> None:
        self._check_open()
        cancel = threading.Event()
        async with self._admission:  # requests admitted earlier finish first
            await self._quiet.wait()
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

    def batch_statistics(self) -> dict[str, float]:
        """Decode steps so far, the rows they carried, the most rows in one step; prefill
        passes and the prompts they ran."""
        steps, rows = self.decode_steps, self.decode_rows
        return {
            "decode_steps": steps,
            "decode_rows": rows,
            "rows_per_step": rows / max(steps, 1),
            "prefill_passes": self.prefill_passes,
            "prefill_prompts": self.prefill_prompts,
            "peak_rows": self.peak_rows,
            "decode_s": self.stages.seconds.get("decode", 0.0),
            "prefill_s": self.stages.seconds.get("prefill", 0.0),
        }

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

    def _serve_soon(self) -> None:
        if self._serving is None or self._serving.done():
            self._quiet.clear()
            self._serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        """Step the batch while any request waits or decodes; the worker runs each step."""
        try:
            while (self._waiting or self._batch) and not self._closed:
                admitted = self._admissible()
                try:
                    finished = await self._call(self._step, admitted)
                except Exception as exc:  # torch/transformers failure: infrastructure, typed
                    log.error("batch_step_failed", error=repr(exc), rows=len(self._batch))
                    self._fail(admitted, EngineError(f"torch engine failed: {exc!r}"))
                    continue
                for job in finished:
                    resolve(job)
            if self._closed:
                self._fail([], EngineError("torch engine closed during the request"))
        finally:
            self._quiet.set()

    def _admissible(self) -> list[Job]:
        """The waiting requests that join at the next step: all of them, or one at a time
        for a model whose layers cannot be left-padded (sliding window, recurrent)."""
        if self._batchable:
            admitted, self._waiting = self._waiting, []
        elif self._batch:
            admitted = []
        else:
            admitted, self._waiting = self._waiting[:1], self._waiting[1:]
        return admitted

    def _fail(self, admitted: list[Job], error: EngineError) -> None:
        """Every unfinished request fails with ``error``; the batch starts afresh.

        Only between steps, while the worker thread is idle.
        """
        jobs = {*admitted, *self._waiting, *self._batch.owners}
        self._waiting = []
        self._batch = Batch(self.device)
        for job in jobs:
            if job.lease is not None:
                job.lease.release()
            if not job.done.done():
                job.done.set_exception(error)

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
        model: PreTrainedModel = load_causal_lm(self.model_dir, self.device, self.dtype)
        model.train(False)  # eval mode (dropout off)
        model.requires_grad_(False)
        self._cache_kw = cache_keyword(model)
        self._eos = eos_ids(self.model_dir, model)
        self._batchable = full_attention(DynamicCache(config=model.config))
        if self.device.type == "cpu" and model.config._attn_implementation == "sdpa":
            model.set_attn_implementation(attention.register())
        # SDPA takes a boolean mask (a quarter of a float32 one); eager attention adds it.
        eager = model.config._attn_implementation == "eager"
        self._mask_dtype = self.dtype if eager else torch.bool
        if self.tune_linears and linear_forms.worth_measuring(model):
            self.linear_plan = linear_forms.measure(model)
            linear_forms.apply(model, self.linear_plan)
        self._model = model
        self._prefix = self._new_prefix_cache(model)
        log.info(
            "model_loaded",
            path=str(self.model_dir),
            device=str(self.device),
            dtype=str(self.dtype),
            prefix_cache_bytes=self._prefix.max_bytes if self._prefix else 0,
            attention=model.config._attn_implementation,
            transposed_linears={f"{o}x{i}": w for (o, i), w in self.linear_plan.items()},
        )

    def _new_prefix_cache(self, model: PreTrainedModel) -> RadixCache | None:
        if self.cache_bytes <= 0:
            return None
        if not self._batchable:
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
    def _step(self, admitted: list[Job]) -> list[Job]:
        """One step: every decoding row gets its next token, new requests their first.

        Returns the requests that finished (their ``result`` set).
        """
        self._drop_cancelled()
        if self._batch:
            with self.stages.stage("decode"):
                self._advance()
        at_once: list[Job] = []
        ready: list[Job] = []
        for job in admitted:
            if job.cancel.is_set():
                continue
            (ready if self._open(job) else at_once).append(job)
        while ready:
            wave, ready = self._first_wave(ready)
            for job in wave:
                job.lease = Lease(self._prefix, job.prompt, self._new_cache).acquire()
            suffixes = [len(job.prompt) - self._lease(job).cached for job in wave]
            for group in prefill_groups(suffixes, MAX_PREFILL_TOKENS, PREFILL_SLACK):
                with self.stages.stage("prefill"):
                    self._prefill([wave[i] for i in group])
        return at_once + self._retire()

    def _first_wave(self, jobs: list[Job]) -> tuple[list[Job], list[Job]]:
        """(the prompts to prefill now, those that wait for them).

        Prompts admitted together often share a prefix that is not cached yet (a system
        prompt): one of them prefills it, the others wait one pass and take it from the
        cache.  Sorted, each prompt shares the most with its neighbours.
        """
        if self._prefix is None or len(jobs) < 2:
            return jobs, []
        cached = [self._prefix.cached_length(job.prompt[:-1]) for job in jobs]
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].prompt)
        waiting = {
            b
            for a, b in itertools.pairwise(order)
            if common_prefix(jobs[a].prompt, jobs[b].prompt) - cached[b] >= MIN_SHARED_TOKENS
        }
        return (
            [job for i, job in enumerate(jobs) if i not in waiting],
            [job for i, job in enumerate(jobs) if i in waiting],
        )

    def _drop_cancelled(self) -> None:
        batch = self._batch
        keep = [i for i, job in enumerate(batch.owners) if not job.cancel.is_set()]
        if len(keep) == len(batch):
            return
        for job in dict.fromkeys(batch.owners):
            if job.cancel.is_set() and job.lease is not None:
                job.lease.release()
        batch.keep(keep)

    def _open(self, job: Job) -> bool:
        """Set a request up; False when it has no room for any output (it finishes at
        once, never joining the batch)."""
        request, sampling = job.request, job.request.sampling
        job.prompt = list(request.prompt_ids)
        job.rows = [Row() for _ in range(request.n)]
        job.budget = min(sampling.max_new_tokens, self.max_context - len(job.prompt))
        if job.budget <= 0:
            for row in job.rows:
                row.finish = "length"
            job.result = ([self._sample(row, 0) for row in job.rows], 0)
            return False
        job.generator = seeded_generator(self.device, sampling.seed)
        job.stop = self._eos | set(sampling.stop_token_ids)
        return True

    def _prefill(self, jobs: list[Job]) -> None:
        """Run the prompts' new tokens in one pass, store their KV, sample each row's
        first token, and join the batch (a request's ``n`` rows share its prefill)."""
        leases = [self._lease(job) for job in jobs]
        prefill = Prefill.build(
            [lease.cache for lease in leases],
            [job.prompt[lease.cached :] for job, lease in zip(jobs, leases, strict=True)],
            lambda: self._new_cache(None),
            self._mask_dtype,
            self.device,
        )
        logits = self._logits(**prefill.inputs, **{self._cache_kw: prefill.cache})
        self.prefill_passes += 1
        self.prefill_prompts += len(jobs)
        lengths = prefill.settle()
        for row, (job, lease) in enumerate(zip(jobs, leases, strict=True)):
            lease.store(job.prompt, prefill.row_kv(row), lease.cached, pin=True)
        order = [row for row, job in enumerate(jobs) for _ in range(job.request.n)]
        if len(order) > len(jobs):  # one prefill, n rows of a request
            prefill.cache.batch_select_indices(torch.tensor(order, device=self.device))
        for row, job in enumerate(jobs):
            n = job.request.n
            self._sample_rows(job, range(n), logits[row : row + 1].expand(n, -1))
        members = [(job, r) for job in jobs for r in range(job.request.n)]
        self._batch.join(prefill.cache, members, [lengths[row] for row in order])

    @staticmethod
    def _lease(job: Job) -> Lease:
        assert job.lease is not None, "a request's lease is taken when it is opened"
        return job.lease

    def _advance(self) -> None:
        """Feed every row its last token; sample the next one per request."""
        batch = self._batch
        last = [job.rows[r].output[-1] for job, r in batch.members()]
        logits = self._forward_batch(batch, last)
        self.decode_steps += 1
        self.decode_rows += len(batch)
        self.peak_rows = max(self.peak_rows, len(batch))
        for job, span in batch.spans():
            self._sample_rows(job, batch.rows[span], logits[span])

    def _sample_rows(self, job: Job, rows: Sequence[int], logits: torch.Tensor) -> None:
        assert job.generator is not None
        tokens, logprobs = sample_tokens(logits, job.request.sampling, job.generator)
        for r, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            append_token(job.rows[r], token, logprob, job.stop, job.budget)

    def _retire(self) -> list[Job]:
        """Store the finished rows' KV, drop them from the batch; the requests done."""
        batch = self._batch
        keep: list[int] = []
        leaving: list[Job] = []
        for i, (job, r) in enumerate(batch.members()):
            row = job.rows[r]
            if row.finish is None:
                keep.append(i)
                continue
            leaving.append(job)
            if self.cache_outputs and job.lease is not None:
                # All but the last token, whose KV was never computed.
                start, end = len(job.prompt), len(job.prompt) + len(row.output) - 1
                kv = batch.row_kv(i, start, end)
                job.lease.store(job.prompt + row.output[:-1], kv, start)
        if len(keep) < len(batch):
            batch.keep(keep)
        done = [job for job in dict.fromkeys(leaving) if job.finished]
        for job in done:
            self._complete(job)
        return done

    def _complete(self, job: Job) -> None:
        assert job.lease is not None
        cached = job.lease.cached
        job.lease.release()
        job.result = ([self._sample(row, cached) for row in job.rows], cached)

    def _sample(self, row: Row, cached: int) -> Sample:
        return Sample(
            output_ids=row.output,
            logprobs=row.logprobs,
            finish=row.finish or "abort",
            cached_tokens=cached,
            version=self._version,
        )

    def _new_cache(self, kv: torch.Tensor | None) -> DynamicCache:
        cache = DynamicCache(config=self._loaded().config)
        if kv is not None:
            for layer, (keys, values) in enumerate(kv):
                cache.update(keys.unsqueeze(0), values.unsqueeze(0), layer)
        return cache

    def _forward_batch(self, batch: Batch[Job], last: list[int]) -> torch.Tensor:
        return self._logits(**batch.step(last), **{self._cache_kw: batch.cache})

    def _logits(self, **inputs: object) -> torch.Tensor:
        out = self._loaded()(use_cache=True, logits_to_keep=1, **inputs)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits.float()
