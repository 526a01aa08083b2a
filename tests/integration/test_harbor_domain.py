"""The ``harbor`` domain kind end to end: the hand-written fixtures and every exported
terminal template, each task in its own image built offline, its rollout made in a
session of that image as the generator makes it, judged by the real validator running
the task's own ``tests/test.sh`` in a checker session of the image.

The oracle (``solution/solve.sh`` as the agent's one bash call) scores 1; the untouched
setup (no call: no session, judged on a replay of nothing) scores less.  A verifier that
writes no reward, or a bad one, is ``invalid`` naming the task; no sandbox service is
``infra_failure``.  Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.messages import ScoreStatus
from services.domains import Domain, DomainRegistry
from services.domains.harbor_domain import domain
from services.domains.harbor_export import export_templates
from services.generator.agent import AgentLoop
from services.generator.tools import SandboxTools
from services.model.tokens import ChatTokenizer
from services.validator import ValidatorService
from tests.integration.harbor_stack import (
    harbor_stack,
    live_all,
    oracle,
    problems,
    rollout,
    said,
    score_all,
    task_of,
)
from tests.integration.support import client
from tests.integration.test_validator_service import settings
from tests.integration.test_validator_terminal import call_text
from tests.unit.test_generator_agent import ScriptedEngine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


@pytest.fixture(scope="module")
def fixtures_domain(sandbox_image: str) -> Domain:
    return domain("harbor-fixtures", {"path": str(FIXTURES)})


@pytest.fixture(scope="module")
def exported_domain(sandbox_image: str, tmp_path_factory: pytest.TempPathFactory) -> Domain:
    """Every terminal template, as ``temper domains export --harbor`` writes them."""
    folder = tmp_path_factory.mktemp("exported")
    export_templates(folder)
    return domain("harbor-exported", {"path": str(folder)})


@pytest.fixture(scope="module")
def broken_domain(sandbox_image: str, tmp_path_factory: pytest.TempPathFactory) -> Domain:
    """Two verifiers that cannot give a score: one writes no reward, one writes 2."""
    folder = tmp_path_factory.mktemp("broken")
    [none, two] = export_templates(folder, ["count_errors", "largest_file"])
    checks = none / "tests" / "checks.json"
    checks.write_text(json.dumps({**json.loads(checks.read_text()), "checks": []}))
    (two / "tests" / "test.sh").write_text("#!/bin/bash\necho 2 > /logs/verifier/reward.txt\n")
    return domain("harbor-broken", {"path": str(folder)})


@pytest.mark.timeout(900)
async def test_every_oracle_scores_one_and_every_untouched_setup_less(
    nats_url: str,
    sandbox_image: str,
    tmp_path: Path,
    fixtures_domain: Domain,
    exported_domain: Domain,
) -> None:
    domains = (fixtures_domain, exported_domain)
    cases = [(d, p) for d in domains for p in problems(d)]
    assert len(cases) == 3 + 34
    async with harbor_stack(nats_url, sandbox_image, tmp_path, domains) as nc:
        solved = await live_all(
            nc, [(task_of(d, p, "oracle", i), [oracle(p)]) for i, (d, p) in enumerate(cases)]
        )
        untouched = [rollout(task_of(d, p, "untouched", i), []) for i, (d, p) in enumerate(cases)]
        scores = await score_all(nc.jetstream(), [*solved, *untouched])
    for index, (_, problem) in enumerate(cases):
        good, bad = scores[f"oracle-{index}"], scores[f"untouched-{index}"]
        name = problem.task.name
        assert (good.status, good.reward) == (ScoreStatus.SCORED, 1.0), (name, said(good))
        assert bad.status is ScoreStatus.SCORED and bad.reward < 1.0, (name, said(bad))
    assert said(scores["untouched-2"]).startswith("reward 0 from reward.json")  # fix-word-count
    assert "1 calls, 0 failed" in said(scores["oracle-0"])


async def test_a_generated_trajectory_runs_in_the_tasks_image_and_is_verified(
    nats_url: str, sandbox_image: str, tmp_path: Path, tiny_model: Path, fixtures_domain: Domain
) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    [count, *_] = problems(fixtures_domain)
    # A failed command first (the chain counts it, and its recovery), then the oracle.
    commands = ["cat /app/missing.txt", "pwd; ls", oracle(count)]
    turns = [tokenizer.encode(call_text(c)) for c in commands]
    engine = ScriptedEngine([*turns, tokenizer.encode("Done.") + list(tokenizer.eos_ids)])
    async with harbor_stack(nats_url, sandbox_image, tmp_path, [fixtures_domain]) as nc:
        loop = AgentLoop(engine, tokenizer, SandboxTools(nc, timeout_s=60))
        [generated] = await loop.run(task_of(fixtures_domain, count, "generated", 0))
        assert generated.snapshot is not None, generated.error
        first, listing, _ = generated.tool_calls
        assert first.status == "nonzero_exit" and listing.status == "ok"
        assert listing.output.split() == ["/app", "gateway.log"]
        scores = await score_all(nc.jetstream(), [generated])
    judged = scores["generated-0"]
    assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 1.0), said(judged)
    assert "3 calls, 1 failed, 1 recovered" in said(judged)


async def test_a_verifier_without_a_valid_reward_is_invalid_naming_the_task(
    nats_url: str, sandbox_image: str, tmp_path: Path, broken_domain: Domain
) -> None:
    none, two = problems(broken_domain)
    async with harbor_stack(nats_url, sandbox_image, tmp_path, [broken_domain]) as nc:
        made = await live_all(
            nc,
            [
                (task_of(broken_domain, none, "none", 0), [oracle(none)]),
                (task_of(broken_domain, two, "two", 0), [oracle(two)]),
            ],
        )
        scores = await score_all(nc.jetstream(), made)
    for label, problem, reason in (
        ("none-0", none, "tests/test.sh wrote no reward (exited 2)"),
        ("two-0", two, "reward.txt's reward 2.0 is outside [0, 1]"),
    ):
        judged = scores[label]
        assert judged.status is ScoreStatus.INVALID, (label, judged)
        assert str(problem.task.path) in (judged.error or "") and reason in (judged.error or "")


async def test_no_sandbox_service_is_an_infra_failure(
    nats_url: str, fixtures_domain: Domain
) -> None:
    validator = ValidatorService(
        settings(nats_url, sandbox_timeout_s=1.0, sandbox_grace_s=0.5),
        domains=DomainRegistry([fixtures_domain]),
    )
    [count, *_] = problems(fixtures_domain)
    async with validator, client(nats_url) as nc:
        task = task_of(fixtures_domain, count, "nobody", 0)
        scores = await score_all(nc.jetstream(), [rollout(task, [])], timeout_s=60)
    assert scores["nobody-0"].status is ScoreStatus.INFRA_FAILURE, scores
