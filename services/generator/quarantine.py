"""Flaky-domain quarantine: pause a domain whose infrastructure keeps failing.

Every finished rollout is an observation of its domain's infrastructure: an
``infra_failure`` counts against it, anything else (a right, wrong or invalid answer)
shows the sandbox and tools worked.  When, over the last ``window_s``, at least
``min_samples`` observations were made and the failure share reaches ``threshold``, the
domain is quarantined: its tasks are held in their stream (not failed, not dead-lettered)
while the rest of the stack keeps working.

After ``probe_after_s`` one task is let through as a probe.  If its first rollout comes
back without an infrastructure failure the domain resumes; if it fails, or no result
comes within the probe wait, the next probe waits twice as long, up to
``max_probe_after_s``.  An operator resumes a domain at once with
:meth:`Quarantine.resume` (``temper domain resume NAME``).

Pure bookkeeping over a caller-supplied clock: no I/O, no timers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class DomainState(StrEnum):
    ACTIVE = "active"
    QUARANTINED = "quarantined"
    #: Quarantined, with one probe task in flight.
    PROBING = "probing"


@dataclass(frozen=True, kw_only=True)
class QuarantineSettings:
    window_s: float = 300.0
    #: Observations needed in the window before a rate means anything.
    min_samples: int = 20
    #: Share of infrastructure failures that quarantines a domain.
    threshold: float = 0.5
    probe_after_s: float = 60.0
    max_probe_after_s: float = 900.0

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {self.min_samples}")
        if self.window_s <= 0 or self.probe_after_s <= 0:
            raise ValueError("window_s and probe_after_s must be positive")


@dataclass(frozen=True, kw_only=True)
class Quarantined:
    """Why and since when a domain is held."""

    domain: str
    since: float
    failure_rate: float
    next_probe_at: float
    probing: bool


@dataclass(kw_only=True)
class _Domain:
    seen: deque[tuple[float, bool]] = field(default_factory=deque)
    since: float | None = None
    failure_rate: float = 0.0
    next_probe_at: float = 0.0
    probe_wait_s: float = 0.0
    probing: bool = False
    probe_deadline: float = 0.0


class Quarantine:
    def __init__(self, settings: QuarantineSettings | None = None) -> None:
        self.settings = settings or QuarantineSettings()
        self._domains: dict[str, _Domain] = {}

    def _domain(self, name: str) -> _Domain:
        return self._domains.setdefault(name, _Domain())

    def record(self, domain: str, *, infra_failure: bool, now: float) -> None:
        """One finished rollout of ``domain``."""
        state = self._domain(domain)
        if state.since is not None:
            if state.probing:
                self._probed(domain, state, ok=not infra_failure, now=now)
            return  # late results of tasks started before the quarantine change nothing
        state.seen.append((now, infra_failure))
        self._expire(state, now)
        failures = sum(failed for _, failed in state.seen)
        if len(state.seen) >= self.settings.min_samples:
            rate = failures / len(state.seen)
            if rate >= self.settings.threshold:
                self._hold(state, rate, now)

    def _expire(self, state: _Domain, now: float) -> None:
        horizon = now - self.settings.window_s
        while state.seen and state.seen[0][0] < horizon:
            state.seen.popleft()

    def _hold(self, state: _Domain, rate: float, now: float) -> None:
        state.since = now
        state.failure_rate = rate
        state.probe_wait_s = self.settings.probe_after_s
        state.next_probe_at = now + state.probe_wait_s
        state.probing = False
        state.seen.clear()

    def _probed(self, domain: str, state: _Domain, *, ok: bool, now: float) -> None:
        if ok:
            self.resume(domain)
            return
        state.probing = False
        state.probe_wait_s = min(2 * state.probe_wait_s, self.settings.max_probe_after_s)
        state.next_probe_at = now + state.probe_wait_s

    def may_start(self, domain: str, now: float) -> bool:
        """Whether a task of ``domain`` may start now (for a quarantined one: its probe)."""
        state = self._domains.get(domain)
        if state is None or state.since is None:
            return True
        if state.probing and now >= state.probe_deadline:
            # The probe never reported (its generator died, say): it failed at its deadline.
            self._probed(domain, state, ok=False, now=state.probe_deadline)
        return not state.probing and now >= state.next_probe_at

    def started(self, domain: str, now: float) -> None:
        """A task of ``domain`` started; for a quarantined domain it is the probe, and no
        other task of it starts until the probe's result."""
        state = self._domains.get(domain)
        if state is None or state.since is None:
            return
        state.probing = True
        state.probe_deadline = now + state.probe_wait_s

    def allows(self, domain: str, now: float) -> bool:
        """:meth:`may_start`, and if so :meth:`started`."""
        if not self.may_start(domain, now):
            return False
        self.started(domain, now)
        return True

    def state(self, domain: str) -> DomainState:
        state = self._domains.get(domain)
        if state is None or state.since is None:
            return DomainState.ACTIVE
        return DomainState.PROBING if state.probing else DomainState.QUARANTINED

    def resume(self, domain: str) -> bool:
        """Lift the quarantine (a probe succeeded, or an operator said so); False if the
        domain was not quarantined."""
        state = self._domains.get(domain)
        if state is None or state.since is None:
            return False
        self._domains[domain] = _Domain()
        return True

    def quarantined(self) -> list[Quarantined]:
        return [
            Quarantined(
                domain=name,
                since=state.since,
                failure_rate=state.failure_rate,
                next_probe_at=state.next_probe_at,
                probing=state.probing,
            )
            for name, state in sorted(self._domains.items())
            if state.since is not None
        ]
