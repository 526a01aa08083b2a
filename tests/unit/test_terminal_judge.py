"""The terminal judge without servers: probes (what enters the sandbox, the comparison
outside it), the judge on a scripted sandbox (snapshot, replay, statuses), and the
generator's snapshot at the end of a sample."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from protocol.messages import RolloutStatus, SandboxLimits, SandboxResult, SandboxStatus
from services.domains.api import SANDBOX_FILES
from services.domains.terminal.family import TEMPLATES
from services.generator.agent import AgentLoop
from services.generator.tools import (
    ToolInfraError,
    ToolOutcome,
    ToolSession,
    WorkspaceUnsaved,
)
from services.model.tokens import ChatTokenizer
from services.model.tool_format import ToolCallRequest
from services.validator.base import InfraFailure, InvalidRollout
from services.validator.sessions import WorkspaceLost
from services.validator.terminal import HiddenTest, checks_of
from services.validator.terminal_probes import Probe, argv, holds, observed, parse_check
from tests.unit.test_generator_agent import ScriptedEngine
from tests.unit.test_terminal import TERMINAL, call, rollout_of


def test_no_probe_carries_its_expected_value_into_the_sandbox() -> None:
    """What a probe sends (argv and the files asked back) never holds what it expects."""
    for name in TEMPLATES:
        for seed in range(5):
            for check in checks_of(rollout_of(name, [], seed=seed)):
                command, outputs = argv(check.probe)
                sent = " ".join([*command, *outputs])
                value = check.probe.value
                hidden = value if isinstance(value, list) else [value] if value else []
                if isinstance(value, dict):
                    hidden = [f"{k}={v}" for k, v in value.items()]
                assert not any(str(v) in sent for v in hidden if str(v)), (name, sent)


def test_probes_run_bash_in_a_clean_environment() -> None:
    [check] = checks_of(rollout_of("python_import", []))
    command, outputs = argv(check.probe)
    assert command[:2] == ["/usr/bin/env", "-i"] and outputs == []
    assert "PYTHONNOUSERSITE=1" in command and "HOME=/tmp/checker" in command
    assert command[-4:-1] == ["--noprofile", "--norc", "-c"] and command[-5] == "/bin/bash"
    assert not any(c.startswith(("PYTHONPATH", "BASH_ENV", "ENV=")) for c in command)
    [read] = checks_of(rollout_of("count_errors", []))
    assert argv(read.probe) == (["/bin/true"], ["error_count.txt"])


def probe(expect: str, value: object, *, run: str | None = "x") -> Probe:
    return Probe(run=run, read=None if run else "f", expect=expect, value=value)


@pytest.mark.parametrize(
    ("expect", "value", "seen", "held"),
    [
        ("ok", None, "", True),
        ("text", "42", " 42\n", True),
        ("text", "42", "43", False),
        ("lines", ["a", "b"], "a  \nb\n\n", True),
        ("lines", ["a", "b"], "b\na", False),
        ("json", {"a": [1, 2]}, '{"a": [1, 2]}', True),
        ("json", {"a": [1, 2]}, "{not json", False),
        ("pairs", {"K": "v", "L": "w"}, "L=w\nK=v\n", True),
        ("pairs", {"K": "v"}, "K=v\nX=1\n", False),
        ("lacks", "\r", "a\nb\n", True),
        ("lacks", "\r", "a\r\n", False),
        ("text", "42", None, False),
    ],
)
def test_observations_are_compared_outside(
    expect: str, value: object, seen: str | None, held: bool
) -> None:
    assert holds(probe(expect, value), seen) is held


def test_a_run_probe_that_ended_badly_observed_nothing() -> None:
    run = probe("text", "1")
    ok = SandboxResult(id="1", status=SandboxStatus.OK, stdout="1\n")
    assert observed(run, ok) == "1\n"
    for status in (SandboxStatus.NONZERO_EXIT, SandboxStatus.TIMEOUT, SandboxStatus.KILLED):
        assert observed(run, msgspec.structs.replace(ok, status=status)) is None
    assert observed(run, msgspec.structs.replace(ok, stdout_truncated=True)) is None
    read = probe("text", "1", run=None)
    assert observed(read, SandboxResult(id="1", status=SandboxStatus.OK)) is None  # absent
    found = SandboxResult(id="1", status=SandboxStatus.OK, outputs={"f": b"1"})
    assert observed(read, found) == "1"


def test_old_condition_checks_are_exit_status_probes_and_junk_is_refused() -> None:
    old = parse_check({"name": "always", "message": "m", "condition": "true"})
    assert old is not None and (old.probe.run, old.probe.expect) == ("true", "ok")
    for junk in (
        {"name": "bad name", "message": "m", "condition": "true"},
        {"name": "n", "message": "m", "probe": {"run": "x", "read": "y", "expect": "ok"}},
        {"name": "n", "message": "m", "probe": {"run": "x", "expect": "guess"}},
        ["n"],
    ):
        assert parse_check(junk) is None


@dataclass
class FakeSandbox:
    """Sessions of a scripted sandbox: runs answer with ``statuses`` (and ``printed``),
    probes with ``probe_result``; every open, run, probe and close is recorded."""

    statuses: list[SandboxStatus] = field(default_factory=list)
    printed: str = ""
    probe_result: SandboxResult = field(
        default_factory=lambda: SandboxResult(id="p", status=SandboxStatus.OK)
    )
    unsaved: bool = False
    opened: list[tuple[dict[str, bytes], str | None]] = field(default_factory=list)
    #: Per open: whether it asked for a checker's session.
    checkers: list[bool] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    probes: list[tuple[list[str], list[str]]] = field(default_factory=list)
    closed: int = 0

    async def open(
        self,
        name: str,
        files: Mapping[str, bytes],
        limits: SandboxLimits,
        snapshot: str | None = None,
        *,
        checker: bool = False,
    ) -> FakeSession:
        self.opened.append((dict(files), snapshot))
        self.checkers.append(checker)
        return FakeSession(self)


@dataclass
class FakeSession:
    box: FakeSandbox

    async def run(self, language: str, code: str, stdin: bytes = b"") -> SandboxResult:
        self.box.ran.append(code)
        status = self.box.statuses.pop(0)
        return SandboxResult(id="c", status=status, stdout=self.box.printed)

    async def probe(self, command: list[str], outputs: list[str]) -> SandboxResult:
        self.box.probes.append((command, outputs))
        return self.box.probe_result

    async def snapshot(self) -> str:
        if self.box.unsaved:
            raise WorkspaceLost("archive: 50000000 bytes, over 41943040")
        return "replayed-snap"

    async def close(self) -> None:
        self.box.closed += 1


def judge_with(box: FakeSandbox) -> HiddenTest:
    return HiddenTest(sessions=box, limits=SandboxLimits())


async def test_a_snapshot_is_judged_one_fresh_session_per_probe_without_replay() -> None:
    box = FakeSandbox(probe_result=SandboxResult(id="p", status=SandboxStatus.OK))
    rollout = rollout_of("executable_script", [call("bash", "chmod +x tools/greet.sh")])
    verdict = await judge_with(box).score(msgspec.structs.replace(rollout, snapshot="snap-9"))
    assert box.ran == [] and box.opened == [({}, "snap-9"), ({}, "snap-9")]
    assert box.checkers == [True, True]
    assert box.closed == 2 and len(box.probes) == 2
    # The exit-status probe holds; the read probe got no file back.
    assert verdict.score == 0.5 and "1/2 checks passed; failed: ran (" in verdict.message


async def test_without_a_snapshot_the_replay_is_snapshotted_then_probed() -> None:
    box = FakeSandbox([SandboxStatus.OK, SandboxStatus.NONZERO_EXIT])
    rollout = rollout_of(
        "executable_script", [call("bash", "chmod +x tools/greet.sh"), call("bash", "x")]
    )
    verdict = await judge_with(box).score(rollout)
    assert box.ran == ["chmod +x tools/greet.sh", "x"]
    assert list(box.opened[0][0]) == ["tools/greet.sh"] and box.opened[0][1] is None
    assert [snap for _, snap in box.opened[1:]] == ["replayed-snap", "replayed-snap"]
    # The replay runs the candidate's commands as the candidate; only the probes check.
    assert box.checkers == [False, True, True]
    assert box.closed == 3 and verdict.message.startswith("1/2 checks passed")


async def test_a_replay_that_differs_from_what_the_model_saw_scores_zero() -> None:
    seen = msgspec.structs.replace(call("bash", "echo $RANDOM > largest.txt"), output="1234\n")
    box = FakeSandbox([SandboxStatus.OK], printed="99\n")
    verdict = await judge_with(box).score(rollout_of("largest_file", [seen]))
    assert verdict.score == 0.0 and "differs from what the model saw" in verdict.message
    assert box.probes == [] and box.closed == 1
    same = FakeSandbox([SandboxStatus.OK], printed="1234\n")
    assert (
        "differs" not in (await judge_with(same).score(rollout_of("largest_file", [seen]))).message
    )


async def test_workspaces_the_candidate_broke_score_zero_and_infra_errors_raise() -> None:
    rollout = rollout_of("crlf", [call("bash", "sleep 99"), call("bash", "ls")])
    lost = FakeSandbox([SandboxStatus.TIMEOUT])
    verdict = await judge_with(lost).score(rollout)
    assert verdict.score == 0.0 and "command 1 ended timeout" in verdict.message
    assert lost.closed == 1 and lost.ran == ["sleep 99"]
    huge = FakeSandbox([SandboxStatus.OK, SandboxStatus.OK], unsaved=True)
    verdict = await judge_with(huge).score(rollout)
    assert verdict.score == 0.0 and "could not be saved: archive" in verdict.message
    unsaved = msgspec.structs.replace(rollout, snapshot_error="the sandbox is gone")
    verdict = await judge_with(FakeSandbox()).score(unsaved)
    assert verdict.score == 0.0 and "could not be saved: the sandbox is gone" in verdict.message
    broken = FakeSandbox([SandboxStatus.INFRA_ERROR])
    with pytest.raises(InfraFailure):
        await judge_with(broken).score(rollout)
    assert broken.closed == 1
    infra_probe = FakeSandbox(probe_result=SandboxResult(id="p", status=SandboxStatus.INFRA_ERROR))
    with pytest.raises(InfraFailure):
        await judge_with(infra_probe).score(msgspec.structs.replace(rollout, snapshot="s"))


async def test_a_task_without_checks_is_invalid() -> None:
    rollout = rollout_of("crlf", [])
    stripped = msgspec.structs.replace(rollout.task, metadata={SANDBOX_FILES: {}})
    judge_ = judge_with(FakeSandbox())
    with pytest.raises(InvalidRollout, match="checks"):
        await judge_.score(msgspec.structs.replace(rollout, task=stripped))


@dataclass
class EndSession:
    """A tool session whose snapshot answers ``end``: an id, or an exception to raise."""

    end: str | Exception

    async def call(self, request: ToolCallRequest) -> ToolOutcome:
        return ToolOutcome(output="", status="ok", duration_s=0.0)

    async def snapshot(self) -> str | None:
        if isinstance(self.end, Exception):
            raise self.end
        return self.end

    async def close(self) -> None:
        return None


@dataclass
class EndTools:
    end: str | Exception

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
    ) -> ToolSession:
        return EndSession(self.end)


@pytest.mark.parametrize(
    ("end", "status", "snapshot", "error"),
    [
        ("end-snap", RolloutStatus.OK, "end-snap", None),
        (WorkspaceUnsaved("too big"), RolloutStatus.OK, None, "too big"),
        (ToolInfraError("no sandbox"), RolloutStatus.INFRA_FAILURE, None, None),
    ],
)
async def test_the_generator_snapshots_the_session_at_the_end(
    tiny_model: Path,
    end: str | Exception,
    status: RolloutStatus,
    snapshot: str | None,
    error: str | None,
) -> None:
    """The judge reads the state the model left; a workspace that cannot be saved is the
    sample's doing (recorded, judged 0), a sandbox that fails is infra."""
    tokenizer = ChatTokenizer.load(tiny_model)
    body = json.dumps({"name": "bash", "arguments": {"code": "ls"}})
    engine = ScriptedEngine(
        [tokenizer.encode(f"<tool_call>{body}</tool_call>"), tokenizer.encode("Done.")]
    )
    task = TERMINAL.make_tasks(1, seed=5)[0]
    [generated] = await AgentLoop(engine, tokenizer, EndTools(end)).run(task)
    assert (generated.status, generated.snapshot) == (status, snapshot)
    assert generated.snapshot_error == error
