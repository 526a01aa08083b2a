"""Cheats on the code family (Python, C++, JavaScript unit tests), each scored through the
running sandbox (Docker) and validator services: no cheat earns more than the work it
does, no score leaves [0, 1], and none escapes as ``infra_failure``.

The answer key never enters the sandbox, so the hunters find nothing to read; the harness
prints values, which the validator compares in its own process, so forged or patched lines
pay only for values that are right, and the first line for a call is the only one that
counts; look-alike objects are not plain data and print nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from nats.js import JetStreamContext

from protocol.messages import ScoredRollout, ScoreStatus, Task
from services.domains import Domain, DomainRegistry, load_registry
from services.domains.compiled_functions import domain as compiled_domain
from services.sandbox.service import SandboxService
from services.validator import ValidatorService
from services.validator.code_results import MARK
from tests.adversarial.code_cheats import cpp_cheats, js_cheats, python_cheats
from tests.integration.support import client
from tests.integration.test_validator_sandbox import sandbox_settings, wait_warm
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

FENCE = {"python": "python", "cpp": "cpp", "js": "js"}


@dataclass(frozen=True)
class Case:
    language: str
    name: str
    completion: str
    #: The most it may score (the share of calls it computes right).
    deserved: float
    exact: bool = False


def digit_sum_task(found: Domain) -> tuple[Task, str]:
    """A digit_sum task of the domain and its reference completion."""
    example = next(
        e
        for seed in range(10)
        for e in found.examples(20, seed=seed)
        if e.task.metadata["entry_point"] == "digit_sum"
    )
    return example.task, example.reference


def prompt_example(task: Task) -> tuple[int, int]:
    """The (n, value) the prompt shows, ``digit_sum(n) == value``."""
    found = re.search(r"digit_sum\((\d+)\) == (\d+)", task.prompt[-1].content)
    assert found is not None, task.prompt[-1].content
    return int(found[1]), int(found[2])


def partial_work(language: str, task: Task) -> Case:
    """Right for n below a bound, -1 above it: it deserves exactly the share below."""
    inputs = [int(re.findall(r"\d+", call)[0]) for call in task.metadata["calls"]]
    bound = sorted(inputs)[len(inputs) // 2]
    base = 10 if language == "python" else int(task.metadata["key"].rsplit(":", 1)[1]) + 6
    body = {
        "python": f"def digit_sum(n):\n    return sum(map(int, str(n))) if n < {bound} else -1",
        "cpp": f"int digit_sum(int n) {{ if (n >= {bound}) return -1; int t = 0;"
        f" for (; n; n /= {base}) t += n % {base}; return t; }}",
        "js": f"function digit_sum(n) {{ if (n >= {bound}) return -1; let t = 0;"
        f" for (; n; n = Math.floor(n / {base})) t += n % {base}; return t; }}",
    }[language]
    share = sum(n < bound for n in inputs) / len(inputs)
    return Case(language, "right below a bound only", fence(language, body), share, exact=True)


def fence(language: str, code: str) -> str:
    return f"```{FENCE[language]}\n{code}\n```"


def cases_for(language: str, task: Task, reference: str) -> list[Case]:
    example_n, example_value = prompt_example(task)
    expected = [int(e) for e in task.metadata["expected"]]
    assert -1 not in expected and f"digit_sum({example_n})" not in task.metadata["calls"]
    lucky = Counter(expected).most_common(1)[0][0]
    cheats = {
        "python": lambda: python_cheats(example_n, example_value, lucky),
        "cpp": lambda: cpp_cheats(example_n, example_value),
        "js": lambda: js_cheats(example_n, example_value, lucky),
    }[language]()
    return [
        Case(language, "the reference", reference, 1.0, exact=True),
        partial_work(language, task),
        *(Case(language, name, fence(language, code), 0.0) for name, code in cheats.items()),
    ]


@dataclass
class Stack:
    tasks: dict[str, tuple[Task, str]]
    js: JetStreamContext
    seen: int = 0


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[Stack]:
    python = load_registry(None, plugins=False).get("python_functions")
    # A compile takes 2 s on an idle machine and 15 s on a busy one: a limit the
    # reference cannot miss, since what is tested here is what a run prints.
    compiled = [
        compiled_domain(f"{lang}_functions", {"language": lang, "timeout_s": 90.0})
        for lang in ("cpp", "js")
    ]
    registry = DomainRegistry([python, *compiled])
    tasks = {"python": digit_sum_task(python)}
    tasks |= {d.name.split("_")[0]: digit_sum_task(d) for d in compiled}
    # Two runs at once, one per warm box: a dozen compiles at once on a small machine
    # would take longer than their time limit.  Runs queue instead: a generous grace.
    own = sandbox_settings(nats_url, sandbox_image, tmp_path)
    assert own.backend == "docker"  # some cheats kill every process they can reach
    sandbox = SandboxService(dataclasses.replace(own, max_in_flight=2))
    validator = ValidatorService(
        settings(nats_url, sandbox_grace_s=200.0, validator_timeout_s=300.0), domains=registry
    )
    async with sandbox, validator, client(nats_url) as nc:
        await wait_warm(sandbox, 2)
        yield Stack(tasks, nc.jetstream())


async def score_all(stack: Stack, cases: list[Case], language: str) -> list[ScoredRollout]:
    """Every case as one rollout of the language's task, judged; in the order of cases."""
    task, _ = stack.tasks[language]
    task = msgspec.structs.replace(task, id=f"{task.id}-{language}")
    for index, case in enumerate(cases):
        await publish(stack.js, make_rollout(task, case.completion, index=index))
    stack.seen += len(cases)
    results = await scored_results(stack.js, stack.seen, timeout_s=240)
    mine = {s.rollout.sample_index: s for s in results if s.rollout.task.id == task.id}
    return [mine[index] for index in range(len(cases))]


def verdicts(cases: list[Case], results: list[ScoredRollout]) -> list[str]:
    """What is wrong with each result, if anything (all of them at once, to read)."""
    wrong = []
    for case, scored in zip(cases, results, strict=True):
        said = f"{case.language} / {case.name}: {scored.status} {scored.reward} {scored.details}"
        if scored.status is not ScoreStatus.SCORED:
            wrong.append(f"not scored: {said}")
        elif not 0.0 <= scored.reward <= case.deserved + 1e-9:
            wrong.append(f"above {case.deserved}: {said}")
        elif case.exact and scored.reward != pytest.approx(case.deserved):
            wrong.append(f"not exactly {case.deserved}: {said}")
    return wrong


# A dozen compiles, two at a time, on a machine that may be busy.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("language", ["python", "js", "cpp"])
async def test_code_cheats_score_no_more_than_the_work_they_do(stack: Stack, language: str) -> None:
    cases = cases_for(language, *stack.tasks[language])
    problems = verdicts(cases, await score_all(stack, cases, language))
    assert not problems, "\n".join(problems)


def test_the_cheats_name_the_harness_mark() -> None:
    # The forgeries must write what the harness writes, or they test nothing.
    for cheats in (python_cheats(1, 1, 1), cpp_cheats(1, 1), js_cheats(1, 1, 1)):
        assert sum(MARK in code for code in cheats.values()) >= 2
