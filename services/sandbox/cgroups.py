"""Read a container's cgroup counters: OOM kills and pids-limit hits.

After an OOM inside an exec, Docker's ``State.OOMKilled`` stays false (only the
container's main process counts), so the kernel's own counters are the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Counters:
    oom_kills: int = 0
    pids_max_hits: int = 0


def _candidates(container_id: str, controller: str) -> list[Path]:
    return [
        ROOT / controller / "docker" / container_id,  # v1, cgroupfs driver
        ROOT / controller / "system.slice" / f"docker-{container_id}.scope",  # v1, systemd
        ROOT / "docker" / container_id,  # v2, cgroupfs driver
        ROOT / "system.slice" / f"docker-{container_id}.scope",  # v2, systemd
    ]


def _read_key(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def _first(container_id: str, controller: str, files: tuple[str, ...], key: str) -> int:
    for directory in _candidates(container_id, controller):
        for name in files:
            value = _read_key(directory / name, key)
            if value is not None:
                return value
    return 0


def read(container_id: str) -> Counters:
    """Counters of a running container; zeros where the cgroup files cannot be read."""
    return Counters(
        oom_kills=_first(
            container_id, "memory", ("memory.events", "memory.oom_control"), "oom_kill"
        ),
        pids_max_hits=_first(container_id, "pids", ("pids.events",), "max"),
    )
