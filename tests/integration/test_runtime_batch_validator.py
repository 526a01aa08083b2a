"""The validator on the batch path: stored before acked, and slow domains judged apart."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol import headers, streams, subjects
from protocol.codec import Codec, encode
from protocol.messages import ChatMessage, Rollout, ScoredRollout, ScoreStatus, Task, rollout_id
from services.domains import Domain, DomainRegistry, ValidatorSpec
from services.domains.params import Params
from services.runtime.jetstream import ensure_stream
from services.validator import ValidatorService, ValidatorSettings
from services.validator.base import Validator, Verdict
from services.validator.factory import Resources
from tests.integration.support import client, runtime, stream_entries, wait_count
from tests.integration.test_validator_service import Single

SCORED: Codec[ScoredRollout] = Codec(ScoredRollout)
#: Set by a test, awaited by every Waits validator.
RELEASE: dict[str, asyncio.Event] = {}


class Waits:
    """A validator that waits for the test to let it finish (a sandbox run, say)."""

    async def score(self, rollout: Rollout) -> Verdict:
        await RELEASE["slow"].wait()
        return Verdict(1.0, "finally")


def waits(params: Params, domain: Domain, resources: Resources) -> Validator:
    return Waits()


def registry() -> DomainRegistry:
    here = "tests.integration.test_runtime_batch_validator"
    specs = {
        "rules": ValidatorSpec(kind="math", params={"extract": "tag"}),
        "slow": ValidatorSpec(kind=f"{here}:waits", name="waits"),
    }
    return DomainRegistry(
        Domain(name=name, source=Single(), validators=(spec,)) for name, spec in specs.items()
    )


def settings(url: str, **overrides: Any) -> ValidatorSettings:
    values: dict[str, Any] = {
        "runtime": runtime(url, instance="v1"),
        "domain_plugins": False,
        "fetch_wait_s": 0.1,
        "max_in_flight": 64,
        "ack_wait_s": 5.0,
    }
    values.update(overrides)
    return ValidatorSettings(**values)


def rollout(domain: str, task_id: str, text: str = "<answer>7</answer>") -> Rollout:
    task = Task(
        id=task_id,
        domain=domain,
        prompt=[ChatMessage(role="user", content="q")],
        metadata={"answer": "7"},
    )
    return Rollout(id=rollout_id(task_id, 0), task=task, sample_index=0, completion_text=text)


async def publish(js: Any, item: Rollout) -> None:
    hdrs = {headers.MSG_ID: item.id, headers.TRACE_ID: f"trace-{item.task.id}"}
    await js.publish(subjects.rollout(item.task.domain), encode(item), headers=hdrs)


async def test_a_rollout_is_acked_only_once_its_result_is_stored(nats_url: str) -> None:
    service = ValidatorService(settings(nats_url), domains=registry())
    async with service, client(nats_url) as nc, asyncio.timeout(30):
        js = nc.jetstream()
        await js.delete_stream(streams.SCORED.name)  # results cannot be stored for now
        await publish(js, rollout("rules", "r1"))
        async with asyncio.timeout(10):
            while not service.metrics.registry.get_sample_value(
                "temper_failed_total", {"source": streams.ROLLOUTS.name}
            ):
                await asyncio.sleep(0.02)
        assert (await js.stream_info(streams.ROLLOUTS.name)).state.messages == 1
        await ensure_stream(js, streams.SCORED)  # back: the redelivery is stored, then acked
        await wait_count(js, streams.ROLLOUTS.name, 0, timeout_s=15)
        [entry] = await stream_entries(js, streams.SCORED.name)
        scored = SCORED.decode(entry.data)
        assert (scored.id, scored.status, scored.reward) == (
            rollout_id("r1", 0),
            ScoreStatus.SCORED,
            1.0,
        )
        assert (entry.headers or {})[headers.MSG_ID] == scored.id
        assert service.published == 1


async def test_a_slow_domain_does_not_hold_back_rule_judged_rollouts(nats_url: str) -> None:
    RELEASE["slow"] = asyncio.Event()
    service = ValidatorService(settings(nats_url), domains=registry())
    async with client(nats_url) as nc, asyncio.timeout(30):
        js = nc.jetstream()
        await ensure_stream(js, streams.ROLLOUTS)
        await publish(js, rollout("slow", "s1"))
        for index in range(5):
            await publish(js, rollout("rules", f"r{index}", text=f"<answer>{index}</answer>"))
        async with service:
            # One fetch holds all six; the rule-judged five are stored and acked meanwhile.
            await wait_count(js, streams.SCORED.name, 5)
            await wait_count(js, streams.ROLLOUTS.name, 1)
            assert service.in_flight == 1
            RELEASE["slow"].set()
            await wait_count(js, streams.ROLLOUTS.name, 0)
            await wait_count(js, streams.SCORED.name, 6)
        results = {
            SCORED.decode(e.data).id: SCORED.decode(e.data)
            for e in await stream_entries(js, streams.SCORED.name)
        }
        assert results[rollout_id("s1", 0)].reward == 1.0
        assert results[rollout_id("r0", 0)].reward == 0.0  # "0" is not the answer 7
        assert service.published == 6
