"""reasoning-gym scored through the validator service on a real nats-server: for every
registered dataset the reference answer scores 1 and a wrong one less, in this process and
in a validator process of its own that rebuilds each entry from the task alone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from protocol.messages import ScoredRollout, ScoreStatus, Task
from services.domains import Domain, DomainRegistry, load_registry
from services.runtime.jetstream import ensure_streams
from services.runtime.procs import child_preexec
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "domains"


def reasoning_gym_domains() -> DomainRegistry:
    return DomainRegistry(
        d for d in load_registry(DEPLOY, plugins=False) if d.kind == "reasoning_gym"
    )


def wrong_answer(domain: Domain, task: Task) -> str:
    """Another held-out problem's answer: the right form, the wrong value."""
    right = str(task.metadata["answer"])
    for problem in domain.problems(50, "eval", seed=1):
        if str(problem.metadata["answer"]) != right:
            return f"<answer>{problem.metadata['answer']}</answer>"
    raise AssertionError(f"{domain.name}: no other answer among 50 problems")


def cases(registry: DomainRegistry) -> list[tuple[Task, str, str]]:
    """(task, reference completion, wrong completion): one held-out problem per dataset."""
    out = []
    for domain in registry:
        example = domain.examples(1, "eval", seed=0)[0]
        out.append((example.task, example.reference, wrong_answer(domain, example.task)))
    return out


async def score_all(nats_url: str, made: list[tuple[Task, str, str]]) -> list[ScoredRollout]:
    async with client(nats_url) as nc:
        js = nc.jetstream()
        for task, reference, wrong in made:
            await publish(js, make_rollout(task, reference, index=0))
            await publish(js, make_rollout(task, wrong, index=1))
        return await scored_results(js, 2 * len(made), timeout_s=60)


def check(made: list[tuple[Task, str, str]], results: list[ScoredRollout]) -> None:
    got = {(s.rollout.task.domain, s.rollout.sample_index): s for s in results}
    assert len(got) == 2 * len(made)
    for task, _, _ in made:
        right, wrong = got[(task.domain, 0)], got[(task.domain, 1)]
        assert (right.status, right.reward) == (ScoreStatus.SCORED, 1.0), right.details
        assert wrong.status is ScoreStatus.SCORED, wrong.details
        assert wrong.reward < 1.0, (task.domain, wrong.rollout.completion_text, wrong.details)


async def test_every_registered_dataset_scores_its_reference_1_and_a_wrong_answer_less(
    nats_url: str,
) -> None:
    registry = reasoning_gym_domains()
    assert len(registry) >= 50
    made = cases(registry)
    async with ValidatorService(settings(nats_url), domains=registry):
        results = await score_all(nats_url, made)
    check(made, results)


def other_hash_seed() -> str:
    """A string hash seed unlike this process's (random unless PYTHONHASHSEED fixed it)."""
    mine = os.environ.get("PYTHONHASHSEED", "")
    return str(int(mine) + 1) if mine.isdigit() else "1"


@contextlib.asynccontextmanager
async def validator_process(nats_url: str, logs: Path) -> AsyncIterator[None]:
    """``temper serve validator`` on the deploy config, hashing strings unlike this process."""
    env = {
        **os.environ,
        "TEMPER_NATS_URL": nats_url,
        "TEMPER_INSTANCE": "rg-process",
        "TEMPER_VALIDATOR_DOMAINS_CONFIG": str(DEPLOY),
        "TEMPER_VALIDATOR_DOMAIN_PLUGINS": "false",
        "TEMPER_VALIDATOR_FETCH_WAIT_S": "0.1",
        # A dataset that leaned on set or dict order of strings would build other entries.
        "PYTHONHASHSEED": other_hash_seed(),
    }
    with logs.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services", "serve", "validator"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=REPO,
            env=env,
            preexec_fn=child_preexec(),
        )
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_a_validator_process_of_its_own_rebuilds_every_entry(
    nats_url: str, tmp_path: Path
) -> None:
    made = cases(reasoning_gym_domains())
    async with client(nats_url) as nc:
        await ensure_streams(nc.jetstream(), ValidatorService.streams)
    logs = tmp_path / "validator.log"
    async with validator_process(nats_url, logs):
        try:
            results = await score_all(nats_url, made)
        except TimeoutError:
            raise AssertionError(logs.read_text(errors="replace")[-3000:]) from None
    check(made, results)
