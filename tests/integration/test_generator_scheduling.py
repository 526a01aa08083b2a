"""Scheduling in the generator service over a real nats-server: fair share between domains,
and between the tenants of a domain, under a 10:1 flood (torch engine), a task on another
tenant's subject dead-lettered, a domain quarantined while its sandbox fails, held in
its stream, then resumed by a probe once a real sandbox service (Docker) is up, and a
domain quarantined because the real validator's sandbox fails to judge its rollouts.

The quarantine test's engine is a test double at the model boundary (a random tiny model
writes no tool calls, and the tool path is the point): it calls the python tool on a
task's first turn and answers after the tool's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import RawStreamMsg

from protocol import headers as h
from protocol import streams, subjects
from protocol.client import TemperClient
from protocol.codec import Codec, encode
from protocol.errors import DecodeError
from protocol.messages import (
    ChatMessage,
    DomainControl,
    RolloutStatus,
    SamplingParams,
    ScoredRollout,
    Task,
)
from services.domains import DomainRegistry
from services.domains.terminal.family import domain as terminal_domain
from services.engines.engine import GenerateRequest, Sample
from services.generator.scheduling.scheduler import SchedulingSettings
from services.generator.service import GeneratorService
from services.model.tokens import ChatTokenizer
from services.runtime.jetstream import ensure_streams
from services.runtime.settings import RuntimeSettings
from services.sandbox.service import SandboxService
from services.sandbox.settings import Limits, SandboxSettings
from services.validator import ValidatorService
from tests.engines import ScriptedTurns, occurrences, stopped
from tests.integration import test_generator_service
from tests.integration.support import Inbox, counter, stream_count, stream_entries
from tests.integration.test_generator_service import RolloutTap, _settings, _submit
from tests.integration.test_validator_service import settings as validator_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TIER = 1


def _task(task_id: str, domain: str, *, tools: tuple[str, ...] = (), tenant: str = "") -> Task:
    return Task(
        id=task_id,
        domain=domain,
        tenant=tenant,
        tier=TIER,
        prompt=[ChatMessage(role="user", content=f"Say {task_id}.")],
        sampling=SamplingParams(max_tokens=4, seed=1),
        tools=list(tools),
        max_turns=2,
    )


#: The generator service tests' fixtures: a client connection, and a tap on every rollout.
nc = test_generator_service.nc
tap = test_generator_service.tap


async def test_a_ten_to_one_flood_does_not_starve_the_quiet_domain(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    # The flood is in the stream first: in stream order the quiet domain would come last.
    for i in range(100):
        await _submit(js, _task(f"flood-{i}", "flood"))
    for i in range(10):
        await _submit(js, _task(f"quiet-{i}", "quiet"))
    async with GeneratorService(_settings(nats_url, tiny_model)) as service:
        await tap.wait(20, timeout_s=120)
        first = [r.task.domain for r in tap.got[:20]]
        schedules = service.scheduler.schedules()
        details = await _details_while_busy(service)
    # Equal weights: half of the starts each while both wait (in flight: 2 at a time).
    assert 8 <= first.count("quiet") <= 12, first
    assert {s.domain for s in schedules} >= {"flood", "quiet"}
    assert any(" in_flight=flood:" in d for d in details), details


async def _details_while_busy(service: GeneratorService) -> list[str]:
    """The health detail (what ``temper status`` shows) until it names the flood in flight:
    between two tasks both slots can be empty for a moment, and the last quiet tasks may
    hold them for a while (90 flood tasks are still to come)."""
    details: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            while not any(" in_flight=flood:" in d for d in details):
                details.append(service.health()[1])
                await asyncio.sleep(0.01)
    return details


async def test_a_tenant_flood_does_not_starve_another_tenant_of_the_domain(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, streams.ALL)
    # On big's subject but saying small: refused, never counted as either's task.
    stray = _task("stray", "maths", tenant="small")
    await js.publish(subjects.task(TIER, "maths", "big"), encode(stray))
    # The flood is in the stream first: in stream order the small tenant would come last.
    for i in range(100):
        await _submit(js, _task(f"big-{i}", "maths", tenant="big"))
    for i in range(10):
        await _submit(js, _task(f"small-{i}", "maths", tenant="small"))
    async with GeneratorService(_settings(nats_url, tiny_model)) as service:
        await tap.wait(20, timeout_s=120)
        first = [r.task.tenant for r in tap.got[:20]]
        [maths] = service.scheduler.schedules()
        [dead] = await _dead_letters(nc, 1)
    # One domain, two tenants waiting: half of its starts each (in flight: 2 at a time).
    assert 8 <= first.count("small") <= 12, first
    tenants = {t.tenant: t for t in maths.tenants}
    assert set(tenants) == {"big", "small"} and tenants["small"].started >= 8
    assert maths.started == sum(t.started for t in maths.tenants)
    hdrs = dead.headers or {}
    assert (hdrs[h.DLQ_CODE], hdrs[h.DLQ_FIELD]) == ("validation", "$.tenant")
    assert "task 'stray' has tenant 'small'" in hdrs[h.DLQ_REASON]
    assert hdrs[h.DLQ_SUBJECT] == subjects.task(TIER, "maths", "big")


async def _dead_letters(nc: NATS, count: int, timeout_s: float = 30.0) -> list[RawStreamMsg]:
    js = nc.jetstream()
    async with asyncio.timeout(timeout_s):
        while len(entries := await stream_entries(js, streams.DEAD_LETTERS.name)) < count:
            await asyncio.sleep(0.1)
    return entries


class ToolCaller(ScriptedTurns):
    """Test double at the model boundary: the first turn of a trajectory calls the python
    tool (a task without tools simply ends there); a later turn, whose prompt holds that
    call, answers."""

    name = "tool-caller"

    def __init__(self, tokenizer: ChatTokenizer, code: str = "print(6 * 7)") -> None:
        body = {"name": "python", "arguments": {"code": code}}
        self._call = tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")
        end = tokenizer.tool_call_end_id
        if end is not None and self._call[-1] != end:
            self._call.append(end)
        self._answer = tokenizer.encode("<answer>42</answer>") + list(tokenizer.eos_ids)

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        later = occurrences(request.prompt_ids, self._call) > 0
        return stopped(self._answer if later else self._call, request.n)


def _sandbox_settings(nats_url: str, image: str, tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(
        runtime=RuntimeSettings(nats_url=nats_url, instance="sched-sandbox", grace_s=5),
        backend="docker",
        image=image,
        pool_size=1,
        # AF_UNIX paths are short: keep the sockets out of pytest's long tmp paths.
        state_dir=Path(tempfile.mkdtemp(prefix="tgs-")),
        snapshot_dir=tmp_path / "snapshots",
        defaults=Limits(timeout_s=10.0, memory_mb=128, pids=64, output_bytes=65536, disk_mb=16),
    )


async def _held(nc: NATS, domain: str) -> int:
    info = await nc.jetstream().stream_info(
        streams.TASK_STREAMS[TIER].name, subjects_filter=subjects.task(TIER, domain)
    )
    return sum((info.state.subjects or {}).values())


async def test_a_domain_whose_sandbox_fails_is_held_then_resumed_by_a_probe(
    nats_url: str,
    nc: NATS,
    tap: RolloutTap,
    tiny_model: Path,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    scheduling = SchedulingSettings(
        quarantine_min_samples=4, quarantine_threshold=0.5, quarantine_probe_s=1.0
    )
    # One attempt each: every failure is published at once (retries: test_generator_retries).
    settings = _settings(
        nats_url,
        tiny_model,
        tools="sandbox",
        tool_timeout_s=10.0,
        scheduling=scheduling,
        retry_max_attempts=1,
    )
    engine = ToolCaller(ChatTokenizer.load(tiny_model))
    js = nc.jetstream()
    async with (
        GeneratorService(settings, engine) as service,
        await TemperClient.connect(nats_url) as temper,
    ):
        # No sandbox service yet: every tool call of "tooly" fails on the infrastructure.
        for i in range(12):
            await _submit(js, _task(f"tooly-{i}", "tooly", tools=("python",)))
        for i in range(6):
            await _submit(js, _task(f"plain-{i}", "plain"))
        async with asyncio.timeout(60):
            while not ("tooly" in service.scheduler.held() and len(tap.got) >= 10):
                await asyncio.sleep(0.1)
        [answer] = await temper.domain_control()
        states = {d.domain: d.state for d in answer.domains}
        assert states["tooly"] in ("quarantined", "probing") and states["plain"] == "active"
        failed = [r for r in tap.got if r.task.domain == "tooly"]
        assert failed and all(r.status is RolloutStatus.INFRA_FAILURE for r in failed)
        assert len(failed) < 12 and await _held(nc, "tooly") > 0, "held in the stream"
        assert "quarantined=tooly" in service.health()[1]
        assert service.statistics()["quarantined_domains"] == 1.0

        async with SandboxService(_sandbox_settings(nats_url, sandbox_image, tmp_path)):
            # Probes back off (1 s, 2 s, 4 s, ...) until one finds the sandbox working.
            async with asyncio.timeout(120):
                while len([r for r in tap.got if r.task.domain == "tooly"]) < 12:
                    await asyncio.sleep(0.2)
    tooly = [r for r in tap.got if r.task.domain == "tooly"]
    recovered = tooly[len(failed) :]
    assert recovered and all(r.status is RolloutStatus.OK for r in recovered[-3:])
    assert "tooly" not in service.scheduler.held()
    assert {r.task.domain for r in tap.got} == {"tooly", "plain"}
    assert sum(r.task.domain == "plain" for r in tap.got) == 6


#: A terminal task's hidden test: the validator runs it in a sandbox session, whatever
#: the rollout says, so the tiny policy's text is enough to need the sandbox.
CHECKS = [{"name": "always", "message": "never fails", "condition": "true"}]


def _judged_task(task_id: str, domain: str) -> Task:
    task = _task(task_id, domain)
    return msgspec.structs.replace(task, metadata={"checks": CHECKS})


async def _watch_replies(nc: NATS) -> tuple[Inbox, bytes]:
    """Bytes that are no ScoredRollout, published on a scored subject with a reply inbox
    (as JetStream publishes ask for the stream's ack); the inbox, and the bytes."""
    inbox = await Inbox.open(nc, "test.replies.scored")
    junk = b"\xc1 not msgpack"
    await nc.publish(subjects.scored("junk", "junk-0"), junk, reply="test.replies.scored")
    return inbox, junk


async def test_a_domain_whose_validator_sandbox_fails_is_held_in_its_stream(
    nats_url: str, nc: NATS, tap: RolloutTap, tiny_model: Path
) -> None:
    """No sandbox service: the validator's hidden tests of "term" fail on the infrastructure
    (the generator's own rollouts of it are fine: it calls no tool), and the generator
    that made those rollouts holds the domain.  "plain" is unknown to the validator
    (invalid, not infra) and goes on."""
    scheduling = SchedulingSettings(
        quarantine_min_samples=4, quarantine_threshold=0.5, quarantine_probe_s=600.0
    )
    settings = _settings(nats_url, tiny_model, scheduling=scheduling)
    judges = DomainRegistry([terminal_domain("term", {})])
    js = nc.jetstream()
    async with (
        ValidatorService(validator_settings(nats_url), domains=judges) as validator,
        GeneratorService(settings) as service,
        await TemperClient.connect(nats_url) as temper,
    ):
        replies, junk = await _watch_replies(nc)
        for i in range(4):
            await _submit(js, _judged_task(f"term-{i}", "term"))
        async with asyncio.timeout(60):
            while "term" not in service.scheduler.held():
                await asyncio.sleep(0.05)
        for i in range(4, 10):
            await _submit(js, _judged_task(f"term-{i}", "term"))
        for i in range(3):
            await _submit(js, _task(f"plain-{i}", "plain"))
        async with asyncio.timeout(60):
            while sum(r.task.domain == "plain" for r in tap.got) < 3:
                await asyncio.sleep(0.05)
        [answer] = await temper.domain_control()
        stats, judged = service.statistics(), validator.statistics()
        with pytest.raises(DecodeError) as bad:
            Codec(ScoredRollout).decode(junk)
        code = bad.value.code.value
        assert counter(service, "bad_input", source="generator", code=code) == 1.0
        acks = [await replies.next(), *await _more(replies)]
    states = {d.domain: d.state for d in answer.domains}
    assert states == {"term": "quarantined", "plain": "active"}
    assert judged["domain.term.infra_failure_rate"] == 1.0
    assert stats["quarantined_domains"] == 1.0 and stats["validator_infra_failures"] >= 2
    term = [r for r in tap.got if r.task.domain == "term"]
    assert [r.status for r in term] == [RolloutStatus.OK] * 4, "fine at generation"
    assert await _held(nc, "term") == 6, "held in the stream, not failed"
    assert await stream_count(js, streams.DEAD_LETTERS.name) == 0
    # The junk's only reply is the stream's ack: the generator watches, never answers.
    assert len(acks) == 1 and b'"stream"' in acks[0].data


async def _more(inbox: Inbox) -> list[Msg]:
    """What else comes to ``inbox`` within half a second."""
    more: list[Msg] = []
    with contextlib.suppress(nats.errors.TimeoutError):
        while True:
            more.append(await inbox.next(timeout_s=0.5))
    return more


async def test_domain_control_sets_weights_and_resumes_at_run_time(
    nats_url: str, tiny_model: Path
) -> None:
    async with (
        GeneratorService(_settings(nats_url, tiny_model)) as service,
        await TemperClient.connect(nats_url) as temper,
    ):
        [weighted] = await temper.domain_control(DomainControl(domain="maths", share_weight=4.0))
        [resumed] = await temper.domain_control(DomainControl(domain="maths", resume=True))
        now = service.scheduler.fairness.clock()
        for i in range(20):
            service.scheduler.quarantine.record("maths", f"m/{i}", infra_failure=True, now=now)
        [held] = await temper.domain_control()
        [lifted] = await temper.domain_control(DomainControl(domain="maths", resume=True))
    assert weighted.applied and service.scheduler.share.weight("maths") == 4.0
    assert not resumed.applied, "nothing to resume"
    assert [d.state for d in held.domains if d.domain == "maths"] == ["quarantined"]
    assert lifted.applied and service.scheduler.held() == []


async def test_tool_tasks_wait_for_a_free_sandbox_session(
    nats_url: str,
    nc: NATS,
    tap: RolloutTap,
    tiny_model: Path,
    sandbox_image: str,
    tmp_path: Path,
) -> None:
    """A pool of one session and three generator slots: without sandbox-aware admission
    concurrent trajectories are refused a session (infra failures); with it each tool
    task waits in its slot for the session, and every rollout is served."""
    reporting = RuntimeSettings(nats_url=nats_url, instance="one-session", stats_s=0.2)
    pool = dataclasses.replace(
        _sandbox_settings(nats_url, sandbox_image, tmp_path), runtime=reporting, max_sessions=1
    )
    settings = _settings(
        nats_url, tiny_model, tools="sandbox", tool_timeout_s=20.0, max_concurrent_tasks=3
    )
    # Each session is held a second: three trajectories at once would contend for it.
    engine = ToolCaller(ChatTokenizer.load(tiny_model), "import time; time.sleep(1); print(42)")
    async with SandboxService(pool), GeneratorService(settings, engine) as service:
        async with asyncio.timeout(30):
            while service.sandbox_admission.room() is None:
                await asyncio.sleep(0.1)
        for i in range(4):
            await _submit(nc.jetstream(), _task(f"boxed-{i}", "boxed", tools=("python",)))
        await tap.wait(4, timeout_s=120)
        waits = service.statistics()["sandbox_admission_waits"]
    assert [r.status for r in tap.got] == [RolloutStatus.OK] * 4, [r.error for r in tap.got]
    assert waits >= 1
