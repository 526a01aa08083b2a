"""The learner's checkpoints: the last K kept, each written durably, a damaged one skipped.

Files are ``checkpoints/v<version>.pt``: versions strictly increase across restarts, so
the name orders them even when a resumed learner re-runs step numbers it had reached
before.  A checkpoint is written to a temporary file, fsynced and renamed, so a kill
leaves either the old set or the new one.  A file that is truncated or corrupt anyway
(disk trouble, a copy cut short) is named in an error and the previous one is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.runtime.logs import get_logger

DIRECTORY = "checkpoints"
#: The single file older learners wrote; still read, as the oldest candidate.
LEGACY = "checkpoint.pt"
_NAME = re.compile(r"^v(\d+)\.pt$")
#: Keys every checkpoint must hold to resume from it.
REQUIRED = ("model", "optimizer", "step", "version")
_log = get_logger(component="checkpoints")


class CheckpointUnreadable(Exception):
    """A checkpoint file could not be loaded; the message names the file and the cause."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is unreadable: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Loaded:
    path: Path
    state: dict[str, Any]
    #: Newer checkpoints that were skipped as unreadable, newest first.
    skipped: tuple[CheckpointUnreadable, ...] = ()


class CheckpointStore:
    def __init__(self, out_dir: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.out_dir = out_dir
        self.directory = out_dir / DIRECTORY
        self.keep = keep

    def save(self, state: Mapping[str, Any], version: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"v{version:08d}.pt"
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            torch.save(dict(state), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.directory)
        self._prune()
        return path

    def candidates(self) -> list[Path]:
        """Checkpoint files, newest first (the legacy single file last)."""
        found: list[tuple[int, Path]] = []
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                match = _NAME.match(path.name)
                if match:
                    found.append((int(match.group(1)), path))
        ordered = [p for _, p in sorted(found, reverse=True)]
        legacy = self.out_dir / LEGACY
        return [*ordered, legacy] if legacy.is_file() else ordered

    def load_newest(self, device: torch.device) -> Loaded | None:
        """The newest readable checkpoint; None when there is none at all."""
        skipped: list[CheckpointUnreadable] = []
        for path in self.candidates():
            try:
                state = read(path, device)
            except CheckpointUnreadable as error:
                _log.error("checkpoint_unreadable", path=str(path), reason=error.reason)
                skipped.append(error)
                continue
            return Loaded(path=path, state=state, skipped=tuple(skipped))
        if skipped:
            _log.error("no_readable_checkpoint", tried=[str(e.path) for e in skipped])
        return None

    def _prune(self) -> None:
        for old in self.candidates()[self.keep :]:
            if old.parent == self.directory:
                old.unlink(missing_ok=True)


def read(path: Path, device: torch.device) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except Exception as error:  # torch.load fails in many ways; each means "unreadable"
        raise CheckpointUnreadable(path, f"{type(error).__name__}: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointUnreadable(path, f"holds a {type(state).__name__}, not a state dict")
    missing = [key for key in REQUIRED if key not in state]
    if missing:
        raise CheckpointUnreadable(path, f"missing {', '.join(missing)}")
    return state


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
