"""Quarantine outcomes keyed by rollout id, the probe's trial, and the validator's infra
failures counted by the generator that made the rollout (pure bookkeeping)."""

from __future__ import annotations

import pytest

from protocol.messages import (
    ChatMessage,
    FailureKind,
    Rollout,
    RolloutStatus,
    ScoredRollout,
    ScoreStatus,
    Task,
    rollout_id,
)
from services.generator.scheduling.quarantine import (
    DomainState,
    Quarantine,
    QuarantineSettings,
    Window,
)
from services.generator.scheduling.scheduler import DomainScheduler, SchedulingSettings

SETTINGS = QuarantineSettings(
    window_s=100.0, min_samples=10, threshold=0.5, probe_after_s=10.0, max_probe_after_s=30.0
)


def feed(q: Quarantine, outcomes: str, start: float = 0.0, prefix: str = "r") -> float:
    """Record outcomes of domain ``d`` ('x' infra failure, '.' fine), rollout ``<prefix><i>``
    at ``start + i``; the last time."""
    for i, outcome in enumerate(outcomes):
        q.record("d", f"{prefix}{i}", infra_failure=outcome == "x", now=start + i)
    return start + len(outcomes) - 1


def held_until_probe(q: Quarantine, now: float) -> float:
    """Quarantine ``d`` at ``now``, let its probe start after 10 s; the probe's start."""
    feed(q, "x" * 10, start=now - 9, prefix="old")
    assert q.state("d") is DomainState.QUARANTINED
    assert q.allows("d", now + 10)
    return now + 10


# ---------------------------------------------------------------- keyed outcomes


def test_a_later_outcome_of_a_rollout_replaces_the_earlier_one() -> None:
    window = Window()
    window.put("a", failed=False, now=0.0)
    window.put("b", failed=False, now=1.0)
    window.put("a", failed=True, now=2.0)  # the validator's word on "a"
    assert len(window) == 2 and window.failures == 1
    window.put("a", failed=True, now=3.0)  # told twice: still one failure
    assert len(window) == 2 and window.failures == 1 and window.rate() == 0.5


def test_a_replaced_outcome_leaves_the_window_at_its_latest_time() -> None:
    window = Window()
    window.put("a", failed=False, now=0.0)
    window.put("b", failed=False, now=5.0)
    window.put("a", failed=True, now=10.0)
    window.expire(horizon=6.0)  # "b" goes; "a" was seen again at 10
    assert len(window) == 1 and window.failures == 1
    window.expire(horizon=11.0)
    assert len(window) == 0 and window.failures == 0 and window.rate() == 0.0


def test_the_window_holds_only_its_span_however_many_rollouts_passed() -> None:
    window = Window()
    for i in range(10_000):  # a rollout a second, each told twice, over 100 s windows
        window.put(f"r{i}", failed=False, now=float(i))
        window.put(f"r{i}", failed=True, now=float(i) + 0.5)
        window.expire(horizon=float(i) + 0.5 - 100.0)
    assert len(window) == 101 and window.failures == 101
    assert len(window._order) <= 2 * 101, "replaced observations expire too"


def test_the_validator_failing_fine_rollouts_quarantines_the_domain() -> None:
    """Four failures in ten is under the threshold; the validator failing one of the six
    fine ones makes it five in ten (counted again, not replaced, it would be 5 in 11)."""
    q = Quarantine(SETTINGS)
    now = feed(q, "xx..xx....")
    assert q.state("d") is DomainState.ACTIVE
    q.record("d", "r2", infra_failure=True, now=now + 1)
    assert q.state("d") is DomainState.QUARANTINED
    [held] = q.quarantined()
    assert held.failure_rate == pytest.approx(0.5)


# ---------------------------------------------------------------- the probe's trial


def test_the_validator_failing_the_probe_it_resumed_on_holds_the_domain_again() -> None:
    q = Quarantine(SETTINGS)
    probe = held_until_probe(q, 100.0)
    q.record("d", "probe", infra_failure=False, now=probe + 1)  # the generator: fine
    assert q.state("d") is DomainState.ACTIVE
    q.record("d", "probe", infra_failure=True, now=probe + 5)  # the validator: not
    assert q.state("d") is DomainState.QUARANTINED, "no 10 new samples needed"
    assert not q.allows("d", probe + 5 + 19)
    assert q.allows("d", probe + 5 + 20), "the wait doubled, as for a failed probe"


