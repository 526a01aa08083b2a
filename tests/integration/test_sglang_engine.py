"""SGLangEngine against a real CPU SGLang 0.5.23 server (fixtures in tests/sglang_fixtures.py).

The session shares one server; tests that change its weights put the original back, and
none depends on another's order.  No assertion is about speed.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engines.engine import (
    Engine,
    EngineError,
    GenerateRequest,
    Sampling,
    WeightUpdateError,
)
from services.engines.sglang.broadcast import GlooWeightSender
from services.engines.sglang.engine import (
    SGLangEngine,
    SGLangEngineSettings,
    SGLangSample,
)
from services.engines.sglang.server import SGLangServer
from services.runtime.ports import free_port

# The first test may build the venv (minutes) and start the server (about 30 s).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

#: float32 server vs float32 transformers on the same tokens (measured: about 1e-6).
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture
async def engine(sglang_server: SGLangServer) -> AsyncIterator[SGLangEngine]:
    async with SGLangEngine([sglang_server.url]) as started:
        yield started


@pytest.fixture(scope="session")
def perturbed_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with every weight scaled and shifted: different outputs, same shapes."""
    target = tmp_path_factory.mktemp("perturbed") / "policy"
    shutil.copytree(tiny_model, target)
    for path in target.glob("*.safetensors"):
        tensors = perturbed_tensors(load_file(path))
        save_file(tensors, path, metadata={"format": "pt"})
    return target


def perturbed_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return {
        name: (t * 1.5 + 0.02 * torch.randn(t.shape, generator=generator, dtype=t.dtype))
        .to(t.dtype)
        .contiguous()
        for name, t in tensors.items()
    }


