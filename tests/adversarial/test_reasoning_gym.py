"""Cheats on the reasoning_gym validator, for every registered dataset, through the running
validator service: several candidate answers in one tag, the question echoed back, the
answer claimed in prose without the tag, an unclosed tag, and huge completions.

What each deserves: a list of k candidates (four, or fewer where a dataset has fewer
answers) is one guess among k, worth 1/k; over the k places the right one can take, it
earns on average at most 1/k + 0.25.  The slack is for the default scorer, which credits an
answer that contains the right one by ``len(right) / len(answer)``: about 1/k for
candidates of equal length, more when the right one is the shortest.  The question echoed
back did no work: at most 0.1 (some scorers give a small floor to any answer).  No tag, or
an answer over ``max_answer_chars``, is not read at all: 0.
"""

from __future__ import annotations

import statistics
import time

from protocol.messages import ScoredRollout, ScoreStatus, Task
from services.domains import Domain, DomainRegistry, load_registry
from services.domains import reasoning_gym as rg
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_reasoning_gym import DEPLOY
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

#: Candidates in a hedged answer at most: the right one and three other answers.
CANDIDATES = 4
#: What a hedge may earn over one guess among its candidates (see the module's text).
HEDGE_SLACK = 0.25
#: Characters of each huge completion (the NATS payload limit is 1 MiB).
HUGE = 200_000


def others(domain: Domain, right: str) -> list[str]:
    """Up to three distinct answers of other held-out problems: right form, wrong values."""
    found: list[str] = []
    for problem in domain.problems(200, "eval", seed=3):
        answer = str(problem.metadata["answer"])
        if answer != right and answer not in found:
            found.append(answer)
        if len(found) == CANDIDATES - 1:
            break
    assert found, f"{domain.name}: every answer is {right!r}"
    return found


def hedges(right: str, wrong: list[str]) -> list[str]:
    """The candidates one per line, the right one in each place in turn."""
    return [
        "<answer>" + "\n".join([*wrong[:place], right, *wrong[place:]]) + "</answer>"
        for place in range(len(wrong) + 1)
    ]


def cheats(domain: Domain, task: Task) -> dict[str, str]:
    """name -> completion; the hedges are ``hedge-0``, ``hedge-1``, ..."""
    right, question = str(task.metadata["answer"]), task.prompt[-1].content
    made = {f"hedge-{i}": text for i, text in enumerate(hedges(right, others(domain, right)))}
    padding = "Let me think step by step about it. " * (HUGE // 36)
    return {
        "reference": f"<answer>{right}</answer>",
        **made,
        "question echoed": f"<answer>{question}</answer>",
        "claimed in prose": f"I worked it out: the answer is {right}.",
        "unclosed tag": f"<answer>{right}",
        "huge tag of guesses": "<answer>"
        + (f"{right}\n" * (HUGE // (len(right) + 1)))
        + "</answer>",
        "huge prose, no tag": padding + f"So the answer is {right}.",
    }


async def judged(nats_url: str, registry: DomainRegistry) -> dict[str, dict[str, ScoredRollout]]:
    """Every cheat of every dataset, scored: domain -> cheat -> result."""
    made: dict[str, dict[str, str]] = {}
    async with ValidatorService(settings(nats_url), domains=registry), client(nats_url) as nc:
        js = nc.jetstream()
        for domain in registry:
            task = domain.make_tasks(1, "eval", seed=0)[0]
            made[domain.name] = cheats(domain, task)
            for index, text in enumerate(made[domain.name].values()):
                await publish(js, make_rollout(task, text, index=index))
        total = sum(len(c) for c in made.values())
        results = await scored_results(js, total, timeout_s=90)
    by_index = {(s.rollout.task.domain, s.rollout.sample_index): s for s in results}
    return {
        name: {cheat: by_index[(name, i)] for i, cheat in enumerate(cases)}
        for name, cases in made.items()
    }


async def test_no_cheat_earns_more_than_its_work_on_any_registered_dataset(
    nats_url: str,
) -> None:
    registry = DomainRegistry(
        d for d in load_registry(DEPLOY, plugins=False) if d.kind == "reasoning_gym"
    )
    assert len(registry) >= 50
    started = time.monotonic()
    results = await judged(nats_url, registry)
    for name, got in results.items():
        assert all(s.status is ScoreStatus.SCORED for s in got.values()), (name, got)
        reward = {cheat: s.reward for cheat, s in got.items()}
        assert reward["reference"] == 1.0, (name, got["reference"].details)
        hedged = [score for cheat, score in reward.items() if cheat.startswith("hedge-")]
        assert statistics.mean(hedged) <= 1 / len(hedged) + HEDGE_SLACK, (name, hedged)
        assert reward["question echoed"] <= 0.1, (name, got["question echoed"].details)
        for cheat in ("claimed in prose", "unclosed tag", "huge prose, no tag"):
            assert reward[cheat] == 0.0, (name, cheat)
        huge = got["huge tag of guesses"]
        assert huge.reward == 0.0 and "over the" in huge.details[0].message, name
    # Huge completions are not read past the tag: judging them all stays quick.
    assert time.monotonic() - started < 90


def test_the_refused_datasets_are_the_ones_whose_scorers_run_or_hang_on_the_answer() -> None:
    """Each refused dataset exists in the pinned reasoning-gym, so the refusal is not moot."""
    known = rg.registry()
    assert set(rg.UNSAFE) <= set(known)
