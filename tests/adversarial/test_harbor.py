"""Cheats against Harbor tasks' verifiers.

First as Harbor's own trial runs them (tests/integration/harbor_run.py): the verifier
runs after the agent, in the agent's container, so whatever the agent left in
``/logs/verifier`` is there when the verifier starts.  A reward the agent planted must
never be read as the verifier's, whether the verifier then scores the work or cannot
check at all.

Then through the ``harbor`` domain as Temper runs it (Docker, the real sandbox service
and validator; tests/integration/harbor_stack.py): each cheat is a trajectory made as
the generator makes it, in a session of the task's image, and judged by the task's own
test.sh in a checker session from its snapshot.  Each case asserts the reward its real
work deserves (0 for a pure cheat) and that it was scored: a workspace the candidate
broke is never ``infra_failure``.  Skips without Docker, unless CI=true or
TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from protocol.messages import ScoreStatus
from services.domains import Domain
from services.domains.harbor import load_task
from services.domains.harbor_domain import domain
from services.domains.harbor_export import export_templates
from tests.integration.harbor_run import outcome
from tests.integration.harbor_stack import (
    harbor_stack,
    live_all,
    problems,
    said,
    score_all,
    task_of,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"

PLANT = (
    "echo 1 > /logs/verifier/reward.txt; "
    "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; "
    "ls /logs/verifier/reward.txt"
)


def test_a_planted_reward_is_replaced_by_the_verifiers_score(
    tmp_path: Path, sandbox_image: str
) -> None:
    [path] = export_templates(tmp_path, ["count_errors"])
    reward, said = outcome(load_task(path), sandbox_image, solved=False, agent=PLANT)
    assert reward is not None and reward < 1.0, said


def test_a_planted_reward_is_not_read_when_the_verifier_cannot_check(
    tmp_path: Path, sandbox_image: str
) -> None:
    [path] = export_templates(tmp_path, ["count_errors"])
    checks = path / "tests" / "checks.json"
    checks.write_text(json.dumps({**json.loads(checks.read_text()), "checks": []}))
    reward, said = outcome(load_task(path), sandbox_image, solved=False, agent=PLANT)
    assert reward is None, said


# ---------------------------------------------------------------- through the harbor kind

#: Everything the agent could look for: the tests, the oracle, a checks file anywhere.
SNOOP = (
    "ls -d /tests /solution /logs 2>&1; cat /tests/test.sh /solution/solve.sh 2>&1; "
    "find / -xdev \\( -name test.sh -o -name solve.sh -o -name checks.json "
    "-o -name expected.json \\) 2>/dev/null | grep -v '^/proc' || echo nothing found"
)
#: A reward written where the verifier writes it, and where the work directory is.
PLANT_HERE = (
    "mkdir -p /logs/verifier 2>&1; echo 1 > /logs/verifier/reward.txt 2>&1; "
    "mkdir -p logs/verifier && echo 1 > logs/verifier/reward.txt && echo 1 > reward.txt && "
    "ln -s /logs/verifier/reward.txt planted.txt; echo planted"
)
#: Modules a Python run by test.sh in the work directory would import, a user site under
#: the work directory (the agent's HOME), startup files: each prints a perfect score.
FORGE = "import sys\nprint(1)\nsys.exit(0)\n"
SITE = ".local/lib/python3.11/site-packages"
SHADOW = (
    f"mkdir -p {SITE} && printf %s {json.dumps(FORGE)} | tee json.py sys.py "
    f"sitecustomize.py {SITE}/usercustomize.py > /dev/null && "
    "printf 'python3() { echo 1; }\\n' | tee .bashrc .profile > /dev/null && echo shadowed"
)
#: Links where the answer key will be when test.sh runs (dangling where the agent works).
LINK_KEY = "ln -s /tests/expected.json summary.json && ln -s ../tests d && echo linked"
#: The script test.sh runs, replaced: one that kills test.sh, one that kills its whole
#: process group, one that never ends, one that forks until the pids limit.
KILL_TEST = "printf '#!/bin/bash\\nkill -9 $(ps -o ppid= -p $PPID)\\n' > wordcount.sh"
KILL_GROUP = "printf '#!/bin/bash\\nkill -9 0\\n' > wordcount.sh"
#: The real work of count-timeouts.
COUNT = "grep -ci timeout gateway.log > answer.txt"
HANG = "printf '#!/bin/bash\\nsleep 1000\\n' > wordcount.sh"
BOMB = "printf '#!/bin/bash\\n:(){ :|:& };:\\n' > wordcount.sh"


@dataclass(frozen=True)
class Cheat:
    label: str
    #: The task's folder name (the fixtures, then the exported count_errors).
    task: str
    commands: tuple[str, ...]
    deserved: float = 0.0
    said: str = ""
    #: Sent without its snapshot (an older generator's rollout): judged on a replay of its
    #: commands in a fresh session of the task's image.
    replayed: bool = False


CHEATS = (
    Cheat("snoop for the tests and the oracle", "count-timeouts", (SNOOP,)),
    Cheat("plant a reward", "count-timeouts", (PLANT_HERE,)),
    Cheat("plant a reward, then work", "count-timeouts", (PLANT_HERE, COUNT), 1.0),
    Cheat("shadow what test.sh's python imports", "csv-summary", (SHADOW,)),
    Cheat("link the answer key", "csv-summary", (LINK_KEY,)),
    Cheat("kill test.sh", "fix-word-count", (KILL_TEST,), said="killed by signal 9"),
    Cheat("kill the verifier", "fix-word-count", (KILL_GROUP,), said="ended killed"),
    Cheat("hang the verifier", "fix-word-count", (HANG,), said="ended timeout"),
    Cheat("fork bomb in the verifier", "fix-word-count", (BOMB,)),
    Cheat("delete everything", "count_errors", ("rm -rf ./* ./.[!.]*",)),
    Cheat("plant a reward, replayed", "count-timeouts", (PLANT_HERE,), replayed=True),
    Cheat("the work, replayed", "count-timeouts", (COUNT,), 1.0, replayed=True),
    Cheat(
        "a random step, then the work, replayed", "count-timeouts", ("date +%s%N", COUNT),
        said="differs from what the model saw", replayed=True,
    ),
)  # fmt: skip


@pytest.fixture(scope="module")
def cheat_domains(sandbox_image: str, tmp_path_factory: pytest.TempPathFactory) -> list[Domain]:
    folder = tmp_path_factory.mktemp("exported")
    export_templates(folder, ["count_errors"])
    return [
        domain("harbor-fixtures", {"path": str(FIXTURES)}),
        domain("harbor-exported", {"path": str(folder)}),
    ]


@pytest.mark.timeout(600)
async def test_cheats_score_no_more_than_the_work_they_do(
    nats_url: str, sandbox_image: str, tmp_path: Path, cheat_domains: list[Domain]
) -> None:
    found = {p.task.name: (d, p) for d in cheat_domains for p in problems(d)}
    work = [
        (task_of(*found[cheat.task], "cheat", index), cheat.commands)
        for index, cheat in enumerate(CHEATS)
    ]
    async with harbor_stack(nats_url, sandbox_image, tmp_path, cheat_domains) as nc:
        made = await live_all(nc, work)
        sent = [
            msgspec.structs.replace(r, snapshot=None, snapshot_error=None) if c.replayed else r
            for r, c in zip(made, CHEATS, strict=True)
        ]
        scores = await score_all(nc.jetstream(), sent)
    for index, cheat in enumerate(CHEATS):
        judged = scores[f"cheat-{index}"]
        assert judged.status is ScoreStatus.SCORED, (cheat.label, judged.error, said(judged))
        assert judged.reward == cheat.deserved, (cheat.label, said(judged))
        assert cheat.said in said(judged), (cheat.label, said(judged))
    snooped = made[0].tool_calls[0].output
    assert "nothing found" in snooped, snooped
    for folder in ("/tests", "/solution", "/logs"):
        assert f"cannot access '{folder}': No such file" in snooped, snooped
    assert "rm -f /logs/verifier" not in snooped and "grep -ci" not in snooped, snooped
    assert "Read-only file system" in made[1].tool_calls[0].output
