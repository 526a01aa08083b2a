"""What the feeder keeps across a restart: per domain its cursor, counts and pools, and the
tasks still open.

The file is replaced whole (write, then rename) after every change the feeder acts on, so
a ``kill -9`` leaves the last complete state.  A process death does not lose the page
cache, so no fsync: only a power loss could, and then NATS's own store is the larger loss.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

STATE_FILE = "feeder.json"


class Cursor(msgspec.Struct):
    """The next visit of a domain's dataset: ``index`` in epoch ``epoch``'s order."""

    epoch: int = 0
    index: int = 0


class DomainState(msgspec.Struct):
    cursor: Cursor = msgspec.field(default_factory=Cursor)
    #: Tasks published, and tasks whose whole group was scored.
    drawn: int = 0
    done: int = 0
    #: Groups whose rewards were all equal (no advantage for a GRPO learner).
    filtered: int = 0
    #: Visits of the cursor that did not publish, by reason (pool, skipped, later).
    passed_over: dict[str, int] = msgspec.field(default_factory=dict)
    #: Pass rate of each problem's last scored group (its pool follows from it).
    pass_rate: dict[str, float] = msgspec.field(default_factory=dict)
    #: Problems left out for the rest of the run (``filter = "skip"``).
    skipped: list[str] = msgspec.field(default_factory=list)
    #: Problem -> the first epoch it may be drawn again (``filter = "later"``).
    later: dict[str, int] = msgspec.field(default_factory=dict)


class OpenTask(msgspec.Struct):
    domain: str
    key: str
    group: int
    #: Wall-clock publication time: the give-up clock runs on across a restart.
    sent_at: float
    #: Reward of each scored sample by rollout id (a redelivery counts once); None: not
    #: scored (an infrastructure failure), which counts toward the group but not its rate.
    rewards: dict[str, float | None] = msgspec.field(default_factory=dict)


class FeederState(msgspec.Struct):
    #: Made once per state directory: task ids differ from another run's on the same NATS.
    run: str = msgspec.field(default_factory=lambda: secrets.token_hex(4))
    domains: dict[str, DomainState] = msgspec.field(default_factory=dict)
    open: dict[str, OpenTask] = msgspec.field(default_factory=dict)

    def domain(self, name: str) -> DomainState:
        return self.domains.setdefault(name, DomainState())


class StateStore:
    def __init__(self, folder: Path) -> None:
        self.path = folder / STATE_FILE

    def load(self) -> FeederState:
        """The saved state, or a fresh one when there is none yet."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return FeederState()
        try:
            return msgspec.json.decode(raw, type=FeederState)
        except msgspec.DecodeError as error:
            raise ValueError(f"{self.path}: not a feeder state file ({error})") from None

    def save(self, state: FeederState) -> None:
        self.write(msgspec.json.encode(state))

    def write(self, encoded: bytes) -> None:
        """Replace the file with ``encoded`` (one writer at a time: the partial file is shared)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_bytes(encoded)
        os.replace(partial, self.path)