def model_tensors(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, sorted by name (the broadcast order)."""
    return sorted(
        (name, tensor)
        for path in model_dir.glob("*.safetensors")
        for name, tensor in load_file(path).items()
    )


@functools.lru_cache(maxsize=4)
def _reference_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32
    )
    return model.train(False)


def reference_logprobs(
    model_dir: Path, prompt: Sequence[int], output: Sequence[int]
) -> list[float]:
    """Raw log-softmax of each output token under a fresh float32 transformers forward pass."""
    ids = torch.tensor([[*prompt, *output]])
    with torch.no_grad():
        logits = _reference_model(model_dir)(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [float(logprobs[start + i, token]) for i, token in enumerate(output)]


def prompt_ids(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (length,), generator=generator).tolist()


async def greedy(engine: SGLangEngine, prompt: Sequence[int], tokens: int = 8) -> SGLangSample:
    sampling = Sampling(temperature=0.0, max_new_tokens=tokens)
    [sample] = await engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
    assert isinstance(sample, SGLangSample)
    return sample


def assert_close(actual: Sequence[float], expected: Sequence[float]) -> None:
    assert len(actual) == len(expected)
    worst = max(abs(a - e) for a, e in zip(actual, expected, strict=True))
    assert worst <= LOGPROB_TOLERANCE, f"max |delta logprob| {worst:.2e}: {actual} vs {expected}"


# ---------------------------------------------------------------- generation


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


async def test_an_idle_server_leaves_the_cpu_alone(
    engine: SGLangEngine, sglang_server: SGLangServer
) -> None:
    await engine.generate(
        GenerateRequest(prompt_ids=[5, 6, 7], sampling=Sampling(max_new_tokens=2))
    )
    assert sglang_server.pid is not None
    await asyncio.sleep(1.5)  # past the scheduler's last poll of that request
    before = group_cpu_s(sglang_server.pid)
    await asyncio.sleep(3.0)
    # A scheduler that polls in a loop burns about the whole window (3 s) on one core.
    assert group_cpu_s(sglang_server.pid) - before < 1.0


async def test_engine_satisfies_the_protocol(engine: SGLangEngine) -> None:
    assert isinstance(engine, Engine)
    assert await engine.healthy()


async def test_sampled_logprobs_equal_a_fresh_float32_forward(
    engine: SGLangEngine, tiny_model: Path
) -> None:
    """Sampling at T=0.7 still returns the raw model log-softmax (not the scaled one)."""
    prompt = prompt_ids(40, seed=1)
    sampling = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=7)
    samples = await engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling, n=3))
    assert len(samples) == 3
    assert len({tuple(s.output_ids) for s in samples}) > 1, "n samples must differ"
    for sample in samples:
        assert len(sample.logprobs) == len(sample.output_ids) > 0
        assert sample.finish in ("stop", "length")
        assert_close(sample.logprobs, reference_logprobs(tiny_model, prompt, sample.output_ids))


async def test_stop_token_ends_the_sample_and_is_returned(engine: SGLangEngine) -> None:
    prompt = prompt_ids(30, seed=2)
    full = await greedy(engine, prompt, tokens=12)
    ids = full.output_ids
    # The first token that did not occur before it (greedy output may repeat one token).
    cut = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i]), 0)
    sampling = Sampling(temperature=0.0, max_new_tokens=12, stop_token_ids=(ids[cut],))
    [stopped] = await engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
    assert stopped.finish == "stop"
    assert stopped.output_ids == ids[: cut + 1]
    assert stopped.logprobs == pytest.approx(full.logprobs[: cut + 1], abs=1e-4)


async def test_cached_tokens_on_a_repeated_prefix_and_none_after_an_update(
    engine: SGLangEngine, tiny_model: Path
) -> None:
    prompt = prompt_ids(200, seed=3)
    await greedy(engine, prompt)
    again = await greedy(engine, prompt)
    assert again.cached_tokens >= len(prompt) - 8, again.cached_tokens
    version = engine.statistics().version + 1
    await engine.load_weights(version, str(tiny_model))
    after_update = await greedy(engine, prompt)
    assert after_update.cached_tokens == 0
    assert after_update.version == version
    await greedy(engine, prompt)
    await engine.flush_cache()
    assert (await greedy(engine, prompt)).cached_tokens == 0
    stats = engine.statistics()
    assert stats.cached_tokens >= again.cached_tokens
    assert 0 < stats.cache_hit_ratio < 1


# ---------------------------------------------------------------- weight updates


async def test_update_from_disk_serves_the_new_weights(
    engine: SGLangEngine, tiny_model: Path, perturbed_model: Path
) -> None:
    prompt = prompt_ids(24, seed=4)
    before = await greedy(engine, prompt)
    version = engine.statistics().version + 1
    try:
        await engine.load_weights(version, f"file://{perturbed_model}")
        after = await greedy(engine, prompt)
        assert after.version == version
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
        assert_close(after.logprobs, reference_logprobs(perturbed_model, prompt, after.output_ids))
    finally:
        await engine.load_weights(version + 1, str(tiny_model))
    restored = await greedy(engine, prompt)
    assert restored.output_ids == before.output_ids
    assert_close(restored.logprobs, before.logprobs)


async def test_update_by_gloo_broadcast_from_the_learner(
    engine: SGLangEngine, tiny_model: Path, perturbed_model: Path
) -> None:
    """The test process is the learner (rank 0); the server receives every tensor."""
    prompt = prompt_ids(24, seed=5)
    before = await greedy(engine, prompt)
    group = f"test-{uuid.uuid4().hex[:8]}"
    sender = GlooWeightSender(
        master_address="127.0.0.1", master_port=free_port(), world_size=2, group_name=group,
        timeout_s=120,
    )  # fmt: skip
    await asyncio.gather(
        asyncio.to_thread(sender.connect),
        engine.init_weights_update_group(
            master_address=sender.master_address,
            master_port=sender.master_port,
            world_size=2,
            group_name=group,
        ),
    )
    tensors = model_tensors(perturbed_model)
    version = engine.statistics().version + 1
    try:
        await asyncio.gather(
            engine.load_weights_from_distributed(version, sender.specs(tensors), group_name=group),
            asyncio.to_thread(sender.broadcast, tensors),
        )
        after = await greedy(engine, prompt)
        assert after.version == version
        assert after.cached_tokens == 0
        assert_close(after.logprobs, reference_logprobs(perturbed_model, prompt, after.output_ids))
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    finally:
        sender.close()
        await engine.load_weights(version + 1, str(tiny_model))
    assert_close((await greedy(engine, prompt)).logprobs, before.logprobs)


async def test_generation_paused_around_an_update_finishes_afterwards(
    engine: SGLangEngine, sglang_server: SGLangServer, tiny_model: Path
) -> None:
    url = sglang_server.url
    await engine.pause(url)
    try:
        pending = asyncio.create_task(greedy(engine, prompt_ids(16, seed=6), tokens=24))
        done, _ = await asyncio.wait({pending}, timeout=2.0)
        assert not done, "a paused server must not finish a generation"
        version = engine.statistics().version + 1
        # The update's own pause/continue wraps the load; the server then continues.
        await engine.load_weights(version, str(tiny_model))
        sample = await asyncio.wait_for(pending, timeout=120)
    finally:
        await engine.resume(url)
    assert sample.finish == "length"
    assert len(sample.output_ids) == len(sample.logprobs) == 24
    assert {span.version for span in sample.version_spans} <= {version - 1, version}
    assert sample.version_spans[0].start == 0
    assert sample.version_spans[-1].end == 24


async def test_long_generation_across_an_update_keeps_every_token(
    engine: SGLangEngine, tiny_model: Path
) -> None:
    """An update while a request decodes: the request is retracted, resumed, and completes."""
    before = engine.statistics().version
    sampling = Sampling(temperature=1.0, max_new_tokens=160, seed=3)
    request = GenerateRequest(prompt_ids=prompt_ids(16, seed=7), sampling=sampling)
    running = asyncio.create_task(engine.generate(request))
    await asyncio.sleep(0.3)
    await engine.load_weights(before + 1, str(tiny_model))
    [sample] = await asyncio.wait_for(running, timeout=300)
    assert isinstance(sample, SGLangSample)
    assert len(sample.output_ids) == len(sample.logprobs)
    assert sample.finish in ("stop", "length")
    spans = sample.version_spans
    assert spans[0].start == 0 and spans[-1].end == len(sample.output_ids)
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    assert sample.version == min(span.version for span in spans)


async def test_failed_update_raises_and_the_server_keeps_serving(
    engine: SGLangEngine, tiny_model: Path, tmp_path: Path
) -> None:
    prompt = prompt_ids(20, seed=8)
    before = await greedy(engine, prompt)
    version = engine.statistics().version
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(WeightUpdateError) as raised:
        await engine.load_weights(version + 1, str(missing))
    assert raised.value.version == version + 1
    assert "no-such-checkpoint" in str(raised.value) or "Failed" in str(raised.value)
    with pytest.raises(WeightUpdateError, match="absolute path"):
        await engine.load_weights(version + 1, "org/some-hub-model")
    assert engine.statistics().version == version
    after = await greedy(engine, prompt)  # not left paused, same weights
    assert after.output_ids == before.output_ids
    assert after.version == version


# ---------------------------------------------------------------- errors and routing


async def test_dead_server_raises_engine_error() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    engine = SGLangEngine([dead], SGLangEngineSettings(control_timeout_s=5))
    with pytest.raises(EngineError, match="no answer"):
        await engine.start()
    try:
        with pytest.raises(EngineError, match=dead.replace(".", r"\.")):
            await engine.generate(GenerateRequest(prompt_ids=[1, 2, 3]))
        assert not await engine.healthy()
    finally:
        await engine.close()


async def test_engine_refuses_a_server_with_temperature_scaled_logprobs(
    sglang_second_server: SGLangServer,
) -> None:
    engine = SGLangEngine([sglang_second_server.url])
    try:
        with pytest.raises(EngineError, match="SGLANG_RETURN_ORIGINAL_LOGPROB=1"):
            await engine.start()
    finally:
        await engine.close()


async def test_turns_of_a_trajectory_stick_to_one_server(
    sglang_server: SGLangServer, sglang_second_server: SGLangServer
) -> None:
    settings = SGLangEngineSettings(check_raw_logprobs=False)
    urls = [sglang_server.url, sglang_second_server.url]
    async with SGLangEngine(urls, settings) as engine:
        await engine.flush_cache()
        conversations = {f"traj-{i}": prompt_ids(120, seed=100 + i) for i in range(4)}
        served: dict[str, set[str]] = {tid: set() for tid in conversations}
        for turn in range(3):
            for index, (tid, conversation) in enumerate(conversations.items()):
                sampling = Sampling(temperature=1.0, max_new_tokens=6, seed=turn)
                request = GenerateRequest(
                    prompt_ids=conversation, sampling=sampling, trajectory_id=tid
                )
                [sample] = await engine.generate(request)
                assert isinstance(sample, SGLangSample)
                served[tid].add(sample.server)
                if turn > 0:
                    # The whole previous conversation is this server's cached prefix.
                    assert sample.cached_tokens >= len(conversation) - 20, (tid, turn)
                tool_output = prompt_ids(10, seed=1000 * turn + index)
                conversations[tid] = [*conversation, *sample.output_ids, *tool_output]
        assert all(len(servers) == 1 for servers in served.values()), served
        assert {next(iter(s)) for s in served.values()} == set(urls), "both servers used"
        assert sorted(engine.requests_per_server().values()) == [6, 6]


async def test_a_failed_sticky_server_hands_its_trajectories_over(
    sglang_server: SGLangServer,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = SGLangEngineSettings(control_timeout_s=5, request_timeout_s=30)
    async with SGLangEngine([dead, sglang_server.url], settings) as engine:
        # Started with one server down: new trajectories avoid it.
        assert engine.router.choose("new") == sglang_server.url
        # Pretend the dead one was up when "traj" was pinned to it.
        engine.router.mark(dead, healthy=True)
        assert engine.router.choose("traj") == dead
        sampling = Sampling(max_new_tokens=4)
        request = GenerateRequest(prompt_ids=[5, 6, 7], sampling=sampling, trajectory_id="traj")
        with pytest.raises(EngineError, match="no answer"):
            await engine.generate(request)
        [sample] = await engine.generate(request)
        assert isinstance(sample, SGLangSample)
        assert sample.server == sglang_server.url
        assert engine.router.pinned("traj") == sglang_server.url
