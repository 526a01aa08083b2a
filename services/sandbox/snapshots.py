"""Snapshots of session work directories, stored as files on a (shared) volume.

A multi-step task that fails can be retried or resumed from its last good state:
SandboxOpen with ``snapshot`` restores the archive into a fresh sandbox, on any
instance that sees the same directory.  Generators take one per turn boundary of a
multi-turn sample (checkpoints, preemption), so snapshots older than ``ttl_s`` are
removed, at most once every ``PRUNE_EVERY_S``, by the instance that saves one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
import uuid
from pathlib import Path

from protocol.errors import ErrorCode
from protocol.messages import SandboxSnapshot
from services.runtime.errors import RequestRejected

_ID = re.compile(r"^[0-9a-f]{32}$")
PRUNE_EVERY_S = 60.0


class SnapshotStore:
    def __init__(self, directory: Path, ttl_s: float = 86400.0) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._pruned_at = float("-inf")

    async def save(self, session: str, data: bytes) -> SandboxSnapshot:
        snapshot = uuid.uuid4().hex
        await asyncio.to_thread(self._write, self._path(snapshot), data)
        now = time.time()
        if now - self._pruned_at >= min(PRUNE_EVERY_S, self.ttl_s):
            self._pruned_at = now
            await asyncio.to_thread(self.prune, now)
        return SandboxSnapshot(
            snapshot=snapshot,
            session=session,
            size=len(data),
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            created_at=time.time(),
        )

    async def load(self, snapshot: str) -> bytes:
        if not _ID.match(snapshot):
            raise _unknown(snapshot)
        try:
            return await asyncio.to_thread(self._path(snapshot).read_bytes)
        except FileNotFoundError:
            raise _unknown(snapshot) from None

    def prune(self, now: float) -> int:
        """Remove snapshots older than ``ttl_s``; how many went."""
        removed = 0
        for path in self.directory.glob("*.tar.gz"):
            try:
                if now - path.stat().st_mtime > self.ttl_s:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # another instance pruned it first
        return removed

    def _path(self, snapshot: str) -> Path:
        return self.directory / f"{snapshot}.tar.gz"

    def _write(self, path: Path, data: bytes) -> None:
        """Written whole or not at all: a crash never leaves half a snapshot under its name."""
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(path)


def _unknown(snapshot: str) -> RequestRejected:
    return RequestRejected(
        ErrorCode.BAD_REQUEST, f"unknown snapshot {snapshot!r}", field="$.snapshot"
    )
