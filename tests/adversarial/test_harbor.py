"""Cheats against a Harbor task's verifier (exported terminal templates, Docker).

The verifier runs after the agent, in the agent's container: whatever the agent left in
``/logs/verifier`` is there when the verifier starts. A reward the agent planted must never
be read as the verifier's, whether the verifier then scores the work or cannot check at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from services.domains.harbor import load_task
from services.domains.harbor_export import export_templates
from tests.integration.harbor_run import outcome

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