def test_a_validator_failure_while_probing_fails_the_probe() -> None:
    q = Quarantine(SETTINGS)
    probe = held_until_probe(q, 100.0)
    assert q.state("d") is DomainState.PROBING
    q.record("d", "old3", infra_failure=True, now=probe + 2)  # judged late, failed
    assert q.state("d") is DomainState.QUARANTINED
    assert not q.allows("d", probe + 2 + 19) and q.allows("d", probe + 2 + 20)


def test_on_trial_the_share_counts_from_the_first_sample() -> None:
    q = Quarantine(SETTINGS)
    probe = held_until_probe(q, 100.0)
    q.record("d", "probe", infra_failure=False, now=probe + 1)
    feed(q, "...x", start=probe + 2, prefix="new")  # one in five: below the threshold
    assert q.state("d") is DomainState.ACTIVE
    feed(q, "xx", start=probe + 6, prefix="more")  # three in seven: still below
    assert q.state("d") is DomainState.ACTIVE
    q.record("d", "new0", infra_failure=True, now=probe + 8)  # four in seven
    assert q.state("d") is DomainState.QUARANTINED


def test_the_trial_ends_with_the_window_and_the_floor_applies_again() -> None:
    q = Quarantine(SETTINGS)
    probe = held_until_probe(q, 100.0)
    q.record("d", "probe", infra_failure=False, now=probe + 1)
    q.record("d", "late", infra_failure=True, now=probe + 1 + 101)  # the probe has expired
    assert q.state("d") is DomainState.ACTIVE, "one failure of one, but under min_samples"


def test_a_trial_hold_doubles_the_wait_the_probe_had_up_to_the_cap() -> None:
    q = Quarantine(SETTINGS)
    probe = held_until_probe(q, 100.0)
    q.record("d", "p1", infra_failure=True, now=probe + 1)  # failed: next wait 20 s
    assert q.allows("d", probe + 21)
    q.record("d", "p2", infra_failure=False, now=probe + 22)
    q.record("d", "p2", infra_failure=True, now=probe + 23)
    assert not q.allows("d", probe + 23 + 29) and q.allows("d", probe + 23 + 30), "capped"


def test_an_operator_resume_sets_no_trial() -> None:
    q = Quarantine(SETTINGS)
    held_until_probe(q, 100.0)
    assert q.resume("d")
    q.record("d", "after", infra_failure=True, now=111.0)
    assert q.state("d") is DomainState.ACTIVE


# ---------------------------------------------------------------- the validator's reports

TASK = Task(id="t", domain="code", prompt=[ChatMessage(role="user", content="q")], n=4)


def made(index: int, generator: str = "gen-1", failure: FailureKind | None = None) -> Rollout:
    return Rollout(
        id=rollout_id(TASK.id, index, 0),
        task=TASK,
        sample_index=index,
        generator=generator,
        status=RolloutStatus.OK if failure is None else RolloutStatus.INFRA_FAILURE,
        failure=failure,
    )


def scored(rollout: Rollout, status: ScoreStatus = ScoreStatus.INFRA_FAILURE) -> ScoredRollout:
    return ScoredRollout(id=rollout.id, rollout=rollout, status=status, error="sandbox gone")


def scheduler(quarantine: bool = True) -> DomainScheduler:
    settings = SchedulingSettings(quarantine=quarantine, quarantine_min_samples=4)
    return DomainScheduler(settings, {}, clock=lambda: 50.0)


def test_the_validators_infra_failures_of_its_own_rollouts_quarantine_a_domain() -> None:
    s = scheduler()
    rollouts = [made(i) for i in range(4)]
    s.generated("code", rollouts)  # the generator: all four fine
    assert s.state("code") is DomainState.ACTIVE
    assert s.judged(scored(rollouts[0]), "gen-1") and s.judged(scored(rollouts[1]), "gen-1")
    assert s.state("code") is DomainState.QUARANTINED
    assert s.statistics()["validator_infra_failures"] == 2.0


def test_only_the_validators_own_infra_failures_of_this_instances_rollouts_count() -> None:
    s = scheduler()
    assert not s.judged(scored(made(0), ScoreStatus.SCORED), "gen-1")
    assert not s.judged(scored(made(1), ScoreStatus.INVALID), "gen-1")
    assert not s.judged(scored(made(2, generator="gen-2")), "gen-1"), "another's rollout"
    # A generation failure is passed on unjudged: counted (or not) by its generator.
    assert not s.judged(scored(made(3, failure=FailureKind.ENGINE)), "gen-1")
    assert not s.judged(scored(made(3, failure=FailureKind.TOOL)), "gen-1")
    assert s.statistics()["validator_infra_failures"] == 0.0


def test_with_quarantine_off_the_validators_reports_change_nothing() -> None:
    s = scheduler(quarantine=False)
    assert not s.judged(scored(made(0)), "gen-1")
