"""Flaky-domain quarantine: pause a domain whose infrastructure keeps failing.

Every finished rollout is an observation of its domain's infrastructure: an
``infra_failure`` counts against it, anything else (a right, wrong or invalid answer)
shows the sandbox and tools worked.  Observations are kept per rollout id: a later one of
the same rollout replaces the earlier, so a rollout the generator finished cleanly and
the validator then failed to judge on its infrastructure (its unit-test sandbox, say)
counts once, as a failure.  When, over the last ``window_s``, at least ``min_samples``
rollouts were observed and the failure share reaches ``threshold``, the domain is
quarantined: its tasks are held in their stream (not failed, not dead-lettered) while the
rest of the stack keeps working.

After ``probe_after_s`` one task is let through as a probe.  If the first rollout
recorded while probing comes back without an infrastructure failure the domain resumes;
if it fails, or no result comes within the probe wait, the next probe waits twice as
long, up to ``max_probe_after_s``.  A domain resumed by a probe is on trial for one
window: its window starts with the probe's rollout and ``min_samples`` does not apply, so
as soon as the failure share reaches ``threshold`` (the validator failing the probe's own
rollout, say) it is held again with the doubled wait, as if the probe had failed.  An
operator resumes a domain at once and for good with :meth:`Quarantine.resume`
(``temper domain resume NAME``).

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


class Window:
    """The latest outcome of each rollout observed, and the count of failures among them.

    Outcomes leave by age: :meth:`expire` drops those recorded before a horizon.  A
    rollout observed again keeps only its latest outcome, at its latest time.
    """

    def __init__(self) -> None:
        self._latest: dict[str, tuple[float, bool]] = {}
        #: (time, rollout id) per observation, oldest first; a replaced one stays here
        #: until it expires, and is then skipped (at most one per later observation).
        self._order: deque[tuple[float, str]] = deque()
        self.failures = 0

    def __len__(self) -> int:
        return len(self._latest)

    def put(self, rollout: str, *, failed: bool, now: float) -> None:
        self._drop(rollout)
        self._latest[rollout] = (now, failed)
        self._order.append((now, rollout))
        self.failures += failed

    def expire(self, horizon: float) -> None:
        while self._order and self._order[0][0] < horizon:
            when, rollout = self._order.popleft()
            latest = self._latest.get(rollout)
            if latest is not None and latest[0] == when:
                self._drop(rollout)

    def rate(self) -> float:
        return self.failures / len(self._latest) if self._latest else 0.0

    def _drop(self, rollout: str) -> None:
        old = self._latest.pop(rollout, None)
        if old is not None:
            self.failures -= old[1]


@dataclass(kw_only=True)
class _Domain:
    seen: Window = field(default_factory=Window)
    since: float | None = None
    failure_rate: float = 0.0
    next_probe_at: float = 0.0
    probe_wait_s: float = 0.0
    probing: bool = False
    probe_deadline: float = 0.0
    #: Resumed by a probe: until then no ``min_samples`` floor, and a new hold starts
    #: from twice ``trial_wait_s`` (the wait before that probe).
    trial_until: float = 0.0
    trial_wait_s: float = 0.0


class Quarantine:
    def __init__(self, settings: QuarantineSettings | None = None) -> None:
        self.settings = settings or QuarantineSettings()
        self._domains: dict[str, _Domain] = {}

    def _domain(self, name: str) -> _Domain:
        return self._domains.setdefault(name, _Domain())

    def record(self, domain: str, rollout: str, *, infra_failure: bool, now: float) -> None:
        """An outcome of rollout ``rollout`` of ``domain``: the generator's when it
        finishes, or the validator's; it replaces an earlier one of the same rollout."""
        state = self._domain(domain)
        if state.since is not None:
            if state.probing and infra_failure:
                self._probe_failed(state, now)
            elif state.probing:
                self._probe_passed(domain, state, rollout, now)
            return  # late results of tasks started before the quarantine change nothing
        state.seen.put(rollout, failed=infra_failure, now=now)
        state.seen.expire(now - self.settings.window_s)
        on_trial = now < state.trial_until
        needed = 1 if on_trial else self.settings.min_samples
        rate = state.seen.rate()
        if len(state.seen) >= needed and rate >= self.settings.threshold:
            wait = self._longer(state.trial_wait_s) if on_trial else self.settings.probe_after_s
            self._hold(state, rate, wait, now)

    def _longer(self, wait_s: float) -> float:
        return min(2 * wait_s, self.settings.max_probe_after_s)

    def _hold(self, state: _Domain, rate: float, wait_s: float, now: float) -> None:
        state.since = now
        state.failure_rate = rate
        state.probe_wait_s = wait_s
        state.next_probe_at = now + wait_s
        state.probing = False
        state.trial_until = 0.0
        state.seen = Window()

    def _probe_passed(self, domain: str, state: _Domain, rollout: str, now: float) -> None:
        # The probe's rollout opens the new window, where a later outcome of it (the
        # validator's) can still take the domain back.
        resumed = _Domain(trial_until=now + self.settings.window_s, trial_wait_s=state.probe_wait_s)
        resumed.seen.put(rollout, failed=False, now=now)
        self._domains[domain] = resumed

    def _probe_failed(self, state: _Domain, now: float) -> None:
        state.probing = False
        state.probe_wait_s = self._longer(state.probe_wait_s)
        state.next_probe_at = now + state.probe_wait_s

    def may_start(self, domain: str, now: float) -> bool:
        """Whether a task of ``domain`` may start now (for a quarantined one: its probe)."""
        state = self._domains.get(domain)
        if state is None or state.since is None:
            return True
        if state.probing and now >= state.probe_deadline:
            # The probe never reported (its generator died, say): it failed at its deadline.
            self._probe_failed(state, state.probe_deadline)
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
        """Lift the quarantine (an operator said so), with no trial; False if the domain
        was not quarantined."""
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
