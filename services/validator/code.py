"""Unit tests in the sandbox: reward = share of the task's tests the candidate passes.

The candidate (the completion's last ```python block) and the tests (``assert``
lines in ``task.metadata["tests"]``) travel as files; a fixed harness runs each
test in its own namespace and prints one line per test, prefixed with a nonce it
reads from stdin, so a candidate that prints "pass" lines does not count.

For ``cpp`` and ``js`` the tests are boolean expressions in that language; the
harness (built with g++, or run by node) evaluates each the same way.  A candidate
that does not compile (or load) passes no test, and the details carry the
compiler's first lines.

The candidate's own failures (timeout, memory, crash, non-zero exit) are a normal
low score: the tests that reported before it died count.  Failures of the
machinery (sandbox infra_error, no sandbox, no answer) are InfraFailure.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Final

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

CPP_HARNESS: Final = """\
#include <bits/stdc++.h>
using namespace std;
#include "solution.cc"
static void report(const std::string& nonce, int index, bool ok) {
    std::cout << nonce << (ok ? " pass " : " fail ") << index << std::endl;
}
int main() {
    std::string nonce;
    std::getline(std::cin, nonce);
TESTS
    return 0;
}
"""
CPP_TEST: Final = (
    "    try {{ report(nonce, {index}, static_cast<bool>({test})); }}"
    " catch (...) {{ report(nonce, {index}, false); }}"
)
JS_HARNESS: Final = """\
const fs = require('fs');
const vm = require('vm');
const nonce = fs.readFileSync(0, 'utf8').split('\\n')[0].trim();
const report = (index, ok, why = '') =>
    fs.writeSync(1, `${nonce} ${ok ? 'pass' : 'fail'} ${index} ${why}\\n`);
const tests = JSON.parse(fs.readFileSync('tests.json', 'utf8'));
try {
    vm.runInThisContext(fs.readFileSync('solution.js', 'utf8'), { filename: 'solution.js' });
} catch (error) {
    console.error(String(error));
    tests.forEach((_, index) => report(index, false, 'load: ' + error.name));
    process.exit(0);
}
tests.forEach((test, index) => {
    try {
        report(index, vm.runInThisContext(test) === true);
    } catch (error) {
        report(index, false, error.name);
    }
});
"""
#: What the compiler or loader said, at most this much, in a failing score's details.
MESSAGE_CHARS: Final = 400


def harness(language: str, candidate: str, tests: list[str]) -> tuple[list[str], dict[str, bytes]]:
    """The command that runs the tests in ``language``, and the files it needs."""
    if language == "cpp":
        lines = "\n".join(CPP_TEST.format(index=i, test=t) for i, t in enumerate(tests))
        main = CPP_HARNESS.replace("TESTS", lines)
        command = ["sh", "-c", "g++ -O2 -std=c++17 -o main main.cc && exec ./main"]
        return command, {"solution.cc": candidate.encode(), "main.cc": main.encode()}
    files = {"solution.js": candidate.encode(), "tests.json": json.dumps(tests).encode()}
    return ["node", "main.js"], {**files, "main.js": JS_HARNESS.encode()}


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
    said = result.stderr.strip()
    if passed == 0 and said:  # a compile or load error, most likely: say what it was
        note += f"; stderr: {said[:MESSAGE_CHARS]}"
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
            return Verdict(0.0, f"no ```{self.language} code block")
        nonce = secrets.token_hex(16)
        request = self._request(rollout.id, code, tests, nonce)
        timeout_s = (self.limits.timeout_s or self.default_timeout_s) + self.grace_s
        try:
            result = await self.sandbox.run(request, timeout_s)
        except SandboxRejected as error:
            if error.code is ErrorCode.TOO_LARGE:
                return Verdict(0.0, f"candidate refused: {error.message}")
            raise InfraFailure(str(error)) from None
        return judge(result, nonce, len(tests))

    def _request(self, rollout_id: str, code: str, tests: list[str], nonce: str) -> SandboxExec:
        common: dict[str, Any] = {
            "id": f"validate-{rollout_id}",
            "language": self.language,
            "stdin": f"{nonce}\n".encode(),
            "limits": self.limits,
        }
        if self.language == "python":
            files = {"solution.py": code.encode(), "tests.json": json.dumps(tests).encode()}
            return SandboxExec(code=HARNESS, files=files, **common)
        command, files = harness(self.language, code, tests)
        return SandboxExec(command=command, files=files, **common)
