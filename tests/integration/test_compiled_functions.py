"""The cpp/js function domains: each reference passes its own tests under the real harness.

The harness runs here with the host's g++ and node (the sandbox image has the same
toolchains; tests/integration/test_validator_sandbox.py scores through the services).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol.messages import ChatMessage, SandboxResult, SandboxStatus, Task
from services.domains.api import Problem
from services.domains.compiled_bank import SPECS, CompiledSpec
from services.domains.compiled_functions import domain
from services.validator.code import Cases, cases_of, judge
from services.validator.code_harness import program
from services.validator.extract import code_block

PROGRAMS = {"cpp": "g++", "js": "node"}


def run_harness(tmp: Path, language: str, candidate: str, cases: Cases) -> tuple[int, str]:
    """(tests passed, stderr) of the validator's harness run in ``tmp``, judged as the
    validator judges it."""
    command, _, files = program(language, candidate, cases.calls)
    assert command is not None
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=120)
    status = SandboxStatus.OK if done.returncode == 0 else SandboxStatus.NONZERO_EXIT
    result = SandboxResult(id="x", status=status, stdout=done.stdout, stderr=done.stderr)
    verdict = judge(result, cases, language)
    return round(verdict.score * len(cases.calls)), done.stderr


def problem(language: str, key: str) -> Problem:
    """The problem with this key (draws pick a function and a variant at random)."""
    source = domain("d", {"language": language, "tests": 8}).source
    for seed in range(10_000):
        drawn = source.draw(random.Random(seed))
        if drawn.key == key:
            return drawn
    raise AssertionError(f"no draw gives {key}")


@pytest.mark.parametrize("language", ["cpp", "js"])
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_reference_passes_its_tests(
    tmp_path: Path, language: str, spec: CompiledSpec
) -> None:
    if shutil.which(PROGRAMS[language]) is None:
        pytest.skip(f"no {PROGRAMS[language]} on this host")
    for variant in (spec.variants[0], spec.variants[-1]):
        key = f"{language}:{spec.name}:{variant}"
        drawn = problem(language, key)
        candidate = code_block(drawn.reference, language)
        assert candidate is not None
        cases = cases_of(task_of(drawn), language)
        passed, stderr = run_harness(tmp_path, language, candidate, cases)
        assert passed == len(cases.calls), (key, stderr)
        # The example in the prompt is not one of the scored calls.
        assert not any(f"{call} ==" in drawn.question for call in cases.calls), key


@pytest.mark.parametrize(
    ("language", "wrong", "broken", "says"),
    [
        ("cpp", "int digit_sum(int n) { return n % 7; }", "int digit_sum(int n) {", "error"),
        ("js", "function digit_sum(n) { return n % 7; }", "function digit_sum(n) {", "SyntaxError"),
    ],
)
def test_wrong_and_broken_candidates(
    tmp_path: Path, language: str, wrong: str, broken: str, says: str
) -> None:
    if shutil.which(PROGRAMS[language]) is None:
        pytest.skip(f"no {PROGRAMS[language]} on this host")
    cases = cases_of(task_of(problem(language, f"{language}:digit_sum:3")), language)
    passed, _ = run_harness(tmp_path, language, wrong, cases)
    assert 0 <= passed < len(cases.calls)
    passed, stderr = run_harness(tmp_path, language, broken, cases)
    assert passed == 0 and says in stderr


def task_of(drawn: Problem) -> Task:
    prompt = [ChatMessage(role="user", content="q")]
    return Task(id="t", domain="d", prompt=prompt, metadata=drawn.metadata)
