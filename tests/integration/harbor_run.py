"""Run a Harbor task as Harbor does, in a container of the sandbox image (no task image).

A task's Dockerfile starts FROM the sandbox image; instead of building an image from it,
its instructions after FROM are applied to a fresh container of that image, in order:
``USER``, ``WORKDIR``, ``ENV``, shell-form ``RUN`` (``/bin/sh -c``, as the current user)
and ``COPY`` of build-context files (``--chown`` honoured; without it the copy is
root's, as in a build).  ``LABEL``, ``EXPOSE``, ``CMD`` and ``ENTRYPOINT`` change no file
and are skipped; anything else fails the test, so a task needing more is never judged on
a half-applied setup.  Then, as Harbor's trial does: ``solution/`` to ``/solution`` and
``bash /solution/solve.sh`` as the image's user in its work directory (the oracle), or
nothing (the untouched setup); ``tests/`` to ``/tests`` and ``bash /tests/test.sh`` as
root; the files of ``/logs/verifier`` read back and their reward taken by ``reward_of``.

Containers run with ``--network none`` and are removed after each task.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from services.domains.harbor import VERIFIER_DIR, HarborTask, dockerfile_instructions, reward_of

DOCKER_TIMEOUT_S = 90
#: Instructions that change no file of the image.
SKIPPED = frozenset({"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "STOPSIGNAL"})


def docker(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["docker", *args], input=stdin, capture_output=True, timeout=DOCKER_TIMEOUT_S
    )


def must(*args: str) -> bytes:
    done = docker(*args)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr.decode()[-2000:]}"
    return done.stdout


@dataclass
class Box:
    """One container, and the build state the Dockerfile's instructions leave."""

    name: str
    user: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)

    def exec(
        self, command: list[str], *, user: str, workdir: str
    ) -> subprocess.CompletedProcess[bytes]:
        flags = [f"--env={k}={v}" for k, v in self.env.items()]
        return docker("exec", "-u", user, "-w", workdir, *flags, self.name, *command)

    def root(self, script: str) -> None:
        done = self.exec(["/bin/sh", "-c", script], user="0", workdir="/")
        assert done.returncode == 0, f"{script}: {done.stderr.decode()[-2000:]}"

    def copy_in(self, source: Path, dest: str) -> None:
        """``source`` (a file, or a folder's contents) to ``dest`` in the container."""
        folder = dest if source.is_dir() else str(PurePosixPath(dest).parent)
        self.root(f"mkdir -p {shlex.quote(folder)}")
        must("cp", f"{source}/." if source.is_dir() else str(source), f"{self.name}:{dest}")

    def files(self, folder: str) -> dict[str, bytes]:
        """The regular files directly in ``folder`` by name; none when it does not exist."""
        done = docker("cp", f"{self.name}:{folder}/.", "-")
        if done.returncode != 0:
            return {}
        found = {}
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
            for member in archive.getmembers():
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None and "/" not in member.name.removeprefix("./"):
                    found[member.name.removeprefix("./")] = extracted.read()
        return found


@contextmanager
def box(image: str) -> Iterator[Box]:
    config = must("image", "inspect", "-f", "{{.Config.User}}|{{.Config.WorkingDir}}", image)
    user, workdir = config.decode().strip().split("|")
    name = f"harbor-run-{uuid.uuid4().hex[:12]}"
    try:
        # As root, running nothing but sleep: each step below says as whom it runs.
        must(
            "run", "-d", "--name", name, "--network", "none", "--memory", "1g",
            "--pids-limit", "256", "--user", "0", image, "sleep", "600",
        )  # fmt: skip
        yield Box(name=name, user=user or "0", workdir=workdir or "/")
    finally:
        docker("rm", "-f", name)


def apply(container: Box, task: HarborTask) -> None:
    """The Dockerfile's instructions after its first FROM, applied to ``container``."""
    seen_from = False
    for keyword, rest in dockerfile_instructions(task.dockerfile):
        if keyword == "FROM":
            assert not seen_from, f"{task.name}: a multi-stage Dockerfile is not applied here"
            seen_from = True
        elif keyword == "USER":
            container.user = rest
        elif keyword == "WORKDIR":
            container.workdir = str(PurePosixPath(container.workdir) / rest)
            container.root(f"mkdir -p {shlex.quote(container.workdir)}")
        elif keyword == "ENV":
            key, _, value = rest.replace("=", " ", 1).partition(" ")
            container.env[key] = value.strip().strip("\"'")
        elif keyword == "RUN":
            _run(container, task, rest)
        elif keyword in ("COPY", "ADD"):
            _copy(container, task, rest)
        else:
            assert keyword in SKIPPED, f"{task.name}: {keyword} is not applied here"


def _run(container: Box, task: HarborTask, command: str) -> None:
    assert not command.startswith("["), f"{task.name}: exec-form RUN is not applied here"
    done = container.exec(
        ["/bin/sh", "-c", command], user=container.user, workdir=container.workdir
    )
    assert done.returncode == 0, f"{task.name}: RUN {command}: {done.stderr.decode()[-2000:]}"


def _copy(container: Box, task: HarborTask, rest: str) -> None:
    words = shlex.split(rest)
    flags = {w.split("=", 1)[0]: w.split("=", 1)[-1] for w in words if w.startswith("--")}
    assert set(flags) <= {"--chown"}, f"{task.name}: COPY {rest}: flags are not applied here"
    *sources, dest = [w for w in words if not w.startswith("--")]
    target = PurePosixPath(container.workdir) / dest
    owner = flags.get("--chown", "0:0")
    for source in sources:
        local = task.environment / source
        assert local.resolve().is_relative_to(task.environment.resolve()), source
        into_folder = local.is_dir() or dest.endswith("/") or len(sources) > 1
        where = target if local.is_dir() or not into_folder else target / local.name
        container.copy_in(local, str(where))
        container.root(f"chown -R {shlex.quote(owner)} {shlex.quote(str(where))}")


def outcome(
    task: HarborTask, image: str, *, solved: bool, agent: str = ""
) -> tuple[float | None, str]:
    """The reward the task's verifier gives (None: it wrote none), and what it printed;
    ``agent``: a bash script run first as the agent, where the agent works."""
    with box(image) as container:
        apply(container, task)
        if agent:
            # Harbor's agent can often write /logs (it commonly runs as root): the worst case.
            container.root(f"mkdir -p {VERIFIER_DIR} && chmod 1777 {VERIFIER_DIR}")
            container.exec(["bash", "-c", agent], user=container.user, workdir=container.workdir)
        if solved:
            assert task.solution is not None, f"{task.name} has no solution"
            container.copy_in(task.solution.parent, "/solution")
            oracle = container.exec(
                ["bash", "/solution/solve.sh"], user=container.user, workdir=container.workdir
            )
            assert oracle.returncode == 0, f"{task.name}: {oracle.stderr.decode()[-2000:]}"
        container.copy_in(task.tests, "/tests")
        test = container.exec(["bash", "/tests/test.sh"], user="0", workdir=container.workdir)
        said = (test.stdout + test.stderr).decode(errors="replace")
        return reward_of(container.files(VERIFIER_DIR)), said
