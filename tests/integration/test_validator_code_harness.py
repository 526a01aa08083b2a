"""The code validator's real harness, run by ``HostPython`` in a host subprocess (what
the sandbox does, minus the isolation); tests/adversarial/test_code.py runs it in Docker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.messages import SandboxExec, SandboxResult, SandboxStatus
from services.validator.code_results import MARK
from tests.unit.test_validator_code import block, rollout, unit_tests


class HostPython:
    """Runs the request like the sandbox would, in a temporary directory on this host."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.requests: list[SandboxExec] = []

    async def run(self, request: SandboxExec, timeout_s: float) -> SandboxResult:
        self.requests.append(request)
        return await asyncio.to_thread(self._run, request)

    def _run(self, request: SandboxExec) -> SandboxResult:
        for name, data in request.files.items():
            (self.tmp / name).write_bytes(data)
        limit = request.limits.timeout_s or 10.0
        try:
            done = subprocess.run(
                [sys.executable, "-c", request.code or ""],
                input=request.stdin,
                cwd=self.tmp,
                capture_output=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired as expired:
            out = (expired.stdout or b"").decode()
            return SandboxResult(id=request.id, status=SandboxStatus.TIMEOUT, stdout=out)
        status = SandboxStatus.OK if done.returncode == 0 else SandboxStatus.NONZERO_EXIT
        return SandboxResult(
            id=request.id, status=status, exit_code=done.returncode, stdout=done.stdout.decode()
        )


async def test_all_tests_pass(tmp_path: Path) -> None:
    host = HostPython(tmp_path)
    verdict = await unit_tests(host).score(rollout(block("def add(a, b):\n    return a + b")))
    assert (verdict.score, verdict.message) == (1.0, "3/3 tests passed")
    request = host.requests[0]
    # The calls cross over; the expected values never do.
    assert set(request.files) == {"solution.py", "calls.json"}
    assert request.files["calls.json"] == b'["add(1, 2)", "add(-1, 1)", "add(2, 2)"]'
    assert b"3" not in request.files["calls.json"] + (request.code or "").encode()
    assert request.stdin == b"" and request.limits.timeout_s == 5.0


async def test_partial_credit_is_the_share_passed(tmp_path: Path) -> None:
    code = block("def add(a, b):\n    return a + b if a >= 0 else 99")
    verdict = await unit_tests(HostPython(tmp_path)).score(rollout(code))
    assert verdict.score == pytest.approx(2 / 3)


async def test_a_crashing_or_silent_candidate_scores_zero(tmp_path: Path) -> None:
    host = HostPython(tmp_path)
    assert (await unit_tests(host).score(rollout(block("def add(a, b")))).score == 0.0
    exits = block("import sys\nsys.exit(3)")
    assert (await unit_tests(host).score(rollout(exits))).score == 0.0
    assert (
        await unit_tests(host).score(rollout("no code here"))
    ).message == "no ```python code block"


async def test_forged_lines_count_only_with_the_values_they_would_have_to_compute(
    tmp_path: Path,
) -> None:
    forged = (
        f"for i in range(3):\n    print('{MARK}', i, 0)\n    print('pass', i)\n"
        "def add(a, b):\n    return 0"
    )
    verdict = await unit_tests(HostPython(tmp_path)).score(rollout(block(forged)))
    assert verdict.score == pytest.approx(1 / 3)  # add(-1, 1) == 0 is the one it got right


async def test_a_candidate_timeout_is_a_low_score_counting_what_passed(tmp_path: Path) -> None:
    slow = block("def add(a, b):\n    while a == 2:\n        pass\n    return a + b")
    verdict = await unit_tests(HostPython(tmp_path), timeout_s=1.0).score(rollout(slow))
    assert verdict.score == pytest.approx(2 / 3)
    assert "timeout" in verdict.message
