"""The ``harbor`` domain kind: a folder of Harbor tasks, trained on in their own images.

Parameters: ``path`` (the folder of tasks; relative to the config file that declares
it), ``allow_bases`` (local images a Dockerfile may start ``FROM`` besides the sandbox
image, by name), ``max_turns`` (16) and ``command_timeout_s`` (30: each command's time,
lowered to the task's agent timeout when that is shorter).

Loading checks every task (services/domains/harbor.py) and builds each one's image
offline (services/domains/harbor_image.py; nothing is built when the tag exists).  Each
task is one problem: its key is the folder's name and a hash of every file of the
folder, its prompt is ``instruction.md``, its rollout is multi-turn ``bash`` calls (as
the terminal family) in a sandbox session of the task's image with the limits of its
task.toml (``metadata.sandbox_image`` and ``sandbox_limits``), and its reference is the
oracle ``solution/solve.sh`` as one ``bash`` call.  The metadata names the task, never
its tests: ``tests/`` and ``solution/`` stay in the validator's process until the
``harbor`` validator copies ``tests/`` into a checker session of the task's image.
"""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from protocol.messages import SandboxLimits
from services.domains.api import Domain, DomainError, Problem, PromptFormat, ValidatorSpec
from services.domains.formats import tool_call_text
from services.domains.harbor import HarborTask, HarborTaskError, load_tasks
from services.domains.harbor_image import TaskImage, ensure_image, inputs_hash
from services.domains.params import Params
from services.domains.sandbox_place import SandboxPlace
from services.domains.terminal.family import JUDGE_PER_TURN_S, SYSTEM

TOOLS: Final = ("bash",)
#: ``Task.metadata`` key of the task's folder name (the validator finds it by key).
HARBOR_TASK: Final = "harbor_task"
#: The longest verifier run: the sandbox service's default maximum of an exec's time.
MAX_VERIFIER_S: Final = 120.0
#: The verifier's own time beyond the test: a session from the snapshot, the tests copied.
VERIFY_OVERHEAD_S: Final = 60.0
#: ``tests/`` travels as one exec's stdin: within the sandbox's 1 MiB request limit.
MAX_TESTS_BYTES: Final = 960 * 1024


@dataclass(frozen=True, kw_only=True)
class HarborProblem:
    """One task, ready: its image built, its tests archived for the verifier."""

    task: HarborTask
    key: str
    image: TaskImage
    #: ``tests/`` as a tar.gz, extracted at ``/tests`` in the verifier's session.
    tests: bytes
    #: The agent's session limits (each command's time included).
    limits: SandboxLimits

    def verifier_limits(self) -> SandboxLimits:
        """The verifier's session: the task's limits, ``bash /tests/test.sh`` timed by its
        ``[verifier] timeout_sec`` (at most :data:`MAX_VERIFIER_S`)."""
        limits = self.task.limits.verifier()
        timeout = min(limits.timeout_s or MAX_VERIFIER_S, MAX_VERIFIER_S)
        return SandboxLimits(
            timeout_s=timeout, cpus=limits.cpus, memory_mb=limits.memory_mb, disk_mb=limits.disk_mb
        )

    def problem(self) -> Problem:
        place = SandboxPlace(image=self.image.tag, limits=self.limits)
        return Problem(
            key=self.key,
            question=self.task.instruction,
            metadata={**place.metadata(), HARBOR_TASK: self.task.name},
            reference=oracle(self.task),
        )


@dataclass(frozen=True)
class HarborSource:
    problems: tuple[HarborProblem, ...]

    @cached_property
    def by_key(self) -> Mapping[str, HarborProblem]:
        return {p.key: p for p in self.problems}

    def draw(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems).problem()


def oracle(task: HarborTask) -> str:
    """``solution/solve.sh`` as the model would run it: one bash call, then a summary."""
    if task.solution is None:
        return ""
    script = task.solution.read_text(encoding="utf-8")
    return tool_call_text("bash", {"code": script}) + "\nDone."


def prepare(
    task: HarborTask, *, command_timeout_s: float, local_images: Collection[str] = ()
) -> HarborProblem:
    """The task with its image built and its tests archived; HarborTaskError says why not."""
    image = ensure_image(task, local_images=local_images)
    limits = task.limits.sandbox()
    timeout = min(command_timeout_s, task.limits.agent_timeout_s)
    return HarborProblem(
        task=task,
        key=f"harbor:{task.name}:{inputs_hash(task.path, [])[:16]}",
        image=image,
        tests=archive_tests(task),
        limits=SandboxLimits(
            timeout_s=timeout, cpus=limits.cpus, memory_mb=limits.memory_mb, disk_mb=limits.disk_mb
        ),
    )


def archive_tests(task: HarborTask) -> bytes:
    """``tests/`` as a tar.gz of names relative to it, owners and times left out."""

    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(task.tests.rglob("*")):
            relative = path.relative_to(task.tests).as_posix()
            tar.add(path, arcname=relative, recursive=False, filter=plain)
    data = buffer.getvalue()
    if len(data) > MAX_TESTS_BYTES:
        raise HarborTaskError(
            task.path, f"tests/ archives to {len(data)} bytes, over {MAX_TESTS_BYTES}"
        )
    return data


def domain(name: str, params: Mapping[str, Any]) -> Domain:
    read = Params(name, params)
    path = read.text("path", "")
    allowed = read.texts("allow_bases", ())
    max_turns = read.integer("max_turns", 16, 1, 64)
    command_timeout_s = read.number("command_timeout_s", 30.0, 1.0, 600.0)
    read.done()
    if not path:
        raise DomainError(name, "parameter 'path' (the folder of Harbor tasks) is required")
    try:
        tasks = load_tasks(Path(path), local_images=allowed)
        problems = tuple(
            prepare(t, command_timeout_s=command_timeout_s, local_images=allowed) for t in tasks
        )
    except DomainError as error:
        raise DomainError(name, error.message) from None
    slowest = max(p.verifier_limits().timeout_s or MAX_VERIFIER_S for p in problems)
    return Domain(
        name=name,
        kind="harbor",
        source=HarborSource(problems),
        prompt=PromptFormat(system=SYSTEM),
        tools=TOOLS,
        validators=(
            # A replay of every command (a rollout without its snapshot), then the test.
            ValidatorSpec(
                kind="harbor",
                name="verifier",
                params={"timeout_s": VERIFY_OVERHEAD_S + slowest + JUDGE_PER_TURN_S * max_turns},
            ),
        ),
        max_tokens=1024,
        max_turns=max_turns,
        description=f"Harbor tasks of {Path(path).name} ({len(problems)}) over bash calls",
    )
