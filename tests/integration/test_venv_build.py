"""deploy/venv/build.sh: the project's venv, copied from a dependency build cached by hash.

The venv these tests run in was made by it (``make venv``), so they check what it made: the
clone's scripts run the clone's interpreter, and the project imported is this clone's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "venv" / "build.sh"
VENV = Path(sys.prefix)


def _hash(script: Path, torch_version: str = "2.13.0") -> str:
    done = subprocess.run(
        [str(script), "--print-hash", torch_version],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.strip()


def test_the_cache_key_covers_pyproject_the_script_and_the_torch_version(tmp_path: Path) -> None:
    script = tmp_path / "deploy" / "venv" / "build.sh"
    script.parent.mkdir(parents=True)
    shutil.copy2(BUILD, script)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    first = _hash(script)
    assert len(first) == 16 and first == _hash(script)
    assert _hash(script, "2.12.0") != first
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "y"\n')
    second = _hash(script)
    assert second != first
    script.write_text(script.read_text() + "\n# changed\n")
    assert _hash(script) != second


def test_bad_usage_is_named() -> None:
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr


def test_the_clone_venv_runs_its_own_interpreter_and_this_clone() -> None:
    if not (VENV / "bin" / "pytest").is_file() or VENV == Path(sys.base_prefix):
        raise AssertionError(f"tests run outside the project's venv ({VENV}): run `make test`")
    for script in ("pytest", "temper"):
        first = (VENV / "bin" / script).read_text(errors="replace").splitlines()[0]
        assert first == f"#!{VENV}/bin/python", (script, first)
    found = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import services; print(services.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert Path(found.stdout.strip()).is_relative_to(REPO), found.stdout
