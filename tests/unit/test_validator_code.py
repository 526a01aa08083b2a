"""The unit-test validator with the sandbox replaced at its boundary: the fakes return
chosen SandboxResults and errors to test how outcomes are mapped.  The harness itself
runs in tests/integration/test_validator_code_harness.py."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

import pytest

from protocol.errors import ErrorCode
from protocol.messages import (
    ChatMessage,
    Rollout,
    SandboxExec,
    SandboxLimits,
    SandboxResult,
    SandboxStatus,
    Task,
)
from services.domains.python_bank import SPECS
from services.domains.python_functions import reference_function
from services.validator.base import InfraFailure, InvalidRollout
from services.validator.code import UnitTests, cases_of
from services.validator.sandbox import SandboxRejected

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


class Canned:
    """Answers every request with what ``answer`` makes of it."""

    def __init__(self, answer: Callable[[SandboxExec], SandboxResult]) -> None:
        self.answer = answer

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        return self.answer(request)


class Failing:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        raise self.error


def rollout(code: str, tests: list[str] | None = None) -> Rollout:
    task = Task(
        id="t1",
        domain="py",
        prompt=[ChatMessage(role="user", content="write add")],
        metadata={"tests": TESTS if tests is None else tests},
    )
    return Rollout(id="t1/0", task=task, sample_index=0, completion_text=code)


def unit_tests(sandbox: object, timeout_s: float = 5.0) -> UnitTests:
    return UnitTests(
        sandbox=sandbox,  # type: ignore[arg-type]
        limits=SandboxLimits(timeout_s=timeout_s),
        grace_s=1.0,
        default_timeout_s=10.0,
    )


def block(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\n"


@pytest.mark.parametrize(
    "status", [SandboxStatus.OOM, SandboxStatus.KILLED, SandboxStatus.OUTPUT_LIMIT]
)
async def test_candidate_failures_are_scores(status: SandboxStatus) -> None:
    sandbox = Canned(lambda r: SandboxResult(id=r.id, status=status, stdout=""))
    verdict = await unit_tests(sandbox).score(rollout(block("x = 1")))
    assert verdict.score == 0.0 and status.value in verdict.message


async def test_sandbox_infra_error_is_an_infra_failure() -> None:
    broken = Canned(
        lambda r: SandboxResult(id=r.id, status=SandboxStatus.INFRA_ERROR, error="agent lost")
    )
    with pytest.raises(InfraFailure, match="agent lost"):
        await unit_tests(broken).score(rollout(block("x = 1")))


async def test_sandbox_refusals() -> None:
    too_large = Failing(SandboxRejected(ErrorCode.TOO_LARGE, "code is 3 MB"))
    verdict = await unit_tests(too_large).score(rollout(block("x = 1")))
    assert verdict.score == 0.0 and "code is 3 MB" in verdict.message
    unavailable = Failing(SandboxRejected(ErrorCode.UNAVAILABLE, "no sandbox free"))
    with pytest.raises(InfraFailure, match="no sandbox free"):
        await unit_tests(unavailable).score(rollout(block("x = 1")))


async def test_a_task_without_tests_is_invalid() -> None:
    with pytest.raises(InvalidRollout, match="tests"):
        never = Failing(AssertionError("the sandbox is never asked"))
        await unit_tests(never).score(rollout(block("x = 1"), tests=[]))


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"calls": ["f(1)"], "expected": []}, "two lists of one length"),
        ({"calls": ["f(1)"], "expected": ["f(1)"]}, "not a literal"),
        ({"calls": [1], "expected": ["1"]}, "must be strings"),
        ({"tests": ["assert f(1) != 2"]}, "is not `assert CALL == LITERAL`"),
        ({"tests": ["assert f(1) == g(2)"]}, "is not `assert CALL == LITERAL`"),
        ({}, "no metadata['calls']"),
    ],
)
def test_bad_task_metadata_is_invalid_with_its_reason(
    metadata: dict[str, object], says: str
) -> None:
    prompt = [ChatMessage(role="user", content="q")]
    task = Task(id="t", domain="py", prompt=prompt, metadata=metadata)
    with pytest.raises(InvalidRollout, match=re.escape(says)):
        cases_of(task, "python")


def test_old_asserts_split_into_calls_and_expected_values() -> None:
    task = rollout("").task
    cases = cases_of(task, "python")
    assert (cases.calls, cases.expected) == (["add(1, 2)", "add(-1, 1)", "add(2, 2)"], [3, 0, 4])


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_every_bank_reference_passes_its_own_tests(spec: object) -> None:
    """The python_functions bank: each variant's reference satisfies the tests it generates."""
    from services.domains.python_functions import FunctionSource

    source = FunctionSource(specs=(spec,), tests=8)  # type: ignore[arg-type]
    import random

    rng = random.Random(0)
    for _ in range(12):
        problem = source.draw(rng)
        variant = int(problem.key.rsplit(":", 1)[1])
        namespace = {problem.metadata["entry_point"]: reference_function(spec, variant)}  # type: ignore[arg-type]
        calls, expected = problem.metadata["calls"], problem.metadata["expected"]
        for call, want in zip(calls, expected, strict=True):
            # The expected values are literals the validator can read back, and right.
            assert eval(call, dict(namespace)) == ast.literal_eval(want), call
