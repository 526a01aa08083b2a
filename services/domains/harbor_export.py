"""The built-in terminal templates written out as Harbor task folders.

One folder per template, named after it, with one task drawn from ``seed``::

    instruction.md           the template's prompt, and where the files are (/app)
    task.toml                limits of the sandbox's defaults; template, category, seed
    environment/Dockerfile   FROM the sandbox image; COPY files/ into /app
    environment/files/...    the files the task starts with, exactly
    solution/solve.sh        the template's reference commands, run in /app
    tests/test.sh            runs check.py over checks.json and writes the reward
    tests/check.py           services/domains/harbor_check.py (standard library only)
    tests/checks.json        the hidden checks with their expected values

The answer key (checks, expected values, the solution) is only under tests/ and
solution/, which Harbor copies in after the agent is done (or, for the oracle, instead
of it); environment/ and instruction.md hold what the policy may see and nothing else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Final

from services.domains import harbor_check
from services.domains.harbor import SANDBOX_IMAGE, base_allowed, base_refusal
from services.domains.terminal.base import Made
from services.domains.terminal.family import CATEGORIES, JUDGE_BASE_S, TEMPLATES

#: Where the task's files are and the agent works (Harbor's usual place).
WORKDIR: Final = "/app"
#: The sandbox image's user (deploy/sandbox/README.md), who owns the work directory.
SANDBOX_UID: Final = 10001
#: Each probe's time: a compile and a run (g++, node) on a busy machine.
PROBE_TIMEOUT_S: Final = 20.0
#: The most a probe's output or a read file may hold (the sandbox's default output limit).
OUTPUT_BYTES: Final = 1 << 20
#: The sandbox service's default session limits (services/sandbox/settings.py ``Limits``).
MEMORY_MB: Final = 512
STORAGE_MB: Final = 64
#: Eight turns of up to a 10 s command each, and the model's time between them.
AGENT_TIMEOUT_S: Final = 300.0
BUILD_TIMEOUT_S: Final = 600.0


class ExportError(ValueError):
    """The export cannot be done as asked (unknown template, folder in the way, base)."""


def made_for(name: str, seed: int) -> Made:
    """The task template ``name`` draws for ``seed`` (the same one every time)."""
    if name not in TEMPLATES:
        raise ExportError(
            f"unknown terminal template {name!r}; known: {', '.join(sorted(TEMPLATES))}"
        )
    return TEMPLATES[name](random.Random(f"harbor:{name}:{seed}"))


def export_templates(
    folder: Path, names: Sequence[str] = (), *, seed: int = 0, base: str = SANDBOX_IMAGE
) -> list[Path]:
    """Write templates ``names`` (all, when empty) as task folders under ``folder``; the
    folders written, in the order asked.  Nothing is written when any name is unknown or
    any task folder already exists."""
    chosen = list(dict.fromkeys(names)) or sorted(TEMPLATES)
    if not base_allowed(base, SANDBOX_IMAGE):
        raise ExportError(base_refusal(base, SANDBOX_IMAGE))
    made = {name: made_for(name, seed) for name in chosen}
    taken = [str(folder / name) for name in chosen if (folder / name).exists()]
    if taken:
        raise ExportError(f"task folders already exist: {', '.join(taken)}")
    return [write_task(folder / name, name, made[name], seed=seed, base=base) for name in chosen]


def write_task(path: Path, name: str, made: Made, *, seed: int, base: str) -> Path:
    """One template's task folder at ``path``."""
    _write(path / "instruction.md", instruction(made))
    _write(path / "task.toml", task_toml(name, seed))
    _write(path / "environment" / "Dockerfile", dockerfile(name, base))
    for relative, text in made.files.items():
        _write(path / "environment" / "files" / _safe(relative), text)
    _write(path / "solution" / "solve.sh", solve_script(name, made), executable=True)
    _write(path / "tests" / "test.sh", test_script(name), executable=True)
    _write(path / "tests" / "check.py", Path(harbor_check.__file__).read_text())
    _write(path / "tests" / "checks.json", checks_json(name, made))
    return path


def instruction(made: Made) -> str:
    return f"{made.prompt}\n\nThe task's files are in {WORKDIR}, where you work.\n"


def category_of(name: str) -> str:
    return next(group for group, templates in CATEGORIES.items() if name in templates)


def task_toml(name: str, seed: int) -> str:
    category = category_of(name)
    lines = [
        f"# Temper's terminal template {name} ({category}), drawn with seed {seed}.",
        'version = "1.0"',
        "",
        "[metadata]",
        'author_name = "Temper"',
        f"template = {json.dumps(name)}",
        f"category = {json.dumps(category)}",
        f"seed = {seed}",
        f'tags = ["terminal", {json.dumps(category)}]',
        "",
        "[verifier]",
        f"timeout_sec = {JUDGE_BASE_S}",
        "",
        "[agent]",
        f"timeout_sec = {AGENT_TIMEOUT_S}",
        "",
        "[environment]",
        f"build_timeout_sec = {BUILD_TIMEOUT_S}",
        "cpus = 1",
        f"memory_mb = {MEMORY_MB}",
        f"storage_mb = {STORAGE_MB}",
        "allow_internet = false",
    ]
    return "\n".join(lines) + "\n"


def dockerfile(name: str, base: str) -> str:
    uid = f"{SANDBOX_UID}:{SANDBOX_UID}"
    lines = [
        f"# The starting state of Temper's terminal template {name}: the task's files in",
        f"# {WORKDIR}, owned by the sandbox user (uid {SANDBOX_UID}), who works there.",
        f"FROM {base}",
        "USER root",
        f"RUN install -d -o {SANDBOX_UID} -g {SANDBOX_UID} {WORKDIR}",
        f"COPY --chown={uid} files/ {WORKDIR}/",
        f"USER {SANDBOX_UID}",
        f"WORKDIR {WORKDIR}",
    ]
    return "\n".join(lines) + "\n"


def solve_script(name: str, made: Made) -> str:
    head = [
        "#!/bin/bash",
        f"# The oracle of Temper's terminal template {name}: its reference commands, in",
        "# order, where the agent works.",
        f"cd {WORKDIR} || exit 1",
    ]
    return "\n".join([*head, *made.solution]) + "\n"


def test_script(name: str) -> str:
    lines = [
        "#!/bin/bash",
        f"# The hidden test of Temper's terminal template {name}: check.py observes {WORKDIR},",
        "# compares with the expected values in checks.json and writes the share of checks",
        "# passed. A check.py that fails writes nothing: the run is invalid, not a 0.",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "# A reward the agent planted is not this verifier's: only check.py's may be read.",
        "rm -f /logs/verifier/reward.txt /logs/verifier/reward.json",
        f'exec python3 "$here/check.py" "$here/checks.json" {WORKDIR} /logs/verifier/reward.txt',
    ]
    return "\n".join(lines) + "\n"


def checks_json(name: str, made: Made) -> str:
    checks = [
        {"name": c.name, "message": c.message, "probe": c.probe.to_metadata()} for c in made.checks
    ]
    spec = {
        "template": name,
        "timeout_s": PROBE_TIMEOUT_S,
        "output_bytes": OUTPUT_BYTES,
        "checks": checks,
    }
    return json.dumps(spec, indent=2) + "\n"


def _safe(relative: str) -> str:
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ExportError(f"a template file path must stay in the work directory: {relative!r}")
    return relative


def _write(path: Path, text: str, *, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())  # bytes: a CRLF file keeps its line endings
    # Explicit modes: a umask must not make a file private that a task expects readable.
    path.chmod(0o755 if executable else 0o644)
