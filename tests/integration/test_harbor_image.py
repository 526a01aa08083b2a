"""Harbor task images built offline by the real Docker engine (services/domains/harbor_image.py).

Each test that builds a new image gives its task a file of its own, so the tag is new
and the build real, and removes the image after.  Skips without Docker, unless CI=true
or TEMPER_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from services.domains.harbor import HarborTask, HarborTaskError, load_task
from services.domains.harbor_image import TASK_LABEL, ensure_image, inputs_hash
from services.sandbox.images import HARBOR_LABEL

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


def inspect(image: str, template: str) -> str:
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", template, image], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def remove(*images: str) -> None:
    for image in images:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)


@pytest.fixture
def fresh_task(tmp_path: Path, sandbox_image: str) -> Path:
    """A copy of fix-word-count with a file no other build had: its tag is new."""
    path = tmp_path / "fix-word-count"
    shutil.copytree(FIXTURES / "fix-word-count", path)
    (path / "environment" / "nonce.txt").write_text(uuid.uuid4().hex)
    return path


def test_a_task_image_is_built_labelled_and_reused(fresh_task: Path) -> None:
    made: list[str] = []
    try:
        first = ensure_image(load_task(fresh_task))
        made.append(first.tag)
        assert first.built and first.tag == f"temper-harbor:{first.inputs[:16]}"
        assert first.workdir == "/app"
        assert inspect(first.tag, f'{{{{index .Config.Labels "{HARBOR_LABEL}"}}}}') == first.inputs
        assert inspect(first.tag, f'{{{{index .Config.Labels "{TASK_LABEL}"}}}}') == (
            "fix-word-count"
        )
        # A second load finds the tag and builds nothing.
        again = ensure_image(load_task(fresh_task))
        assert (again.tag, again.built) == (first.tag, False)
        # Any change to the context is a new image.
        (fresh_task / "environment" / "nonce.txt").write_text("changed")
        changed = ensure_image(load_task(fresh_task))
        made.append(changed.tag)
        assert changed.built and changed.tag != first.tag
    finally:
        remove(*made)


def test_the_build_runs_without_a_network(fresh_task: Path) -> None:
    """Each RUN of the build joins Docker's ``none`` network and no other (a build without
    ``--network none`` joins none at all here: this engine has no bridge)."""
    dockerfile = fresh_task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN ls /sys/class/net > /tmp/interfaces\n")
    since = str(int(time.time()) - 1)
    image = ensure_image(load_task(fresh_task))
    try:
        assert image.built
        events = subprocess.run(
            ["docker", "events", "--since", since, "--until", str(int(time.time()) + 1),
             "--filter", "type=network", "--filter", "event=connect",
             "--format", "{{.Actor.Attributes.name}}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        joined = events.stdout.split()
        assert joined and set(joined) == {"none"}, events.stdout
    finally:
        remove(image.tag)


def test_a_later_stage_from_a_foreign_image_is_refused_naming_it(fresh_task: Path) -> None:
    dockerfile = fresh_task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "FROM debian:bookworm AS other\n")
    with pytest.raises(HarborTaskError) as refused:
        ensure_image(load_task(fresh_task))
    said = str(refused.value)
    assert str(fresh_task) in said and "FROM debian:bookworm" in said


def test_a_work_directory_over_a_system_folder_is_refused(fresh_task: Path) -> None:
    dockerfile = fresh_task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "WORKDIR /usr/local\n")
    task = load_task(fresh_task)
    try:
        with pytest.raises(HarborTaskError, match="WORKDIR /usr/local is /usr or below it"):
            ensure_image(task)
    finally:
        remove(tag_of(task, "temper-sandbox:latest"))


def test_a_local_base_without_the_agent_is_refused(
    fresh_task: Path, tmp_path: Path, sandbox_image: str
) -> None:
    """A local image allowed by name, but not made from the sandbox image: no agent."""
    local = f"temper-harbor-test-base:{uuid.uuid4().hex[:8]}"
    context = tmp_path / "base"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {sandbox_image}\nUSER root\nRUN rm -rf /opt/temper/agent\nUSER 10001\n"
    )
    build = subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", local, str(context)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    dockerfile = fresh_task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("temper-sandbox:latest", local))
    try:
        with pytest.raises(HarborTaskError) as unlisted:
            load_task(fresh_task)
        assert local in str(unlisted.value)
        task = load_task(fresh_task, local_images=[local])
        with pytest.raises(HarborTaskError, match="has no sandbox agent") as refused:
            ensure_image(task, local_images=[local])
        assert str(fresh_task) in str(refused.value)
        # The refused image is removed; the base stays.
        gone = subprocess.run(
            ["docker", "image", "inspect", tag_of(task, local)], capture_output=True
        )
        assert gone.returncode != 0 and inspect(local, "{{.Id}}")
    finally:
        remove(local)


def tag_of(task: HarborTask, base: str) -> str:
    return f"temper-harbor:{inputs_hash(task.environment, [inspect(base, '{{.Id}}')])[:16]}"
