"""Harbor tasks run for real in the sandbox image (Docker): exported terminal templates
and the hand-written fixtures, each as Harbor's trial runs it (tests/integration/harbor_run.py).

The oracle (solution/solve.sh) scores 1; the untouched setup scores less; a verifier
that writes no reward gives no reward, which the caller scores ``invalid``.  Each task
runs in a container of its own, a few at a time.  Skips without Docker, unless CI=true
or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.domains import harbor_check
from services.domains.harbor import HarborTask, base_allowed, load_task, load_tasks
from services.domains.harbor_export import export_templates
from tests.integration.harbor_run import outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
#: One template per kind of probe: a file's text, a JSON file, a mode and a command.
TEMPLATES = ("count_errors", "json_set", "executable_script")


def rewards(cases: list[tuple[HarborTask, bool]], image: str) -> list[tuple[float | None, str]]:
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda case: outcome(case[0], image, solved=case[1]), cases))


def oracle_one_untouched_less(tasks: list[HarborTask], image: str) -> None:
    assert all(base_allowed(t.base_image, image) for t in tasks)
    cases = [(task, solved) for task in tasks for solved in (True, False)]
    for (task, solved), (reward, said) in zip(cases, rewards(cases, image), strict=True):
        if solved:
            assert reward == 1.0, (task.name, said)
        else:
            assert reward is not None and reward < 1.0, (task.name, reward, said)


def test_exported_templates_score_one_solved_and_less_untouched(
    tmp_path: Path, sandbox_image: str
) -> None:
    written = export_templates(tmp_path, TEMPLATES)
    oracle_one_untouched_less([load_task(path) for path in written], sandbox_image)


def test_hand_written_fixtures_run_unmodified(sandbox_image: str) -> None:
    tasks = load_tasks(FIXTURES)
    assert [t.name for t in tasks] == ["count-timeouts", "csv-summary", "fix-word-count"]
    oracle_one_untouched_less(tasks, sandbox_image)


def test_a_verifier_that_cannot_check_writes_no_reward(tmp_path: Path, sandbox_image: str) -> None:
    [path] = export_templates(tmp_path, ["count_errors"])
    checks = path / "tests" / "checks.json"
    checks.write_text(json.dumps({**json.loads(checks.read_text()), "checks": []}))
    [(reward, said)] = rewards([(load_task(path), True)], sandbox_image)
    assert reward is None, said
    assert "holds no check" in said


def test_the_exported_verifier_gives_up_on_a_probe_at_its_timeout(tmp_path: Path) -> None:
    """A probe past its time observed nothing, and neither it nor a daemon it left holding
    the output open keeps the verifier waiting."""
    started = time.monotonic()
    assert harbor_check.run(tmp_path, "echo early; sleep 30", 0.5, 100) is None
    assert harbor_check.run(tmp_path, "setsid sleep 8 & echo gone", 0.5, 100) is None
    assert time.monotonic() - started < 5
    assert harbor_check.run(tmp_path, "echo $HOME; pwd", 5, 100) == f"/tmp/checker\n{tmp_path}\n"
    assert harbor_check.run(tmp_path, "echo 123456789; echo 1", 5, 5) is None  # over the limit
