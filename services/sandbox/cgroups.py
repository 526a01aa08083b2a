"""Read a container's cgroup counters: OOM kills and pids-limit hits.

After an OOM inside an exec, Docker's ``State.OOMKilled`` stays false (only the
container's main process counts), so the kernel's own counters are the truth.
The files holding them are looked for once per container (``locate``): they are read
after every exec, and the search tries several cgroup layouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: The counter files hold a few short lines.
READ_BYTES = 4096


@dataclass(frozen=True)
class Counters:
    oom_kills: int = 0
    pids_max_hits: int = 0


@dataclass(frozen=True)
class Counter:
    """One counter: the line ``key N`` of the file ``path``."""

    path: str
    key: bytes

    def value(self) -> int | None:
        """None when the file cannot be read or no longer holds the key."""
        try:
            # os-level calls: about half the cost of open(), and this runs after every exec.
            fd = os.open(self.path, os.O_RDONLY)
            try:
                text = os.read(fd, READ_BYTES)
            finally:
                os.close(fd)
        except OSError:
            return None
        for line in text.splitlines():
            name, _, value = line.partition(b" ")
            if name == self.key:
                return int(value)
        return None


@dataclass(frozen=True)
class Sources:
    """Where a container's counters are read; None where no layout has them."""

    oom_kills: Counter | None
    pids_max_hits: Counter | None

    def read(self) -> Counters:
        """The counters now; zeros where they cannot be read."""
        return Counters(oom_kills=_value(self.oom_kills), pids_max_hits=_value(self.pids_max_hits))


def _value(counter: Counter | None) -> int:
    value = counter.value() if counter is not None else None
    return value or 0


def _candidates(container_id: str, controller: str) -> list[Path]:
    return [
        ROOT / controller / "docker" / container_id,  # v1, cgroupfs driver
        ROOT / controller / "system.slice" / f"docker-{container_id}.scope",  # v1, systemd
        ROOT / "docker" / container_id,  # v2, cgroupfs driver
        ROOT / "system.slice" / f"docker-{container_id}.scope",  # v2, systemd
    ]


def _find(container_id: str, controller: str, files: tuple[str, ...], key: bytes) -> Counter | None:
    for directory in _candidates(container_id, controller):
        for name in files:
            counter = Counter(str(directory / name), key)
            if counter.value() is not None:
                return counter
    return None


def locate(container_id: str) -> Sources:
    """The counter files of a running container (its cgroup exists once it started)."""
    return Sources(
        oom_kills=_find(
            container_id, "memory", ("memory.events", "memory.oom_control"), b"oom_kill"
        ),
        pids_max_hits=_find(container_id, "pids", ("pids.events",), b"max"),
    )
