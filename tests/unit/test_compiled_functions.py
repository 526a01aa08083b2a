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

from services.domains.api import Problem
from services.domains.compiled_bank import SPECS, CompiledSpec
from services.domains.compiled_functions import domain
from services.validator.code import count_passed, harness
from services.validator.extract import code_block

PROGRAMS = {"cpp": "g++", "js": "node"}


def run_harness(tmp: Path, language: str, candidate: str, tests: list[str]) -> tuple[int, str]:
    """(tests passed, stderr) of the validator's harness run in ``tmp``."""
    command, files = harness(language, candidate, tests)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    done = subprocess.run(
        command, cwd=tmp, input="n0nce\n", capture_output=True, text=True, timeout=120
    )
    return count_passed(done.stdout, "n0nce"), done.stderr


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
        tests = list(drawn.metadata["tests"])
        passed, stderr = run_harness(tmp_path, language, candidate, tests)
        assert passed == len(tests), (key, stderr)


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
    tests = list(problem(language, f"{language}:digit_sum:3").metadata["tests"])
    passed, _ = run_harness(tmp_path, language, wrong, tests)
    assert 0 <= passed < len(tests)
    passed, stderr = run_harness(tmp_path, language, broken, tests)
    assert passed == 0 and says in stderr
