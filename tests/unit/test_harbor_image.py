"""A Harbor task image's inputs, bases and work directory, without Docker; and the archive
of an image's work directory that seeds a session (services/sandbox/images.py)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from services.domains.harbor_image import dockerfile_bases, inputs_hash
from services.sandbox.images import HARBOR_LABEL, image_refusal, seed_archive, workdir_problem

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "harbor" / "fix-word-count"


def test_every_from_is_a_base_except_an_earlier_stage() -> None:
    text = (
        "ARG TAG=latest\n"
        "FROM --platform=linux/amd64 temper-sandbox:${TAG} AS build\n"
        "ARG LATER=nope\n"
        "RUN true\n"
        "FROM build\n"
        "from local/tools:1 as tools\n"
        "FROM tools\n"
    )
    assert dockerfile_bases(text) == ["temper-sandbox:latest", "local/tools:1"]
    assert dockerfile_bases("# nothing\n") == []


def _copy(tmp_path: Path) -> Path:
    context = tmp_path / "environment"
    shutil.copytree(FIXTURE / "environment", context, symlinks=True)
    return context


def test_the_inputs_hash_covers_every_file_its_mode_and_the_base(tmp_path: Path) -> None:
    context = _copy(tmp_path)
    first = inputs_hash(context, ["sha256:aa"])
    assert inputs_hash(context, ["sha256:aa"]) == first
    assert inputs_hash(context, ["sha256:bb"]) != first
    script = context / "wordcount.sh"
    script.chmod(0o755)
    executable = inputs_hash(context, ["sha256:aa"])
    assert executable != first
    (context / "notes").mkdir()
    (context / "notes" / "a.txt").write_text("x")
    assert inputs_hash(context, ["sha256:aa"]) != executable
    (context / "notes" / "a.txt").unlink()
    os.symlink("wordcount.sh", context / "notes" / "a.txt")
    linked = inputs_hash(context, ["sha256:aa"])
    assert linked != executable
    (context / "Dockerfile").write_text((context / "Dockerfile").read_text() + "# more\n")
    assert inputs_hash(context, ["sha256:aa"]) != linked


@pytest.mark.parametrize(
    ("workdir", "problem"),
    [
        ("/app", None),
        ("/srv/task/", None),
        ("/work", None),
        ("/", "WORKDIR is /"),
        ("", "WORKDIR is /"),
        ("app", "not a plain absolute path"),
        ("/app/../etc", "not a plain absolute path"),
        ("/usr/src/app", "/usr or below it"),
        ("/tmp", "/tmp or below it"),
        ("/tests", "/tests or below it"),
        ("/logs/verifier", "/logs or below it"),
        ("/run", "/run or below it"),
    ],
)
def test_a_work_directory_never_hides_a_system_folder(workdir: str, problem: str | None) -> None:
    found = workdir_problem(workdir)
    assert found == problem if problem is None else problem in (found or "")


def test_an_image_without_the_harbor_label_is_refused_by_name() -> None:
    said = image_refusal("ubuntu:22.04", {"maintainer": "x"}, "/app")
    assert said is not None and "'ubuntu:22.04'" in said and HARBOR_LABEL in said
    assert image_refusal("temper-harbor:1", {HARBOR_LABEL: "abc"}, "/app") is None
    usr = image_refusal("temper-harbor:1", {HARBOR_LABEL: "abc"}, "/usr")
    assert usr is not None and "'temper-harbor:1'" in usr and "/usr" in usr


def _docker_archive() -> tarfile.TarFile:
    """What the engine's archive of /app looks like: entries under ``app/``, a hard link."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data, mode in [
            ("app", tarfile.DIRTYPE, b"", 0o755),
            ("app/run.sh", tarfile.REGTYPE, b"#!/bin/sh\necho hi\n", 0o755),
            ("app/sub", tarfile.DIRTYPE, b"", 0o700),
            ("app/sub/data.txt", tarfile.REGTYPE, b"data", 0o644),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mode = kind, len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("app/same.txt")
        link.type, link.linkname = tarfile.LNKTYPE, "app/sub/data.txt"
        tar.addfile(link)
        symlink = tarfile.TarInfo("app/latest")
        symlink.type, symlink.linkname = tarfile.SYMTYPE, "sub/data.txt"
        tar.addfile(symlink)
        fifo = tarfile.TarInfo("app/pipe")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r")


def test_the_seed_is_the_work_directory_relative_with_hard_links_as_files() -> None:
    seed = seed_archive(_docker_archive(), "/app")
    with tarfile.open(fileobj=io.BytesIO(seed), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["latest", "run.sh", "same.txt", "sub", "sub/data.txt"]
        assert members["run.sh"].mode == 0o755 and members["sub"].mode == 0o700
        assert members["same.txt"].isfile()
        handle = tar.extractfile(members["same.txt"])
        assert handle is not None and handle.read() == b"data"
        assert members["latest"].issym() and members["latest"].linkname == "sub/data.txt"


def test_an_empty_work_directory_seeds_nothing() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("app")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    buffer.seek(0)
    assert seed_archive(tarfile.open(fileobj=buffer, mode="r"), "/app") == b""
