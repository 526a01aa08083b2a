"""What the domains and the sandbox agree on about a Harbor task's image.

The build (services/domains/harbor_image.py) labels the image and checks its
``WORKDIR``; the sandbox (services/sandbox/images.py) runs only labelled images, with the
work directory a tmpfs mounted over that ``WORKDIR``.  Both read the rules here.
"""

from __future__ import annotations

import posixpath
from typing import Final

#: The label a Harbor task image carries: the hash of its build's inputs.
HARBOR_LABEL: Final = "org.temper.harbor.inputs"
#: Where Harbor's verifier finds its tests and writes its reward: a checker session's.
VERIFIER_MOUNTS: Final = ("/tests", "/logs")
#: A work directory is a tmpfs mounted over the image: never one of these, nor below one.
_SYSTEM: Final = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
    "/proc", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var", *VERIFIER_MOUNTS, "/solution",
)  # fmt: skip


def workdir_problem(workdir: str) -> str | None:
    """Why ``workdir`` cannot be a session's work directory, or None when it can."""
    if workdir.rstrip("/") == "":
        return "WORKDIR is / (the work directory is a tmpfs mounted over it)"
    if not workdir.startswith("/") or posixpath.normpath(workdir) != workdir.rstrip("/"):
        return f"WORKDIR {workdir!r} is not a plain absolute path"
    workdir = workdir.rstrip("/")
    for system in _SYSTEM:
        if workdir == system or workdir.startswith(system + "/"):
            return f"WORKDIR {workdir} is {system} or below it, which a tmpfs must not hide"
    return None
