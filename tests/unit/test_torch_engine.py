"""The torch engine on tiny random Qwen2 models: logprobs, prefix cache, batching, weights.

Behaviour logprobs are checked against a fresh full forward pass (no cache, batch 1) of
prompt + output with the same weights: they must agree within 1e-4 in float32.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from services.engines.engine import (
    Engine,
    EngineError,
    GenerateRequest,
    InvalidRequestError,
    Sample,
    Sampling,
    WeightUpdateError,
)
from services.engines.torch import attention as cpu_attention
from services.engines.torch import linear_forms
from services.engines.torch.engine import TorchEngine
from services.engines.torch.sampling import filter_top_k, filter_top_p, sample_tokens

TOLERANCE = 1e-4
VOCAB = 2048
EOS = 2
PROMPT = [(17 * i + 5) % 1000 + 10 for i in range(40)]
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


def build_model(path: Path, *, seed: int, hidden: int = 128) -> Path:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch-engine")
    return {
        "a": build_model(root / "a", seed=0),
        "b": build_model(root / "b", seed=1),
        "narrow": build_model(root / "narrow", seed=0, hidden=64),
    }


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> dict[str, torch.nn.Module]:
    """Plain transformers models for fresh forward passes."""
    loaded: dict[str, torch.nn.Module] = {}
    for name in ("a", "b"):
        model = AutoModelForCausalLM.from_pretrained(models[name], dtype=torch.float32)
        model.train(False)
        loaded[name] = model
    return loaded


@pytest.fixture
async def engine(models: dict[str, Path]) -> AsyncIterator[TorchEngine]:
    eng = TorchEngine(models["a"], device="cpu")
    await eng.start()
    yield eng
    await eng.close()


def fresh_logprobs(model: torch.nn.Module, prompt: Sequence[int], output: list[int]) -> list[float]:
    ids = torch.tensor([[*prompt, *output]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(prompt) - 1
    return [float(logprobs[start + i, tok]) for i, tok in enumerate(output)]


def assert_fresh(model: torch.nn.Module, prompt: Sequence[int], samples: list[Sample]) -> None:
    for sample in samples:
        assert len(sample.logprobs) == len(sample.output_ids) > 0
        expected = fresh_logprobs(model, prompt, sample.output_ids)
        assert sample.logprobs == pytest.approx(expected, abs=TOLERANCE)


async def generate(
    engine: TorchEngine, prompt: Sequence[int], sampling: Sampling = GREEDY, n: int = 1
) -> list[Sample]:
    return await engine.generate(GenerateRequest(prompt_ids=list(prompt), sampling=sampling, n=n))


# ---------------------------------------------------------------------- logprobs


async def test_attends_over_the_kv_heads_on_a_cpu(engine: TorchEngine) -> None:
    assert engine._loaded().config._attn_implementation == cpu_attention.ATTENTION


async def test_is_an_engine(engine: TorchEngine) -> None:
    assert isinstance(engine, Engine)
    assert await engine.healthy()


async def test_logprobs_equal_a_fresh_forward_pass(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    sampling = Sampling(temperature=0.9, top_p=0.9, top_k=200, max_new_tokens=12, seed=3)
    samples = await generate(engine, PROMPT, sampling, n=3)
    assert len(samples) == 3
    assert_fresh(reference["a"], PROMPT, samples)


async def test_logprobs_with_a_cached_prefix_and_rows_finishing_apart(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    # Stopping on a tenth of the vocabulary makes rows leave the batch at different steps.
    stop = tuple(range(100, 300))
    sampling = Sampling(max_new_tokens=16, stop_token_ids=stop, seed=11)
    first = await generate(engine, PROMPT, sampling, n=4)
    assert_fresh(reference["a"], PROMPT, first)
    lengths = {len(s.output_ids) for s in first}
    assert len(lengths) > 1, "rows should finish at different steps"
    for sample in first:
        turn = [*PROMPT, *sample.output_ids, 7, 8, 9]
        [second] = await generate(engine, turn, sampling)
        # All of the previous turn but the last sampled token (its KV was never computed).
        assert second.cached_tokens == len(PROMPT) + len(sample.output_ids) - 1
        assert_fresh(reference["a"], turn, [second])


# ---------------------------------------------------------------------- prefix cache


async def test_repeated_prefix_is_served_from_cache(engine: TorchEngine) -> None:
    [first] = await generate(engine, PROMPT)
    assert first.cached_tokens == 0
    [again] = await generate(engine, [*PROMPT, 1, 2, 3])
    assert again.cached_tokens == len(PROMPT)
    [same] = await generate(engine, PROMPT)
    assert same.cached_tokens == len(PROMPT) - 1  # the last prompt token always runs
    stats = engine.statistics()
    assert stats.requests == 3
    assert stats.prompt_tokens == 3 * len(PROMPT) + 3
    assert stats.cached_tokens == 2 * len(PROMPT) - 1
    assert stats.generated_tokens == 3 * GREEDY.max_new_tokens
    assert engine.cache_statistics().hit_tokens == stats.cached_tokens


async def test_cache_on_and_off_give_the_same_tokens_and_logprobs(
    models: dict[str, Path],
) -> None:
    async def conversation(engine: TorchEngine) -> tuple[list[Sample], int]:
        prompt, samples = list(PROMPT), []
        for turn in range(3):
            [sample] = await generate(engine, prompt)
            samples.append(sample)
            prompt += [*sample.output_ids, 40 + turn, 41 + turn]
        return samples, engine.statistics().cached_tokens

    on, off = TorchEngine(models["a"]), TorchEngine(models["a"], cache_bytes=0)
    await asyncio.gather(on.start(), off.start())
    try:
        with_cache, cached_on = await conversation(on)
        without_cache, cached_off = await conversation(off)
    finally:
        await asyncio.gather(on.close(), off.close())
    assert cached_on > 0 and cached_off == 0
    for a, b in zip(with_cache, without_cache, strict=True):
        assert a.output_ids == b.output_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=TOLERANCE)


async def test_tiny_cache_bound_still_gives_correct_outputs(
    models: dict[str, Path], reference: dict[str, torch.nn.Module]
) -> None:
    engine = TorchEngine(models["a"], cache_bytes=16 * 1024)  # 16 tokens of KV
    await engine.start()
    try:
        for _ in range(2):
            samples = await generate(engine, PROMPT, Sampling(max_new_tokens=6, seed=1), n=2)
            assert_fresh(reference["a"], PROMPT, samples)
        stats = engine.cache_statistics()
        assert stats.nbytes <= stats.max_bytes
        assert stats.evicted_tokens > 0
    finally:
        await engine.close()


# ---------------------------------------------------------------------- batching and sampling


async def test_n_batch_equals_sequential_under_greedy(models: dict[str, Path]) -> None:
    engine = TorchEngine(models["a"], cache_bytes=0)
    await engine.start()
    try:
        batch = await generate(engine, PROMPT, GREEDY, n=4)
        single = await generate(engine, PROMPT, GREEDY, n=1)
    finally:
        await engine.close()
    for sample in batch:
        assert sample.output_ids == single[0].output_ids
        assert sample.logprobs == pytest.approx(single[0].logprobs, abs=TOLERANCE)


async def test_seed_makes_sampling_reproducible(engine: TorchEngine) -> None:
    sampling = Sampling(temperature=1.0, max_new_tokens=12, seed=1234)
    first = await generate(engine, PROMPT, sampling, n=3)
    second = await generate(engine, PROMPT, sampling, n=3)
    other = await generate(engine, PROMPT, Sampling(max_new_tokens=12, seed=99), n=3)
    assert [s.output_ids for s in first] == [s.output_ids for s in second]
    assert [s.output_ids for s in first] != [s.output_ids for s in other]
    assert len({tuple(s.output_ids) for s in first}) > 1, "rows of a group should differ"


async def test_stop_token_ends_the_sample_and_is_included(engine: TorchEngine) -> None:
    [free] = await generate(engine, PROMPT, Sampling(temperature=0.0, max_new_tokens=8))
    assert free.finish == "length" and len(free.output_ids) == 8
    stop_at = free.output_ids[3]
    first = free.output_ids.index(stop_at)
    sampling = Sampling(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop_at,))
    [stopped] = await generate(engine, PROMPT, sampling)
    assert stopped.finish == "stop"
    assert stopped.output_ids == free.output_ids[: first + 1]
    assert len(stopped.logprobs) == first + 1


async def test_eos_from_generation_config_stops(models: dict[str, Path], tmp_path: Path) -> None:
    engine = TorchEngine(models["a"])
    await engine.start()
    [free] = await generate(engine, PROMPT)
    await engine.close()
    model_dir = Path(shutil.copytree(models["a"], tmp_path / "eos"))
    config_file = model_dir / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [free.output_ids[0]]
    config_file.write_text(json.dumps(config))
    engine = TorchEngine(model_dir)
    await engine.start()
    try:
        [stopped] = await generate(engine, PROMPT)
    finally:
        await engine.close()
    assert (stopped.output_ids, stopped.finish) == (free.output_ids[:1], "stop")


async def test_output_is_capped_by_the_context(engine: TorchEngine) -> None:
    prompt = PROMPT * 6  # 240 of 256 positions
    [sample] = await generate(engine, prompt, Sampling(temperature=0.0, max_new_tokens=64))
    assert len(sample.output_ids) == engine.max_context - len(prompt)
    assert sample.finish == "length"


def test_sampling_filters() -> None:
    scores = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert torch.isinf(filter_top_k(scores, 2)).tolist() == [[True, False, False, True]]
    assert torch.equal(filter_top_k(scores, -1), scores)
    probs = torch.tensor([[0.1, 0.6, 0.25, 0.05]])
    kept = ~torch.isinf(filter_top_p(probs.log(), 0.8))
    assert kept.tolist() == [[False, True, True, False]]
    only_best = ~torch.isinf(filter_top_p(probs.log(), 0.01))
    assert only_best.tolist() == [[False, True, False, False]]


def test_logprob_ignores_temperature_and_filters() -> None:
    logits = torch.tensor([[0.5, 2.0, 1.0, -1.0]])
    sampling = Sampling(temperature=0.3, top_k=1, seed=0)
    tokens, logprobs = sample_tokens(logits, sampling, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1]
    assert float(logprobs[0]) == pytest.approx(float(torch.log_softmax(logits, -1)[0, 1]))


# ---------------------------------------------------------------------- weights


async def test_load_weights_changes_outputs_and_flushes_the_cache(
    engine: TorchEngine, models: dict[str, Path], reference: dict[str, torch.nn.Module]
) -> None:
    [before] = await generate(engine, PROMPT)
    assert (await generate(engine, PROMPT))[0].cached_tokens > 0
    await engine.load_weights(5, str(models["b"]))
    [after] = await generate(engine, PROMPT)
    assert after.cached_tokens == 0
    assert after.version == 5 and before.version == 0
    # Random tied-embedding models both greedily echo the last prompt token: the
    # logprobs are what tells the weights apart.
    change = max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs, strict=True))
    assert change > 100 * TOLERANCE
    assert_fresh(reference["b"], PROMPT, [after])
    stats = engine.statistics()
    assert (stats.version, stats.weight_updates) == (5, 1)
    await engine.load_weights(6, f"file://{models['a']}")
    [back] = await generate(engine, PROMPT)
    assert back.output_ids == before.output_ids
    assert back.logprobs == pytest.approx(before.logprobs, abs=TOLERANCE)


async def test_bad_weights_keep_the_old_ones(
    engine: TorchEngine, models: dict[str, Path], tmp_path: Path
) -> None:
    [before] = await generate(engine, PROMPT)
    with pytest.raises(WeightUpdateError, match="wrong shapes"):
        await engine.load_weights(1, str(models["narrow"]))
    with pytest.raises(WeightUpdateError, match="does not exist"):
        await engine.load_weights(1, str(tmp_path / "nowhere"))
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(WeightUpdateError):
        await engine.load_weights(1, str(tmp_path))
    [after] = await generate(engine, PROMPT)
    assert after.output_ids == before.output_ids
    assert after.cached_tokens > 0  # cache kept: the weights did not change
    assert engine.statistics().version == 0 and engine.statistics().weight_updates == 0


async def test_update_waits_for_the_request_in_flight(
    engine: TorchEngine, models: dict[str, Path]
) -> None:
    running = asyncio.create_task(generate(engine, PROMPT, Sampling(max_new_tokens=32, seed=0)))
    await asyncio.sleep(0)  # the request takes the engine first
    await engine.load_weights(9, str(models["b"]))
    [old] = await running
    [new] = await generate(engine, PROMPT)
    assert (old.version, new.version) == (0, 9)
    assert len(old.output_ids) == 32


async def test_cancelled_update_keeps_the_old_weights(
    engine: TorchEngine, models: dict[str, Path]
) -> None:
    running = asyncio.create_task(generate(engine, PROMPT, Sampling(max_new_tokens=32, seed=0)))
    await asyncio.sleep(0)
    update = asyncio.create_task(engine.load_weights(3, str(models["b"])))
    await asyncio.sleep(0)  # waiting behind the request
    update.cancel()
    with pytest.raises(asyncio.CancelledError):
        await update
    await running
    # A cancel that reaches the worker after the checks but before the swap.
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(WeightUpdateError, match="cancelled"):
        engine._load_weights(3, str(models["b"]), cancelled)
    [sample] = await generate(engine, PROMPT)
    assert sample.version == 0 and sample.cached_tokens > 0
    assert engine.statistics().weight_updates == 0


# ---------------------------------------------------------------------- batching requests

#: Prompts of different lengths, so rows are left-padded to each other in the batch.
PROMPTS = [PROMPT[:9], PROMPT, [*PROMPT[:23], 11, 12]]


async def test_concurrent_requests_decode_together_with_fresh_logprobs(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    stop = tuple(range(100, 300))  # rows leave the batch at different steps
    samplings = [Sampling(max_new_tokens=14, seed=s, stop_token_ids=stop) for s in (1, 2, 3)]
    results = await asyncio.gather(
        *(generate(engine, p, s, n=2) for p, s in zip(PROMPTS, samplings, strict=True))
    )
    for prompt, samples in zip(PROMPTS, results, strict=True):
        assert len(samples) == 2
        assert_fresh(reference["a"], prompt, samples)
    assert engine.batch_statistics()["peak_rows"] > 2  # more than one request's rows at once


async def test_linears_switched_at_every_row_count_keep_logprobs_fresh(
    models: dict[str, Path], reference: dict[str, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    def every_row_count(
        weight: torch.Tensor, max_rows: int = linear_forms.MAX_ROWS
    ) -> dict[int, int]:
        return {rows: rows + rows % 2 for rows in range(1, max_rows + 1)}  # odd ones padded

    monkeypatch.setattr(linear_forms, "faster_widths", every_row_count)
    monkeypatch.setattr(linear_forms, "MIN_BYTES", 0)  # the test model is small
    engine = TorchEngine(models["a"], device="cpu")
    await engine.start()
    try:
        expected = every_row_count(torch.zeros(1))
        assert engine.linear_plan and all(w == expected for w in engine.linear_plan.values())
        stop = tuple(range(100, 300))  # rows leave the batch at different steps
        samplings = [Sampling(max_new_tokens=14, seed=s, stop_token_ids=stop) for s in (1, 2, 3)]
        results = await asyncio.gather(
            *(generate(engine, p, s, n=2) for p, s in zip(PROMPTS, samplings, strict=True))
        )
        for prompt, samples in zip(PROMPTS, results, strict=True):
            assert_fresh(reference["a"], prompt, samples)
    finally:
        await engine.close()


async def test_linears_are_left_alone_when_tuning_is_off(models: dict[str, Path]) -> None:
    engine = TorchEngine(models["a"], device="cpu", tune_linears=False)
    await engine.start()
    try:
        assert engine.linear_plan == {}
        layers = [m for m in engine._loaded().modules() if isinstance(m, torch.nn.Linear)]
        assert layers and not any("forward" in vars(layer) for layer in layers)
    finally:
        await engine.close()


async def test_a_request_joins_a_batch_already_decoding(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    long = asyncio.create_task(generate(engine, PROMPT[:9], Sampling(max_new_tokens=60, seed=0)))
    while engine.batch_statistics()["decode_steps"] < 5:
        await asyncio.sleep(0.001)
    [late] = await generate(engine, PROMPT, Sampling(max_new_tokens=6, seed=4))
    [first] = await long
    assert_fresh(reference["a"], PROMPT, [late])
    assert_fresh(reference["a"], PROMPT[:9], [first])
    assert engine.batch_statistics()["decode_rows"] > engine.batch_statistics()["decode_steps"]


async def test_batched_greedy_outputs_equal_one_at_a_time(models: dict[str, Path]) -> None:
    together, alone = (TorchEngine(models["a"], device="cpu") for _ in range(2))
    await asyncio.gather(together.start(), alone.start())
    try:
        batched = await asyncio.gather(*(generate(together, p) for p in PROMPTS))
        serial = [await generate(alone, p) for p in PROMPTS]
    finally:
        await asyncio.gather(together.close(), alone.close())
    for [b], [s] in zip(batched, serial, strict=True):
        assert b.output_ids == s.output_ids
        assert b.logprobs == pytest.approx(s.logprobs, abs=TOLERANCE)


async def test_seeded_samples_do_not_depend_on_the_rest_of_the_batch(
    engine: TorchEngine,
) -> None:
    sampling = Sampling(temperature=1.0, max_new_tokens=10, seed=42)
    [alone] = await generate(engine, PROMPT, sampling)
    crowd = [
        generate(engine, p, Sampling(max_new_tokens=10, seed=i)) for i, p in enumerate(PROMPTS)
    ]
    [[among], *_] = await asyncio.gather(generate(engine, PROMPT, sampling), *crowd)
    assert among.output_ids == alone.output_ids


async def test_outputs_of_a_padded_batch_are_cached_for_the_next_turn(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    first = await asyncio.gather(*(generate(engine, p, GREEDY) for p in PROMPTS))
    turns = [[*p, *s.output_ids, 7, 8, 9] for p, [s] in zip(PROMPTS, first, strict=True)]
    second = await asyncio.gather(*(generate(engine, t, GREEDY) for t in turns))
    for turn, [again] in zip(turns, second, strict=True):
        # All but the last output token (never fed) and the tool's three.
        assert again.cached_tokens == len(turn) - 4
        assert_fresh(reference["a"], turn, [again])


async def test_prompts_admitted_together_share_a_prefill_on_their_own_prefixes(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    """Cached prefixes of different lengths and new tokens of different counts: the rows
    are padded inside one pass, then decode on from the settled KV."""
    first = [await generate(engine, p, GREEDY) for p in (PROMPT[:30], PROMPT[:12])]
    tools = ([7, 8, 9, 10, 11, 12], [7, 8, 9, 10])
    turns = [
        [*p, *s.output_ids, *t]
        for p, [s], t in zip((PROMPT[:30], PROMPT[:12]), first, tools, strict=True)
    ]
    passes = engine.batch_statistics()["prefill_passes"]
    stop = tuple(range(100, 300))  # rows leave the batch at different steps
    samplings = [Sampling(max_new_tokens=12, seed=s, stop_token_ids=stop) for s in (5, 6)]
    second = await asyncio.gather(
        *(generate(engine, t, s, n=2) for t, s in zip(turns, samplings, strict=True))
    )
    assert engine.batch_statistics()["prefill_passes"] == passes + 1
    for turn, tool, samples in zip(turns, tools, second, strict=True):
        # All but the last output token (never fed) and the tool's tokens.
        assert all(s.cached_tokens == len(turn) - len(tool) - 1 for s in samples)
        assert_fresh(reference["a"], turn, samples)
    # The settled KV was stored: the next turns hit all of it.
    again = await asyncio.gather(*(generate(engine, [*t, 5], GREEDY) for t in turns))
    assert [s.cached_tokens for [s] in again] == [len(t) for t in turns]


async def test_a_shared_uncached_prefix_is_prefilled_once(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    """Three tasks behind one system prompt, admitted together: one pass prefills it, the
    two others take it from the cache in the next."""
    system = [(13 * i + 7) % 1000 + 10 for i in range(40)]
    prompts = [[*system, 900 + t, 901 + t, 902 + t] for t in range(3)]
    passes = engine.batch_statistics()["prefill_passes"]
    results = await asyncio.gather(*(generate(engine, p) for p in prompts))
    assert engine.batch_statistics()["prefill_passes"] == passes + 2
    assert sorted(s.cached_tokens for [s] in results) == [0, len(system), len(system)]
    for prompt, samples in zip(prompts, results, strict=True):
        assert_fresh(reference["a"], prompt, samples)


async def test_cancelling_one_request_leaves_the_others_in_the_batch(
    engine: TorchEngine, reference: dict[str, torch.nn.Module]
) -> None:
    doomed = asyncio.create_task(generate(engine, PROMPT, Sampling(max_new_tokens=200, seed=0)))
    kept = asyncio.create_task(generate(engine, PROMPT[:9], Sampling(max_new_tokens=40, seed=1)))
    while engine.batch_statistics()["decode_steps"] < 3:
        await asyncio.sleep(0.001)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    [sample] = await kept
    assert len(sample.output_ids) == 40
    assert_fresh(reference["a"], PROMPT[:9], [sample])


async def test_a_failing_step_fails_its_batch_and_the_engine_goes_on(
    engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    logits = engine._logits
    calls = 0

    def breaks_on_the_third_pass(**inputs: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("simulated kernel failure")
        return logits(**inputs)

    monkeypatch.setattr(engine, "_logits", breaks_on_the_third_pass)
    running = [generate(engine, p, Sampling(max_new_tokens=20, seed=0)) for p in PROMPTS]
    results = await asyncio.gather(*running, return_exceptions=True)
    assert results and all(isinstance(r, EngineError) for r in results), results
    assert "simulated kernel failure" in str(results[0])
    [sample] = await generate(engine, PROMPT)
    assert len(sample.output_ids) == GREEDY.max_new_tokens


async def test_close_fails_the_requests_in_the_batch(models: dict[str, Path]) -> None:
    engine = TorchEngine(models["a"], device="cpu")
    await engine.start()
    running = [
        asyncio.create_task(generate(engine, p, Sampling(max_new_tokens=200, seed=0)))
        for p in PROMPTS
    ]
    while engine.batch_statistics()["decode_steps"] < 2:
        await asyncio.sleep(0.001)
    await engine.close()
    for task in running:
        with pytest.raises(EngineError, match="closed during the request"):
            await task


# ---------------------------------------------------------------------- service behaviour


async def test_event_loop_stays_responsive(engine: TorchEngine) -> None:
    task = asyncio.create_task(generate(engine, PROMPT, Sampling(max_new_tokens=48, seed=0)))
    ticks = 0
    while not task.done():
        await asyncio.sleep(0)
        ticks += 1
    await task
    assert ticks > 1


async def test_cancelled_request_leaves_the_engine_usable(engine: TorchEngine) -> None:
    task = asyncio.create_task(generate(engine, PROMPT, Sampling(max_new_tokens=200, seed=0)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [sample] = await generate(engine, PROMPT)
    assert len(sample.output_ids) == GREEDY.max_new_tokens


@pytest.mark.parametrize(
    ("prompt", "n", "message"),
    [
        ([], 1, "empty"),
        (PROMPT * 7, 1, "no room"),
        ([1, VOCAB], 1, "vocabulary"),
        ([-1, 3], 1, "vocabulary"),
        (PROMPT, 0, "n must be"),
    ],
)
async def test_invalid_requests_are_rejected(
    engine: TorchEngine, prompt: list[int], n: int, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        await generate(engine, prompt, n=n)


async def test_closed_engine_refuses_work(models: dict[str, Path]) -> None:
    engine = TorchEngine(models["a"])
    with pytest.raises(EngineError, match="not started"):
        await generate(engine, PROMPT)
    await engine.start()
    await engine.close()
    assert not await engine.healthy()
    with pytest.raises(EngineError, match="closed"):
        await generate(engine, PROMPT)


async def test_serves_the_model_of_temper_model_init(tiny_model: Path) -> None:
    engine = TorchEngine(tiny_model)
    await engine.start()
    try:
        samples = await generate(engine, [5, 6, 7, 8], Sampling(max_new_tokens=6, seed=0), n=2)
    finally:
        await engine.close()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert_fresh(reference, [5, 6, 7, 8], samples)
