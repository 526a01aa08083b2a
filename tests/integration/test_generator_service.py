"""The generator service on the torch engine over a real nats-server: tasks in, rollouts
out, weights swapped by PolicyUpdate, tiers served in priority order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from protocol import streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import (
    ChatMessage,
    PolicyUpdate,
    Rollout,
    RolloutStatus,
    SamplingParams,
    Task,
    WeightSyncAck,
)
from protocol.packed import pack_i32
from services.generator.service import GeneratorService
from services.generator.settings import GeneratorSettings
from services.model.tiny import TinyModelSpec, init_model
from services.model.weights import directory_digest
from tests.integration.support import Tap, client, runtime, stream_count

ROLLOUTS: Codec[Rollout] = Codec(Rollout)


def _settings(url: str, model: Path, **overrides: object) -> GeneratorSettings:
    values: dict[str, object] = {
        "runtime": runtime(url, instance="gen-test"),
        "model": model,
        "tools": "local",
        "check_domains": False,
        "fetch_wait_s": 0.2,
        "max_concurrent_tasks": 2,
        "prefix_cache_mb": 16,
    }
    values.update(overrides)
    return GeneratorSettings(**values)  # type: ignore[arg-type]


def _task(task_id: str, *, tier: int = 1, n: int = 2, domain: str = "arith") -> Task:
    return Task(
        id=task_id,
        domain=domain,
        tier=tier,
        prompt=[ChatMessage(role="user", content=f"What is 2 + {len(task_id)}?")],
        sampling=SamplingParams(max_tokens=6, seed=5),
        n=n,
    )


async def _submit(js: object, task: Task) -> None:
    await js.publish(  # type: ignore[attr-defined]
        subjects.of_task(task),
        encode(task),
        headers={"Nats-Msg-Id": task.id},
    )


class RolloutTap(Tap[Rollout]):
    """Every rollout published while the tap is open, in arrival order."""

    def __init__(self) -> None:
        super().__init__(ROLLOUTS)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    async with client(nats_url) as conn:
        yield conn


@pytest.fixture
async def tap(nc: NATS) -> RolloutTap:
    tap = RolloutTap()
    await nc.subscribe(subjects.rollouts(), cb=tap.on_msg)
    await nc.flush()
    return tap


async def test_task_becomes_n_rollouts_and_is_acked(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    async with GeneratorService(_settings(nats_url, tiny_model)) as service:
        await _submit(nc.jetstream(), _task("t-one", n=3))
        rollouts = await tap.wait(3)
        stats = service.statistics()
    # The group's rows decode as one batch (the torch engine reports its batching).
    assert stats["decode_peak_rows"] >= 2 and stats["decode_rows_per_step"] >= 1
    assert sorted(r.id for r in rollouts) == ["t-one/0", "t-one/1", "t-one/2"]
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.OK
        assert rollout.engine == "torch" and rollout.generator == "gen-test"
        completion = len(rollout.token_ids) - rollout.prompt_len
        assert 1 <= completion <= 6
        assert len(rollout.behaviour_logprobs) == completion
        assert (rollout.behaviour_logprobs < 0).all()
        assert rollout.segments[0].version == 0
    assert await stream_count(nc.jetstream(), streams.task_stream_name(1)) == 0


async def test_prompt_too_long_gives_invalid_rollouts(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    task = Task(id="long", domain="arith", prompt_tokens=pack_i32([5] * 300), n=2)
    async with GeneratorService(_settings(nats_url, tiny_model, max_total_tokens=128)):
        await _submit(nc.jetstream(), task)
        rollouts = await tap.wait(2)
    assert {r.status for r in rollouts} == {RolloutStatus.INVALID}
    assert "300 tokens" in (rollouts[0].error or "")


async def test_policy_update_swaps_weights_between_requests(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, tmp_path: Path
) -> None:
    new = init_model(tmp_path / "v1", TinyModelSpec(seed=1))
    acks: list[WeightSyncAck] = []

    async def on_ack(msg: Msg) -> None:
        acks.append(Codec(WeightSyncAck).decode(msg.data))

    await nc.subscribe(subjects.weight_ack("generator"), cb=on_ack)
    js = nc.jetstream()
    async with GeneratorService(_settings(nats_url, tiny_model)) as service:
        await _submit(js, _task("before", n=1))
        [before] = await tap.wait(1)
        bad = PolicyUpdate(version=1, uri=str(new), digest="sha256:" + "0" * 64)
        await js.publish(subjects.policy_update(), encode(bad))
        await _until(lambda: len(acks) == 1)
        assert not acks[0].ok and "digest" in (acks[0].error or "")
        assert service.version == 0
        good = PolicyUpdate(version=2, uri=str(new), digest=directory_digest(new))
        await js.publish(subjects.policy_update(), encode(good))
        await _until(lambda: len(acks) == 2)
        assert acks[1].ok and service.version == 2
        await _submit(js, _task("after", n=1))
        rollouts = await tap.wait(2)
    after = rollouts[1]
    assert after.segments[0].version == 2
    # Same prompt shape and seed, different weights: the behaviour logprobs differ.
    assert before.logprobs != after.logprobs


async def test_late_generator_starts_on_the_newest_policy(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, tmp_path: Path
) -> None:
    new = init_model(tmp_path / "v7", TinyModelSpec(seed=2))
    js = nc.jetstream()
    for spec in (streams.POLICY,):
        await js.add_stream(name=spec.name, subjects=list(spec.subjects))
    update = PolicyUpdate(version=7, uri=str(new), digest=directory_digest(new))
    await js.publish(subjects.policy_update(), encode(update))
    async with GeneratorService(_settings(nats_url, tiny_model)) as service:
        assert service.version == 7
        await _submit(js, _task("late", n=1))
        [rollout] = await tap.wait(1)
    assert rollout.segments[0].version == 7


async def test_higher_tier_is_served_first(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    js = nc.jetstream()
    for spec in streams.TASK_STREAMS:
        await js.add_stream(name=spec.name, subjects=list(spec.subjects), retention="workqueue")
    low = [_task(f"low{i}", tier=3, n=1) for i in range(3)]
    high = [_task(f"high{i}", tier=0, n=1) for i in range(3)]
    for task in low + high:
        await _submit(js, task)
    async with GeneratorService(_settings(nats_url, tiny_model, max_concurrent_tasks=1)):
        rollouts = await tap.wait(6)
    order = [r.task.tier for r in rollouts]
    assert order == [0, 0, 0, 3, 3, 3]


async def _until(predicate: object, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.05)


def test_engine_dtype_comes_from_the_settings(tiny_model: Path) -> None:
    import torch

    from services.generator.making import make_engine

    chosen = make_engine(GeneratorSettings(model=tiny_model, dtype="bfloat16"))
    assert getattr(chosen, "dtype", None) == torch.bfloat16
    default = make_engine(GeneratorSettings(model=tiny_model, device="cpu"))
    assert getattr(default, "dtype", None) == torch.float32
    with pytest.raises(ValueError, match=r"float64.*float32, bfloat16, float16"):
        GeneratorSettings(dtype="float64")


async def test_a_bfloat16_generator_serves_tasks(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    async with GeneratorService(_settings(nats_url, tiny_model, dtype="bfloat16")):
        await _submit(nc.jetstream(), _task("t-bf16", n=2))
        rollouts = await tap.wait(2)
    assert {r.status for r in rollouts} == {RolloutStatus.OK}
    assert all((r.behaviour_logprobs < 0).all() for r in rollouts)


async def test_admission_holds_tasks_until_the_learner_consumes(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    js = nc.jetstream()
    settings = _settings(nats_url, tiny_model, admission_samples=4, max_concurrent_tasks=4)
    async with GeneratorService(settings) as service:
        for index in range(3):
            await _submit(js, _task(f"adm{index}", n=2))
        # A held-out task is never held back, whatever the budget says.
        heldout = _task("adm-eval", tier=0, n=2)
        heldout = Task(**{**_fields(heldout), "metadata": {"split": "eval"}})
        await _submit(js, heldout)
        await tap.wait(6)
        await asyncio.sleep(1.0)
        assert len(tap.got) == 6 and service.admission.ahead() == 4
        generated = {r.task.id for r in tap.got}
        assert "adm-eval" in generated and len(generated) == 3  # two of three train tasks
        # The learner reports 2 samples consumed: room for the third task.
        progress = PolicyUpdate(version=0, uri="", digest="", trained_samples=2)
        await js.publish(subjects.policy_update(), encode(progress))
        await tap.wait(8)
        assert service.admission.waits >= 1
    assert sorted({r.task.id for r in tap.got}) == ["adm-eval", "adm0", "adm1", "adm2"]


async def test_a_task_parked_at_admission_is_handed_back_at_once_on_stop(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    """The learner stops first, so the update a parked task waits for never comes: the
    stop hands it back without waiting out the grace, and the next generator serves it."""
    js = nc.jetstream()
    grace = runtime(nats_url, instance="gen-test", grace_s=60.0)
    settings = _settings(
        nats_url, tiny_model, runtime=grace, admission_samples=2, max_concurrent_tasks=2
    )
    service = GeneratorService(settings)
    async with service:
        await _submit(js, _task("park0", n=2))
        await _submit(js, _task("park1", n=2))
        await tap.wait(2)
        await asyncio.sleep(0.5)
        assert len(tap.got) == 2 and service.admission.waits == 1  # park1 is parked
        stopping = loop_time()
    assert loop_time() - stopping < 30, "the stop waited out the grace"
    assert service.admission.closed
    async with GeneratorService(_settings(nats_url, tiny_model)):
        await tap.wait(4)
    assert sorted({r.task.id for r in tap.got}) == ["park0", "park1"]


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def _fields(task: Task) -> dict[str, object]:
    return {f: getattr(task, f) for f in task.__struct_fields__ if f != "v"}


async def test_work_admitted_by_an_update_starts_on_its_weights(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path, tmp_path: Path
) -> None:
    """One task of room is the synchronous loop: the next task waits for the learner's
    update and is generated on the new weights, not on the old ones a moment earlier."""
    new = init_model(tmp_path / "v3", TinyModelSpec(seed=3))
    js = nc.jetstream()
    settings = _settings(nats_url, tiny_model, admission_samples=2, max_concurrent_tasks=2)
    async with GeneratorService(settings) as service:
        await _submit(js, _task("sync0", n=2))
        await _submit(js, _task("sync1", n=2))
        await tap.wait(2)
        await asyncio.sleep(0.5)
        assert len(tap.got) == 2  # the second task waits for room
        update = PolicyUpdate(
            version=3, uri=str(new), digest=directory_digest(new), trained_samples=2
        )
        await js.publish(subjects.policy_update(), encode(update))
        await tap.wait(4)
        figures = service.statistics()
    assert [r.segments[0].version for r in tap.got] == [0, 0, 3, 3]
    assert figures["count_weight_reload"] == 1 and figures["count_generate"] == 2
    assert figures["time_generate_s"] > 0 and figures["time_decode_s"] > 0
