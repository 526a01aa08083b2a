"""Images other than the configured one that the sandbox runs: Harbor task images.

A Harbor task's image (services/domains/harbor_image.py) is built ``FROM`` the sandbox
image, so it has the agent, its users and its languages, plus the task's files in its
``WORKDIR``.  The sandbox runs such an image only when it carries :data:`HARBOR_LABEL`
(set by that build, never by a registry pull here) and with the same hardening as the
default image: no network, read-only root, limits, the sandbox user.  Only the work
directory and ``/tmp`` are writable, as tmpfs mounts; the image's own work-directory
files are copied into that tmpfs when a session opens (the mount hides them), from
:func:`seed_archive`'s copy, made once per image.  A checker session on such an image
also gets ``/tests`` and ``/logs``, where Harbor's verifier expects them.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass
from typing import Any, Final

from services.domains.task_images import HARBOR_LABEL, VERIFIER_MOUNTS, workdir_problem

#: The agent's command with the image's work directory (the image's own CMD is ignored).
AGENT_ARGV: Final = ("python3", "/opt/temper/agent", "--socket", "/run/temper/agent.sock")
#: The configured image's work directory (deploy/sandbox/README.md).
DEFAULT_WORKDIR: Final = "/work"
#: The agent's own limit on an archive it extracts (services/sandbox/agent/files.py).
MAX_SEED_BYTES: Final = 40 * 1024 * 1024


class ImageRefused(Exception):
    """An image the sandbox will not run: not the configured one, no Harbor label, missing,
    or a work directory it cannot mount."""


@dataclass(frozen=True, kw_only=True)
class TaskImage:
    """An image a session asked for, as the engine described it when checked."""

    #: The name asked for, and the image id it named then (what the container runs).
    name: str
    id: str
    workdir: str
    #: The image's work-directory files as a tar.gz the agent extracts (empty: none).
    seed: bytes


def image_refusal(name: str, labels: dict[str, str] | None, workdir: str) -> str | None:
    """Why a session must not run image ``name`` (its labels and WORKDIR as inspected)."""
    if not (labels or {}).get(HARBOR_LABEL):
        return (
            f"image {name!r} is neither the sandbox's configured image nor a Harbor task "
            f"image (no {HARBOR_LABEL} label)"
        )
    problem = workdir_problem(workdir)
    return f"image {name!r}: {problem}" if problem else None


def task_image_config(
    config: dict[str, Any], image: TaskImage, *, checker: bool, disk_mb: int
) -> None:
    """Turn a container config of the configured image into one of ``image``: its id, the
    agent's command on the image's work directory (its own CMD and ENTRYPOINT ignored),
    the work-directory tmpfs there instead of ``/work``; a checker's also gets Harbor's
    verifier folders.  Every other setting (network, limits, user) stays as it is."""
    host = config["HostConfig"]
    mounts = dict(host["Tmpfs"])
    options = mounts.pop(DEFAULT_WORKDIR)
    mounts[image.workdir] = options
    if checker:
        base = options.rsplit(",size=", 1)[0]
        mounts.update({folder: f"{base},size={disk_mb}m" for folder in VERIFIER_MOUNTS})
    host["Tmpfs"] = mounts
    config.update(
        Image=image.id,
        Entrypoint=[],
        Cmd=[*AGENT_ARGV, "--workdir", image.workdir, "--container"],
        WorkingDir=image.workdir,
    )


def seed_archive(raw: tarfile.TarFile, workdir: str) -> bytes:
    """A Docker archive of ``workdir`` (its entries under the folder's own name) as the
    tar.gz the agent extracts: names relative to the work directory, hard links as the
    files they name; devices, FIFOs and the like left out (the agent refuses them)."""
    top = posixpath.basename(workdir.rstrip("/"))
    buffer = io.BytesIO()
    copied = 0
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as out:
        for member in raw.getmembers():
            relative = _relative(member.name, top)
            if relative is not None:
                copied += _copy_member(raw, out, member, relative)
    if buffer.tell() > MAX_SEED_BYTES:
        raise ImageRefused(
            f"the image's work directory {workdir} archives to {buffer.tell()} bytes, "
            f"over {MAX_SEED_BYTES}"
        )
    return buffer.getvalue() if copied else b""


def _relative(name: str, top: str) -> str | None:
    parts = posixpath.normpath(name).split("/")
    if parts[0] in (".", ""):
        parts = parts[1:]
    if not parts or parts[0] != top or len(parts) == 1 or ".." in parts:
        return None  # the folder itself, or not below it
    return "/".join(parts[1:])


def _copy_member(
    raw: tarfile.TarFile, out: tarfile.TarFile, member: tarfile.TarInfo, relative: str
) -> int:
    """1 when the member was copied, 0 when it is of a kind left out."""
    info = tarfile.TarInfo(relative)
    info.mode, info.mtime = member.mode, member.mtime
    if member.isdir():
        info.type = tarfile.DIRTYPE
        out.addfile(info)
    elif member.issym():
        info.type, info.linkname = tarfile.SYMTYPE, member.linkname
        out.addfile(info)
    elif member.isfile() or member.islnk():
        # A hard link's data is its target's: extractfile resolves it.
        handle = raw.extractfile(member)
        data = handle.read() if handle is not None else b""
        info.size = len(data)
        out.addfile(info, io.BytesIO(data))
    else:
        return 0
    return 1
