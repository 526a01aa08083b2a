"""The feeder's settings (``TEMPER_FEEDER_*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.runtime.settings import RuntimeSettings

#: What becomes of a problem whose whole group scored alike (a GRPO learner learns
#: nothing from it): ``count`` it only, ``skip`` it for the rest of the run, or draw it
#: again only ``later`` (after the next epoch of its domain).
Filter = Literal["count", "skip", "later"]


@dataclass(frozen=True, kw_only=True)
class FeederSettings:
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: The mix: ``name=weight`` entries (``name`` alone weighs 1).
    mix: tuple[str, ...] = ()
    #: Domain config file or folder; None: the built-in domains.
    domains_config: Path | None = None
    #: Where the cursor, the pools and the open tasks are kept across restarts.
    state_dir: Path = Path("feeder-state")
    #: Tasks outstanding at most (published, their group not yet all scored).
    in_flight: int = 32
    #: Samples per task; 0 keeps each domain's own group size.
    group: int = 0
    #: Distinct training problems per domain in its dataset (fewer when the domain has fewer).
    dataset_size: int = 2048
    seed: int = 0
    filter: Filter = "count"
    #: A problem whose last group passed at least this often is in the easy pool ...
    easy_at: float = 1.0
    #: ... and at most this often, in the hard pool; in between, the normal pool.
    hard_at: float = 0.0
    #: Chance that the cursor takes an easy (hard) problem when it comes to it; a normal
    #: one is always taken.  Passed-over problems come again in the next epoch.
    easy_take: float = 0.25
    hard_take: float = 0.5
    #: A task not done after this long (a sample dead-lettered) stops counting as in flight.
    give_up_s: float = 300.0
    #: A scored rollout taken but not acked (the feeder died) comes again after this long.
    ack_wait_s: float = 30.0
    #: How often the feeder tops the outstanding tasks up.
    top_up_s: float = 0.2
