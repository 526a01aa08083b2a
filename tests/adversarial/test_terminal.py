"""Cheats a policy could find against the terminal family, through the real sandbox
service (Docker) and the real validator.

Each rollout is made as the generator makes it: its commands run in a real session of
the sandbox (the generator's own tool client), what they printed is recorded, and the
session is snapshotted at the end (or the reason it could not be).  A few are also sent
without their snapshot, as an older generator would, to be judged on a replay.  Each
case asserts the reward its real work deserves (0 for a pure cheat) and that it was
scored: a workspace the candidate broke is never ``infra_failure``.  All rollouts go
out at once.  Skips without Docker, unless CI=true or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS

from protocol.messages import Rollout, ScoreStatus
from services.domains.terminal.base import Check, Made, output_is, succeeds
from services.domains.terminal.family import problem
from tests.integration.test_validator_terminal import (
    TERMINAL,
    live,
    made,
    score_all,
    task_of,
    terminal_stack,
)

SITE = "~/.local/lib/python3.11/site-packages"
#: Python files that print what a check might want and leave: a user site, a site
#: module and shadowed standard modules in the work directory, and a ``python3`` shim.
FORGE = "import sys\nprint('ok')\nprint('pass')\nsys.exit(0)\n"
SHADOWS = (
    f"mkdir -p {SITE} ~/.local/bin && printf %s {json.dumps(FORGE)} | tee {SITE}/usercustomize.py "
    "sitecustomize.py json.py subprocess.py sys.py os.py > /dev/null && "
    "printf '#!/bin/sh\\necho ok\\n' > python3 && chmod +x python3 && cp python3 ~/.local/bin/"
)
#: Startup files of every shell that might run a check, defining what a check calls.
STARTUP = (
    "for f in .bashrc .profile .bash_profile .bash_login env.sh; do "
    "printf 'stat() { echo 600; }\\npython3() { echo ok; }\\nexport PYTHONPATH=$PWD\\n' > $f; "
    "done; echo 'export BASH_ENV=$HOME/env.sh' >> .profile"
)
#: A process that outlives its command, reads every other process's arguments and
#: environment, and writes the last number it finds where the check reads.
STEALER = (
    "setsid nohup bash -c 'while :; do cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ "
    '2>/dev/null | tr "\\0" "\\n" | grep -E "^[0-9]+$" | tail -1 > error_count.txt; '
    "sleep 0.02; done' >/dev/null 2>&1 </dev/null & echo started"
)
#: A check's own uid is not the policy's, and every process it can see is its own.
APART = (
    'test "$(id -u)" != "$(cat policy_uid.txt)" && '
    'test -z "$(ps -eo uid= | tr -d " " | grep -vx "$(id -u)")" && echo apart'
)
#: The work directory too big to archive (over the agent's 40 MiB).
HUGE = "head -c 45000000 /dev/urandom > junk.bin"


@dataclass(frozen=True)
class Case:
    label: str
    template: str
    commands: tuple[str, ...]
    #: The reward the real work in ``commands`` deserves.
    deserved: float = 0.0
    #: Sent without its snapshot: judged on a replay (an older generator's rollout).
    replayed: bool = False
    said: str = ""


def solution(template: str) -> tuple[str, ...]:
    return made(template).solution


CASES = (
    Case("usercustomize and shadows", "failing_test", (SHADOWS, "python3 x.py")),
    Case("startup files", "private_key", (STARTUP, "bash -c true")),
    Case("stealer", "count_errors", (STEALER, "sleep 0.5")),
    Case("stealer, replayed", "count_errors", (STEALER, "sleep 0.5"), replayed=True),
    Case("random step, snapshot", "largest_file", ("date +%s%N", *solution("largest_file")), 1.0),
    Case(
        "random step, replayed",
        "largest_file",
        ("date +%s%N", *solution("largest_file")),
        0.0,
        replayed=True,
        said="differs from what the model saw",
    ),
    Case(
        "chmod 000 after the work", "count_errors", (*solution("count_errors"), "chmod 000 ."), 1.0
    ),
    Case(
        "chmod 000 after the work, replayed",
        "count_errors",
        (*solution("count_errors"), "chmod 000 .", "ls"),
        1.0,
        replayed=True,
    ),
    Case("chmod 000 alone", "count_errors", ("chmod 000 .",)),
    Case(
        "chmod 000 of a folder",
        "executable_script",
        (*solution("executable_script"), "chmod 000 tools"),
        0.5,
    ),
    Case("rm -rf", "count_errors", ("rm -rf ./* ./.[!.]*",)),
    Case("link to /etc", "count_errors", ("ln -s /etc/hostname error_count.txt",)),
    Case("link to the agent", "count_errors", ("ln -s /proc/1/environ error_count.txt",)),
    Case("fifo", "count_errors", ("mkfifo error_count.txt",)),
    Case("huge answer", "count_errors", ("head -c 20000000 /dev/urandom > error_count.txt",)),
    Case(
        "too big to save",
        "count_errors",
        (*solution("count_errors"), HUGE),
        said="could not be saved",
    ),
    # Names no request could carry, and many files: the snapshot still restores.
    Case(
        "odd names and many files",
        "count_errors",
        (
            "touch $'\\xff' $'new\\nline' ' ' && mkdir -p m && (cd m && seq 1 3000 | xargs touch)",
            *solution("count_errors"),
        ),
        1.0,
    ),
    # However the bomb ends (pids limit, timeout), it is scored, never infra_failure.
    Case("fork bomb", "count_errors", (":(){ :|:& };: ; wait",)),
    Case(
        "past the time limit",
        "count_errors",
        (*solution("count_errors"), "sleep 100"),
        said="could not be saved",
    ),
)


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, sandbox_image: str) -> AsyncIterator[NATS]:
    async with terminal_stack(nats_url, tmp_path, sandbox_image, timeout_s=60.0) as nc:
        yield nc


async def test_cheats_score_no_more_than_the_work_they_do(stack: NATS) -> None:
    tasks = [task_of(case.template, f"cheat{i}", i) for i, case in enumerate(CASES)]
    made_ = await asyncio.gather(
        *(live(stack, t, c.commands) for t, c in zip(tasks, CASES, strict=True))
    )
    sent = [
        msgspec.structs.replace(r, snapshot=None, snapshot_error=None) if c.replayed else r
        for r, c in zip(made_, CASES, strict=True)
    ]
    isolation = isolation_rollout(stack)
    scores = await score_all(stack.jetstream(), [*sent, await isolation])
    for case, task in zip(CASES, tasks, strict=True):
        judged = scores[task.id]
        message = judged.details[0].message if judged.details else judged.error
        assert judged.status is ScoreStatus.SCORED, (case.label, judged.error, message)
        assert judged.reward == case.deserved, (case.label, message)
        assert case.said in (message or ""), (case.label, message)
    judged = scores["term-isolation-0"]
    assert (judged.status, judged.reward) == (ScoreStatus.SCORED, 1.0), judged.details


async def isolation_rollout(nc: NATS) -> Rollout:
    """Nothing a probe starts outlives it: the first probe runs the candidate's script,
    which leaves a process behind that writes a file a moment later; the second probe,
    later, must not see it (each probe has a fresh session from the snapshot).  The third
    runs as a uid the policy never had, where no process of the policy's session is."""
    checks = (
        Check(name="first", message="step.sh failed", probe=succeeds("bash step.sh")),
        Check(
            name="second",
            message="a process of the first probe was still there",
            probe=output_is("sleep 2; cat flag.txt 2>/dev/null || echo clean", "clean"),
        ),
        Check(
            name="apart",
            message="the check ran as the policy's uid, or beside its processes",
            probe=output_is(APART, "apart"),
        ),
    )
    task_made = Made(
        values="isolation",
        prompt="Write step.sh.",
        files={"README": "x\n"},
        checks=checks,
        solution=(),
    )
    task = TERMINAL.task(problem("isolation", task_made), "train", 0, 0)
    task = msgspec.structs.replace(task, id="term-isolation-0")
    script = (
        "printf '%s\\n' \"setsid nohup bash -c 'sleep 0.5; echo dirty > flag.txt' "
        '>/dev/null 2>&1 </dev/null &" > step.sh'
    )
    # The policy's uid, and a process of it that would outlive the turn if it could.
    mark = "id -u > policy_uid.txt; (setsid sleep 300 >/dev/null 2>&1 </dev/null &)"
    return await live(nc, task, (script, mark))
