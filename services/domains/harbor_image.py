"""A Harbor task's image, built offline from its ``environment/`` folder.

``docker build --network none`` with ``environment/`` as the context, when every
``FROM`` of the Dockerfile names the sandbox image or a local image the caller allows by
name (an earlier stage's name too); any other base is refused naming the task and the
base, and nothing is pulled.  The tag is ``temper-harbor:<hash>``, the hash of the
build's inputs: every file of the context (its path, kind, executable bit and bytes:
the Dockerfile is one) and the id of each base image.  The image carries the hash in the
label the sandbox checks (:data:`~services.domains.task_images.HARBOR_LABEL`) and the task's
name in another.  When the tag exists, nothing is built: a second load costs one
``docker image inspect`` per base and one per task.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.domains.harbor import (
    DOCKERFILE,
    SANDBOX_IMAGE,
    HarborTask,
    HarborTaskError,
    base_allowed,
    base_refusal,
    dockerfile_base,
    dockerfile_instructions,
    is_sandbox_image,
)
from services.domains.task_images import HARBOR_LABEL, workdir_problem

REPOSITORY: Final = "temper-harbor"
TASK_LABEL: Final = "org.temper.harbor.task"
#: ``docker image inspect`` and the like: quick, but the engine may be busy building.
INSPECT_TIMEOUT_S: Final = 60.0
#: The sandbox agent, which every image the sandbox runs must hold.
AGENT_MAIN: Final = "/opt/temper/agent/__main__.py"


@dataclass(frozen=True, kw_only=True)
class TaskImage:
    """A task's image, ready in the local engine."""

    tag: str
    #: The hash of the build's inputs (the tag's and the label's).
    inputs: str
    #: The image's WORKDIR: the session's work directory.
    workdir: str
    #: Whether this call built it (False: the tag was there).
    built: bool


def ensure_image(
    task: HarborTask, *, sandbox_image: str = SANDBOX_IMAGE, local_images: Collection[str] = ()
) -> TaskImage:
    """The task's image, built when its tag is missing; :class:`HarborTaskError` says why not."""
    bases = dockerfile_bases(task.dockerfile)
    for base in bases:
        if not base_allowed(base, sandbox_image, local_images):
            raise HarborTaskError(task.path, base_refusal(base, sandbox_image, local_images))
    inputs = inputs_hash(task.environment, [_image_id(task, base) for base in bases])
    tag = f"{REPOSITORY}:{inputs[:16]}"
    built = _inspect(tag, "{{.Id}}") is None
    if built:
        _build(task, tag, inputs)
    workdir = _workdir(task, tag)
    if built and not all(is_sandbox_image(base) for base in bases):
        _require_agent(task, tag)
    return TaskImage(tag=tag, inputs=inputs, workdir=workdir, built=built)


def dockerfile_bases(text: str) -> list[str]:
    """The image each ``FROM`` starts from, in order, leaving out earlier stages' names
    (``ARG`` defaults declared before the first ``FROM`` substituted, as Docker does)."""
    global_args: list[str] = []
    stages: set[str] = set()
    bases: list[str] = []
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "ARG" and not bases and not stages:
            global_args.append(f"ARG {rest}")
        if keyword != "FROM":
            continue
        base = dockerfile_base("\n".join([*global_args, f"FROM {rest}"]))
        if base is not None and base not in stages:
            bases.append(base)
        words = [w for w in rest.split() if not w.startswith("--")]
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
    return bases


def inputs_hash(context: Path, base_ids: list[str]) -> str:
    """sha256 over each file of ``context`` (sorted; path, kind, executable bit, bytes or
    link target) and the base images' ids."""
    digest = hashlib.sha256()
    for relative, kind, data in _context_files(context):
        digest.update(f"{kind}\0{relative}\0{len(data)}\0".encode())
        digest.update(data)
    for base_id in base_ids:
        digest.update(f"base\0{base_id}\0".encode())
    return digest.hexdigest()


def _context_files(context: Path) -> Iterator[tuple[str, str, bytes]]:
    for top, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if (Path(top) / d).is_symlink()]):
            path = Path(top) / name
            relative = path.relative_to(context).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                yield relative, "link", os.readlink(path).encode()
            elif stat.S_ISREG(info.st_mode):
                kind = "exec" if info.st_mode & 0o111 else "file"
                yield relative, kind, path.read_bytes()


def _docker(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def _inspect(image: str, template: str) -> str | None:
    """``docker image inspect -f template image``, or None when there is no such image."""
    try:
        done = _docker(["image", "inspect", "-f", template, image], INSPECT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"docker image inspect {image}: {error}") from None
    return done.stdout.strip() if done.returncode == 0 else None


def _image_id(task: HarborTask, base: str) -> str:
    try:
        found = _inspect(base, "{{.Id}}")
    except RuntimeError as error:
        raise HarborTaskError(task.path, f"cannot reach the Docker engine: {error}") from None
    if found is None:
        where = "deploy/sandbox/build-offline.sh builds it" if is_sandbox_image(base) else ""
        raise HarborTaskError(
            task.path,
            f"the base image {base} is not on this machine"
            + (f" ({where})" if where else " (nothing is pulled)"),
        )
    return found


def _build(task: HarborTask, tag: str, inputs: str) -> None:
    # --force-rm: a failed step's container is removed too, not left stopped.
    argv = [
        "build", "--network", "none", "--quiet", "--pull=false", "--force-rm",
        "--label", f"{HARBOR_LABEL}={inputs}", "--label", f"{TASK_LABEL}={task.name}",
        "-t", tag, "-f", str(task.path / DOCKERFILE), str(task.environment),
    ]  # fmt: skip
    timeout_s = task.limits.build_timeout_s
    try:
        done = _docker(argv, timeout_s)
    except subprocess.TimeoutExpired:
        raise HarborTaskError(
            task.path, f"its image build took longer than build_timeout_sec ({timeout_s:g} s)"
        ) from None
    except OSError as error:
        raise HarborTaskError(task.path, f"cannot run docker build: {error}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-1500:]
        raise HarborTaskError(task.path, f"its image build failed: {said}")


def _workdir(task: HarborTask, tag: str) -> str:
    workdir = (_inspect(tag, "{{.Config.WorkingDir}}") or "").rstrip("/") or "/"
    problem = workdir_problem(workdir)
    if problem is not None:
        raise HarborTaskError(task.path, f"its image cannot be a sandbox: {problem}")
    return workdir


def _require_agent(task: HarborTask, tag: str) -> None:
    """A local base must itself come from the sandbox image: the sandbox's agent runs it."""
    check = f"import os, sys; sys.exit(0 if os.path.isfile({AGENT_MAIN!r}) else 3)"
    argv = ["run", "--rm", "--network", "none", "--entrypoint", "python3", tag, "-c", check]
    try:
        done = _docker(argv, INSPECT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HarborTaskError(task.path, f"cannot run its image: {error}") from None
    if done.returncode != 0:
        _docker(["image", "rm", tag], INSPECT_TIMEOUT_S)
        raise HarborTaskError(
            task.path,
            f"its image has no sandbox agent ({AGENT_MAIN} run by python3): a local base "
            "must be built FROM the sandbox image",
        )
