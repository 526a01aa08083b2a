"""Unit tests in the sandbox: reward = share of the task's tests the candidate passes.

The candidate (the completion's last ```python block) and the tests (``assert``
lines in ``task.metadata["tests"]``) travel as files; a fixed harness runs each
test in its own namespace and prints one line per test, prefixed with a nonce it
reads from stdin, so a candidate that prints "pass" lines does not count.

The candidate's own failures (timeout, memory, crash, non-zero exit) are a normal
low score: the tests that reported before it died count.  Failures of the
machinery (sandbox infra_error, no sandbox, no answer) are InfraFailure.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Final

from protocol.errors import ErrorCode
from protocol.messages import Rollout, SandboxExec, SandboxLimits, SandboxResult, SandboxStatus
from services.validator import extract
from services.validator.base import InfraFailure, InvalidRollout, Verdict, reference
from services.validator.sandbox import Sandbox, SandboxRejected

HARNESS: Final = """\
import json, sys
nonce = sys.stdin.readline().strip()
out = sys.stdout
tests = json.load(open("tests.json"))
def report(index, ok, why=""):
    out.write(f"{nonce} {'pass' if ok else 'fail'} {index} {why}\\n")
    out.flush()
namespace = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
except BaseException as error:
    for index in range(len(tests)):
        report(index, False, "load: " + type(error).__name__)
    sys.exit(0)
for index, test in enumerate(tests):
    try:
        exec(compile(test, "test_%d" % index, "exec"), dict(namespace))
        report(index, True)
    except BaseException as error:
        report(index, False, type(error).__name__)
"""


def count_passed(stdout: str, nonce: str) -> int:
    """Tests the harness reported as passed (each index once, whatever the candidate printed)."""
    passed: set[str] = set()
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == nonce and parts[1] == "pass":
            passed.add(parts[2])
    return len(passed)


def judge(result: SandboxResult, nonce: str, total: int) -> Verdict:
    if result.status is SandboxStatus.INFRA_ERROR:
        raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")
    passed = count_passed(result.stdout, nonce)
    note = "" if result.status is SandboxStatus.OK else f"; the candidate ended {result.status}"
    return Verdict(passed / total, f"{passed}/{total} tests passed{note}")


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
        tests = reference(rollout.task, "tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise InvalidRollout(f"task {rollout.task.id}: metadata['tests'] is not a list of code")
        code = extract.code_block(rollout.completion_text, self.language)
        if code is None:
            return Verdict(0.0, "no ```python code block")
        nonce = secrets.token_hex(16)
        request = SandboxExec(
            id=f"validate-{rollout.id}",
            code=HARNESS,
            stdin=f"{nonce}\n".encode(),
            files={"solution.py": code.encode(), "tests.json": json.dumps(tests).encode()},
            limits=self.limits,
        )
        timeout_s = (self.limits.timeout_s or self.default_timeout_s) + self.grace_s
        try:
            result = await self.sandbox.run(request, timeout_s)
        except SandboxRejected as error:
            if error.code is ErrorCode.TOO_LARGE:
                return Verdict(0.0, f"candidate refused: {error.message}")
            raise InfraFailure(str(error)) from None
        return judge(result, nonce, len(tests))
