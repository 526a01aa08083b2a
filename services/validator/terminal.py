"""Terminal tasks judged by a hidden test, run after the policy's commands are replayed.

The validator opens a fresh sandbox session with the task's files (as the generator
did), replays the rollout's bash calls in their order, then runs the hidden test as
the session's last exec (see :mod:`services.domains.terminal` for why a replay).  The
test is built here from ``task.metadata["checks"]``: each check is a bash condition run
in its own ``bash -c`` under a time limit, and reports one line prefixed with a nonce
read from stdin, so a command that printed "pass" lines does not count.

Reward: the share of checks that pass.  The details name each failed check with its
message, and the chain: turns, commands, failed commands and the ones recovered from.
A sandbox that fails (no service, no answer, ``infra_error``) is an InfraFailure.
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import Rollout, SandboxLimits, SandboxResult, SandboxStatus, ToolCall
from services.domains.api import SANDBOX_FILES
from services.validator.base import InfraFailure, InvalidRollout, Verdict, reference
from services.validator.sessions import Sessions, ShellSession

#: Tool calls replayed, by tool name -> sandbox language; other tools never ran a command.
REPLAYED: Final = {"bash": "bash"}
#: Statuses of a call that never ran (no parsable call, unknown tool, bad arguments).
NEVER_RAN: Final = frozenset({"invalid", "error"})
#: Statuses after which the sandbox is gone: later commands and the test cannot run.
LOST: Final = frozenset({SandboxStatus.TIMEOUT, SandboxStatus.OOM, SandboxStatus.KILLED})
#: Seconds one check may run.
CHECK_TIMEOUT_S: Final = 20
TEST_PRELUDE: Final = f"""\
read -r nonce
check() {{
    if timeout {CHECK_TIMEOUT_S} bash -c "$2" </dev/null >/dev/null 2>&1; then
        echo "$nonce pass $1"
    else
        echo "$nonce fail $1"
    fi
}}
"""


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    message: str
    condition: str


def checks_of(rollout: Rollout) -> list[Check]:
    raw = reference(rollout.task, "checks")
    try:
        checks = [Check(**item) for item in raw]
    except TypeError:
        raise InvalidRollout(
            f"task {rollout.task.id}: metadata['checks'] is not a list of name/message/condition"
        ) from None
    if not checks or not all(_well_formed(c) for c in checks):
        raise InvalidRollout(f"task {rollout.task.id}: checks are missing or badly formed")
    return checks


def _well_formed(check: Check) -> bool:
    # Names go into the test script unquoted and back through its output: identifiers only.
    texts = (check.name, check.message, check.condition)
    return all(isinstance(t, str) for t in texts) and check.name.isidentifier()


def files_of(rollout: Rollout) -> dict[str, bytes]:
    files = rollout.task.metadata.get(SANDBOX_FILES, {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InvalidRollout(
            f"task {rollout.task.id}: metadata[{SANDBOX_FILES!r}] is not text files"
        )
    return {str(path): text.encode() for path, text in files.items()}


def hidden_test_script(checks: list[Check]) -> str:
    lines = [f"check {c.name} {shlex.quote(c.condition)}" for c in checks]
    return TEST_PRELUDE + "\n".join(lines) + "\n"


def commands(calls: list[ToolCall]) -> list[tuple[str, str]]:
    """(language, code) of each call that ran a command, in the order they ran."""
    found = []
    for call in calls:
        if call.name not in REPLAYED or call.status in NEVER_RAN:
            continue
        code = _code(call.arguments)
        if code is not None:
            found.append((REPLAYED[call.name], code))
    return found


def _code(arguments: str) -> str | None:
    # ``arguments`` is the call's JSON body as the model wrote it: name and arguments.
    try:
        body: Any = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    code = body.get("arguments", {}).get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def chain(rollout: Rollout) -> str:
    """Turns, commands, failed commands and how many of those a later success followed."""
    statuses = [c.status for c in rollout.tool_calls]
    failed = [i for i, s in enumerate(statuses) if s != "ok"]
    recovered = sum("ok" in statuses[i + 1 :] for i in failed)
    turns = sum(s.kind == "gen" for s in rollout.segments)
    return f"{turns} turns, {len(statuses)} calls, {len(failed)} failed, {recovered} recovered"


def judge(result: SandboxResult, nonce: str, checks: list[Check]) -> tuple[float, str]:
    """Share of checks passed, and what failed (a check that never reported failed)."""
    if result.status is SandboxStatus.INFRA_ERROR:
        raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")
    passed: set[str] = set()
    for line in result.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1] == "pass":
            passed.add(parts[2])
    failing = [f"{c.name} ({c.message})" for c in checks if c.name not in passed]
    score = (len(checks) - len(failing)) / len(checks)
    summary = f"{len(checks) - len(failing)}/{len(checks)} checks passed"
    if result.status is not SandboxStatus.OK:
        summary += f"; the test ended {result.status}"
    return score, summary + (f"; failed: {'; '.join(failing)}" if failing else "")


@dataclass(frozen=True)
class HiddenTest:
    sessions: Sessions
    limits: SandboxLimits

    async def score(self, rollout: Rollout) -> Verdict:
        checks = checks_of(rollout)
        files = files_of(rollout)
        session = await self.sessions.open(f"judge-{rollout.id}", files, self.limits)
        try:
            lost = await self._replay(session, commands(list(rollout.tool_calls)))
            if lost:
                return Verdict(0.0, f"{lost}; {chain(rollout)}")
            nonce = secrets.token_hex(16)
            result = await session.run("bash", hidden_test_script(checks), f"{nonce}\n".encode())
        finally:
            await session.close()
        score, summary = judge(result, nonce, checks)
        return Verdict(score, f"{summary}; {chain(rollout)}")

    async def _replay(self, session: ShellSession, replayed: list[tuple[str, str]]) -> str:
        """Run the commands in order; the reason the sandbox was lost, or ``""``."""
        for index, (language, code) in enumerate(replayed):
            result = await session.run(language, code)
            if result.status is SandboxStatus.INFRA_ERROR:
                raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")
            if result.status in LOST:
                return f"command {index + 1} ended {result.status}: no sandbox left to test"
        return ""
