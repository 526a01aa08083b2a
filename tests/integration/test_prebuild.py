"""deploy/prebuild.sh: the SGLang venv and the images, built side by side under `make test`.

The real builders take minutes and are exercised by the tests that need their output
(through the same scripts, which wait on the builders' locks); here the script runs with
stand-in builders in a copy of deploy/, so what is checked is its own part: both run at
once, their output lands in the log, and a failure (but not a missing prerequisite) is
its exit status.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREBUILD = REPO / "deploy" / "prebuild.sh"

#: Each builder says it started, then waits (up to 20 s) for the other one to have started:
#: run one after the other, the first would time out and exit 9.
BUILDER = """#!/usr/bin/env bash
echo "{name} started"
touch "$(dirname "$0")/../{name}.started"
for _ in $(seq 200); do
  [ -f "$(dirname "$0")/../{other}.started" ] && {{ echo "{name} done"; exit {code}; }}
  sleep 0.1
done
echo "{name}: {other} never started" >&2
exit 9
"""


def _deploy(tmp_path: Path, sglang_code: int = 0, image_code: int = 0) -> Path:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy2(PREBUILD, deploy / "prebuild.sh")
    for folder, name, other, code in (
        ("sglang-cpu/build.sh", "sglang", "image", sglang_code),
        ("temper/build-offline.sh", "image", "sglang", image_code),
    ):
        script = deploy / folder
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(BUILDER.format(name=name, other=other, code=code))
        script.chmod(0o755)
    return deploy


def _run(deploy: Path, log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(deploy / "prebuild.sh"), str(log)], capture_output=True, text=True, timeout=60
    )


def test_both_builders_run_at_once_into_the_log(tmp_path: Path) -> None:
    log = tmp_path / "prebuild.log"
    done = _run(_deploy(tmp_path), log)
    assert done.returncode == 0, done.stderr + log.read_text()
    assert {"sglang done", "image done"} <= set(log.read_text().splitlines())


@pytest.mark.parametrize(
    ("sglang", "image", "failed"),
    [(1, 0, "sglang-cpu/build.sh"), (0, 1, "temper/build-offline.sh exited 1"), (0, 3, None)],
)
def test_a_failed_build_is_the_exit_status_and_a_missing_prerequisite_is_not(
    tmp_path: Path, sglang: int, image: int, failed: str | None
) -> None:
    done = _run(_deploy(tmp_path, sglang, image), tmp_path / "prebuild.log")
    if failed is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and failed in done.stderr, done.stderr


def test_bad_usage_is_named() -> None:
    done = subprocess.run([str(PREBUILD)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr
