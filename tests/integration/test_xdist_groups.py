"""Under ``pytest -n`` the tests sharing a heavy resource reach one worker as one group.

pytest-xdist's ``--dist loadgroup`` groups by a suffix it adds to each test's id on the
worker; that broke silently once (a pytest release stopped reading the attribute it writes),
and every worker then launched its own CPU SGLang servers. This plans (runs nothing), on a
worker, tests of both groups and of none, and reads the ids the worker reports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDER = """
import os

def pytest_collection_finish(session):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with open(os.environ["GROUPS_OUT"], "a") as out:
            out.writelines(item.nodeid + "\\n" for item in session.items)
"""


def test_sglang_and_docker_tests_carry_their_group_on_the_worker(tmp_path: Path) -> None:
    (tmp_path / "groups_recorder.py").write_text(RECORDER)
    out = tmp_path / "ids.txt"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": path}
    files = ["test_generator_sglang.py", "test_sandbox_image.py", "test_client.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "groups_recorder", "-n", "1", "--dist"]
        + ["loadgroup", "--setup-plan", "-q", "-p", "no:cacheprovider"]
        + [f"tests/integration/{name}" for name in files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = out.read_text().splitlines()
    by_file = {name: [i for i in ids if f"/{name}::" in i] for name in files}
    assert all(by_file.values()), ids
    assert all(i.endswith("@sglang") for i in by_file["test_generator_sglang.py"]), ids
    assert all(i.endswith("@docker") for i in by_file["test_sandbox_image.py"]), ids
    assert not any("@" in i for i in by_file["test_client.py"]), ids
