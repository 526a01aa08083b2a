"""Terminal tasks judged by probes, in sessions the policy has never been in.

The state judged is the one the model left: the generator snapshots each trajectory's
session at its end (``Rollout.snapshot``).  A rollout without one (an older generator,
a rollout built by hand) is replayed in a session of its own with the task's files;
where the rollout recorded what a call printed, the replay must print the same, or the
rollout scores 0 (a replay is not what the model saw, so it must never earn more than
the faithful state would), and the replayed session is then snapshotted.  A rollout
whose end snapshot could not be taken (``snapshot_error``: a work directory that cannot
be archived, a sandbox its own command spoiled) scores 0.

Each check's probe (see :mod:`services.validator.terminal_probes`) then runs in a fresh
checker session opened from that snapshot: only the work directory's files, no process of
the policy's session, a sandbox no candidate's code ever ran in, the checker user (a uid
the policy never had), a clean environment, one session per probe so that nothing a probe
starts outlives it.  Only the probe's recipe enters the sandbox; its observation comes
back and is compared with the expected value here.

Reward: the share of checks that pass.  The details name each failed check with its
message, and the chain: turns, commands, failed commands and the ones recovered from.
Statuses: a sandbox that fails (no service, no answer, ``infra_error``, a snapshot our
store lost) is an InfraFailure; whatever the candidate did to its workspace scores low.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from protocol.messages import Rollout, SandboxLimits, SandboxResult, SandboxStatus, ToolCall
from services.domains.api import SANDBOX_FILES
from services.validator.base import InfraFailure, InvalidRollout, Verdict, reference
from services.validator.sessions import Sessions, ShellSession, WorkspaceLost
from services.validator.terminal_probes import Check, argv, holds, observed, parse_check

#: Tool calls replayed, by tool name -> sandbox language; other tools never ran a command.
REPLAYED: Final = {"bash": "bash"}
#: Statuses of a call that never ran (no parsable call, unknown tool, bad arguments).
NEVER_RAN: Final = frozenset({"invalid", "error"})
#: Statuses after which the sandbox is gone: later commands and the test cannot run.
LOST: Final = frozenset({SandboxStatus.TIMEOUT, SandboxStatus.OOM, SandboxStatus.KILLED})


def checks_of(rollout: Rollout) -> list[Check]:
    raw = reference(rollout.task, "checks")
    checks = [parse_check(item) for item in raw] if isinstance(raw, list) else [None]
    if not checks or any(c is None for c in checks):
        raise InvalidRollout(f"task {rollout.task.id}: checks are missing or badly formed")
    return [c for c in checks if c is not None]


def files_of(rollout: Rollout) -> dict[str, bytes]:
    files = rollout.task.metadata.get(SANDBOX_FILES, {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InvalidRollout(
            f"task {rollout.task.id}: metadata[{SANDBOX_FILES!r}] is not text files"
        )
    return {str(path): text.encode() for path, text in files.items()}


def replayed(calls: list[ToolCall]) -> list[tuple[ToolCall, str, str]]:
    """(call, language, code) of each call that ran a command, in the order they ran."""
    found = []
    for call in calls:
        if call.name not in REPLAYED or call.status in NEVER_RAN:
            continue
        code = _code(call.arguments)
        if code is not None:
            found.append((call, REPLAYED[call.name], code))
    return found


def commands(calls: list[ToolCall]) -> list[tuple[str, str]]:
    """(language, code) of each call that ran a command, in the order they ran."""
    return [(language, code) for _, language, code in replayed(calls)]


def as_seen(result: SandboxResult) -> str:
    """What the model read of a call (as the generator's tools build it)."""
    return result.stdout + (f"\n{result.stderr}" if result.stderr else "")


def unfaithful(call: ToolCall, result: SandboxResult) -> bool:
    """The replay differs from what the rollout says the model saw (when it says)."""
    if not call.output:
        return False  # not recorded (a rollout built by hand): nothing to compare
    return call.output != as_seen(result) or call.status != result.status.value


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


def verdict(checks: list[Check], results: list[tuple[bool, str]]) -> tuple[float, str]:
    """Share of checks passed, and what failed (with how its probe ended, if badly)."""
    failing = [
        f"{c.name} ({c.message}){note}"
        for c, (ok, note) in zip(checks, results, strict=True)
        if not ok
    ]
    passed = len(checks) - len(failing)
    summary = f"{passed}/{len(checks)} checks passed"
    return passed / len(checks), summary + (f"; failed: {'; '.join(failing)}" if failing else "")


@dataclass(frozen=True)
class HiddenTest:
    sessions: Sessions
    limits: SandboxLimits

    async def score(self, rollout: Rollout) -> Verdict:
        checks = checks_of(rollout)
        files = files_of(rollout)
        saved = await saved_work(
            rollout, lambda: self.sessions.open(f"replay-{rollout.id}", files, self.limits)
        )
        if isinstance(saved, NotVerified):
            return Verdict(0.0, f"0/{len(checks)} checks run; {saved.why}; {chain(rollout)}")
        results = [await self._probe(rollout, saved, check) for check in checks]
        score, summary = verdict(checks, results)
        return Verdict(score, f"{summary}; {chain(rollout)}")

    async def _probe(self, rollout: Rollout, snapshot: str, check: Check) -> tuple[bool, str]:
        """Whether the check holds, in a session of its own opened from the snapshot."""
        command, outputs = argv(check.probe)
        session = await self.sessions.open(
            f"check-{rollout.id}", {}, self.limits, snapshot, checker=True
        )
        try:
            result = await session.probe(command, outputs)
        finally:
            await session.close()
        raise_infra(result)
        ended = result.status not in (SandboxStatus.OK, SandboxStatus.NONZERO_EXIT)
        note = f" [the probe ended {result.status}]" if ended else ""
        return holds(check.probe, observed(check.probe, result)), note


@dataclass(frozen=True)
class NotVerified:
    """No work directory to verify: why the rollout scores 0."""

    why: str


async def saved_work(
    rollout: Rollout, open_replay: Callable[[], Awaitable[ShellSession]]
) -> str | NotVerified:
    """The snapshot of the work directory the model left: the generator's, or else one
    taken after replaying the rollout's commands in a session ``open_replay`` opens at
    the task's start."""
    if rollout.snapshot_error:
        return NotVerified(f"the work directory could not be saved: {rollout.snapshot_error}")
    if rollout.snapshot is not None:
        return rollout.snapshot
    session = await open_replay()
    try:
        problem = await replay(session, replayed(list(rollout.tool_calls)))
        return NotVerified(problem) if problem else await session.snapshot()
    except WorkspaceLost as error:
        return NotVerified(f"the work directory could not be saved: {error}")
    finally:
        await session.close()


async def replay(session: ShellSession, calls: list[tuple[ToolCall, str, str]]) -> str:
    """Run the commands in order; why the replay cannot be judged, or ``""``."""
    for index, (call, language, code) in enumerate(calls):
        result = await session.run(language, code)
        raise_infra(result)
        if unfaithful(call, result):
            return (
                f"the replay of command {index + 1} differs from what the model saw "
                f"(it printed {_clip(as_seen(result))!r} and ended {result.status}): "
                "not judged on a replay"
            )
        if result.status in LOST:
            return f"command {index + 1} ended {result.status}: no sandbox left to test"
    return ""


def raise_infra(result: SandboxResult) -> None:
    if result.status is SandboxStatus.INFRA_ERROR:
        raise InfraFailure(f"sandbox infrastructure error: {result.error or 'no detail'}")


def _clip(text: str, size: int = 80) -> str:
    return text if len(text) <= size else text[:size] + "..."
