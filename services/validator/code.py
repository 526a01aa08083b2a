"""Unit tests in the sandbox: reward = share of the task's calls whose returned value is
the expected one.

The sandbox gets the candidate (the completion's last code block in the domain's
language) and the calls to make, never the expected values: a fixed harness
(:mod:`services.validator.code_harness`) runs each call and prints the value it returned,
and this process compares them with ``task.metadata["expected"]``.  So no answer key, no
nonce and no test file is there for the candidate to read, patch or forge around: a line
it prints itself must hold the values it would have to compute.  The score is the share
of the calls matched, at most one per call, so it stays in [0, 1].

Task metadata: ``calls`` (expressions in the language, e.g. ``add(1, 2)``) and
``expected`` (the Python ``repr`` of each expected value).  Python tasks written before
that format, with ``tests`` as ``assert CALL == LITERAL`` lines, are split into the two.

The candidate's own failures (no code block, compile or load error, timeout, memory, a
crash, a value of a type that is not plain data) are a low score: the values reported
before it count.  Failures of the machinery (sandbox infra_error, no sandbox, no answer)
are InfraFailure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Final

from protocol.errors import ErrorCode
from protocol.messages import (
    Rollout,
    SandboxExec,
    SandboxLimits,
    SandboxResult,
    SandboxStatus,
    Task,
)
from services.validator import extract
from services.validator.base import InfraFailure, InvalidRollout, Verdict
from services.validator.code_harness import program
from services.validator.code_results import returned, same
from services.validator.sandbox import Sandbox, SandboxRejected

#: What the compiler or loader said, at most this much, in a failing score's details.
MESSAGE_CHARS: Final = 400
LANGUAGES: Final = ("python", "cpp", "js")


@dataclass(frozen=True)
class Cases:
    """The calls to make and the values they must return (kept here, out of the sandbox)."""

    calls: list[str]
    expected: list[object]


def cases_of(task: Task, language: str) -> Cases:
    """The task's calls and expected values; InvalidRollout when it has none usable."""
    metadata = task.metadata
    if "calls" in metadata or "expected" in metadata:
        return _cases(task, metadata.get("calls"), metadata.get("expected"))
    if language == "python" and "tests" in metadata:
        return _from_asserts(task, metadata["tests"])
    raise InvalidRollout(f"task {task.id} has no metadata['calls'] and ['expected'] to judge by")


def _cases(task: Task, calls: object, expected: object) -> Cases:
    texts = isinstance(calls, list) and isinstance(expected, list)
    if not texts or not calls or len(calls) != len(expected):  # type: ignore[arg-type]
        raise InvalidRollout(
            f"task {task.id}: metadata['calls'] and ['expected'] are not two lists of one length"
        )
    assert isinstance(calls, list) and isinstance(expected, list)
    if not all(isinstance(c, str) for c in calls) or not all(isinstance(e, str) for e in expected):
        raise InvalidRollout(f"task {task.id}: calls and expected values must be strings")
    try:
        values = [ast.literal_eval(text) for text in expected]
    except (ValueError, SyntaxError) as error:
        message = f"task {task.id}: an expected value is not a literal: {error}"
        raise InvalidRollout(message) from None
    return Cases(list(calls), values)


def _from_asserts(task: Task, tests: object) -> Cases:
    """``assert CALL == LITERAL`` lines (the earlier format) as calls and expected values."""
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise InvalidRollout(f"task {task.id}: metadata['tests'] is not a list of asserts")
    calls, values = [], []
    for line in tests:
        try:
            [node] = ast.parse(line).body
            assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
            assert [type(op) for op in node.test.ops] == [ast.Eq]
            calls.append(ast.unparse(node.test.left))
            values.append(ast.literal_eval(node.test.comparators[0]))
        except (AssertionError, ValueError, SyntaxError):
            raise InvalidRollout(
                f"task {task.id}: test {line[:80]!r} is not `assert CALL == LITERAL`"
            ) from None
    return Cases(calls, values)


def judge(result: SandboxResult, cases: Cases, language: str) -> Verdict:
    if result.status is SandboxStatus.INFRA_ERROR:
        raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")
    total = len(cases.expected)
    stdout = result.stdout
    if result.stdout_truncated:  # its last line may be cut short: a value it never printed
        stdout = stdout[: stdout.rfind("\n") + 1]
    got = returned(stdout, total, language)
    matched = [i for i, want in enumerate(cases.expected) if i in got and same(got[i], want)]
    note = "" if result.status is SandboxStatus.OK else f"; the candidate ended {result.status}"
    said = _errors_first(result.stderr)
    if not matched and said:  # a compile or load error, most likely: say what it was
        note += f"; stderr: {said[:MESSAGE_CHARS]}"
    wrong = [i for i in got if i not in matched]
    if wrong:
        note += f"; wrong values for calls {sorted(wrong)[:10]}"
    return Verdict(len(matched) / total, f"{len(matched)}/{total} tests passed{note}")


def _errors_first(stderr: str) -> str:
    """What the compiler or loader said, its error lines first (notes come before them)."""
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    return "\n".join(errors + [line for line in lines if line not in errors])


@dataclass(frozen=True)
class UnitTests:
    sandbox: Sandbox
    limits: SandboxLimits
    #: Request timeout = the candidate's time limit + this (start-up, queueing, the reply).
    grace_s: float
    #: Used when the domain sets no time limit (the sandbox service then applies its own).
    default_timeout_s: float
    language: str = "python"

    async def score(self, rollout: Rollout) -> Verdict:
        cases = cases_of(rollout.task, self.language)
        code = extract.code_block(rollout.completion_text, self.language)
        if code is None:
            return Verdict(0.0, f"no ```{self.language} code block")
        request = self._request(rollout.id, code, cases.calls)
        timeout_s = (self.limits.timeout_s or self.default_timeout_s) + self.grace_s
        try:
            result = await self.sandbox.run(request, timeout_s)
        except SandboxRejected as error:
            if error.code is ErrorCode.TOO_LARGE:
                return Verdict(0.0, f"candidate refused: {error.message}")
            raise InfraFailure(str(error)) from None
        return judge(result, cases, self.language)

    def _request(self, rollout_id: str, code: str, calls: list[str]) -> SandboxExec:
        command, harness, files = program(self.language, code, calls)
        return SandboxExec(
            id=f"validate-{rollout_id}",
            language=self.language,
            code=harness,
            command=command,
            files=files,
            limits=self.limits,
        )
