"""Weighted fair share between domains and between the tenants of a domain, and
flaky-domain quarantine (pure bookkeeping)."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from protocol import SubjectError
from services.generator.scheduling.fairshare import FairShare, Flow
from services.generator.scheduling.quarantine import DomainState, Quarantine, QuarantineSettings


def flow(label: str) -> Flow:
    """``"d"``: domain d's default tenant; ``"d/t"``: its tenant t (as ``str(Flow)``)."""
    domain, _, tenant = label.partition("/")
    return Flow(domain, tenant)


def run(share: FairShare, queues: dict[str, int], starts: int) -> Counter[str]:
    """Start ``starts`` tasks from queues of the given lengths; starts per flow label."""
    left = {flow(label): count for label, count in queues.items()}
    got: Counter[str] = Counter()
    for _ in range(starts):
        backlogged = [f for f, n in left.items() if n > 0]
        chosen = share.pick(backlogged)
        if chosen is None:
            break
        share.started(chosen, backlogged)
        left[chosen] -= 1
        got[str(chosen)] += 1
    return got


def test_a_ten_to_one_flood_leaves_the_other_domain_its_half() -> None:
    got = run(FairShare(), {"flood": 10_000, "quiet": 1_000}, starts=2_000)
    assert got == {"flood": 1_000, "quiet": 1_000}


def test_weights_set_the_shares() -> None:
    got = run(FairShare({"a": 3.0, "b": 1.0}), {"a": 10_000, "b": 10_000}, starts=400)
    assert got == {"a": 300, "b": 100}


def test_min_share_lifts_a_tiny_weight_to_its_floor() -> None:
    weights = {f"big{i}": 1.0 for i in range(9)} | {"tiny": 0.001}
    queues = dict.fromkeys(weights, 10_000)
    plain = run(FairShare(weights), queues, starts=1_000)
    floored = run(FairShare(weights, min_share=0.05), queues, starts=1_000)
    assert plain["tiny"] <= 1
    # 5% of the backlogged keys' total weight (9.001): about 0.45 against 1 each.
    assert 40 <= floored["tiny"] <= 60


def test_an_idle_domain_rejoins_without_a_saved_up_burst() -> None:
    share = FairShare()
    run(share, {"busy": 10_000}, starts=500)
    # "late" never ran: with its clock at 0 it would take the next 500 starts in a row.
    got = run(share, {"busy": 10_000, "late": 10_000}, starts=100)
    assert got == {"busy": 50, "late": 50}


def test_weight_change_applies_to_the_next_starts() -> None:
    share = FairShare()
    run(share, {"a": 10_000, "b": 10_000}, starts=100)
    share.set_weight("b", 4.0)
    got = run(share, {"a": 10_000, "b": 10_000}, starts=100)
    assert got == {"a": 20, "b": 80}
    assert share.statistics().started == {Flow("a"): 70, Flow("b"): 130}


def test_nothing_backlogged_picks_nothing_and_bad_weights_are_named() -> None:
    assert FairShare().pick([]) is None
    with pytest.raises(ValueError, match="weight of 'x' must be positive"):
        FairShare({"x": 0.0})
    with pytest.raises(ValueError, match="min_share"):
        FairShare(min_share=1.0)


# ---------------------------------------------------------------- tenants


@pytest.mark.parametrize("flood", ["maths/a", "maths"], ids=["named", "default"])
def test_a_ten_to_one_tenant_flood_leaves_the_other_tenant_its_half(flood: str) -> None:
    """Two tenants of one domain (the flood a named or the default tenant) share it
    equally while both wait, as two domains would."""
    got = run(FairShare(), {flood: 10_000, "maths/b": 1_000}, starts=2_000)
    assert got == {flood: 1_000, "maths/b": 1_000}


def test_tenants_split_their_domain_and_the_domains_keep_their_shares() -> None:
    queues = {"x/a": 10_000, "x/b": 1_000, "y/a": 10_000, "y/b": 1_000}
    got = run(FairShare({"x": 3.0, "y": 1.0}), queues, starts=800)
    assert got == {"x/a": 300, "x/b": 300, "y/a": 100, "y/b": 100}
    # However many tenants a domain has, the domains share the tier by weight.
    got = run(FairShare(), {"x/a": 10_000, "x/b": 10_000, "x/c": 10_000, "y": 10_000}, 600)
    assert got == {"x/a": 100, "x/b": 100, "x/c": 100, "y": 300}


def test_a_tenant_that_stops_waiting_leaves_its_part_to_its_domain() -> None:
    got = run(FairShare(), {"x/a": 100, "x/b": 10_000, "y": 10_000}, starts=1_000)
    # A quarter each to x/a and x/b while x/a waits (400 starts), then half to x/b.
    assert got["x/a"] == 100 and abs(got["x/b"] - 400) <= 2
    assert abs(got["x/a"] + got["x/b"] - got["y"]) <= 4, "x keeps its half"


def test_min_share_is_a_floor_for_each_tenant() -> None:
    weights = {"big": 1.0, "tiny": 0.001}
    queues = {"big": 10_000, "tiny/a": 10_000, "tiny/b": 10_000}
    plain = run(FairShare(weights), queues, starts=1_000)
    floored = run(FairShare(weights, min_share=0.05), queues, starts=1_000)
    assert plain["tiny/a"] <= 1 and plain["tiny/b"] <= 1
    # Each tenant: 5% of the flows' total (1.001), against big's 1.
    assert 40 <= floored["tiny/a"] <= 60 and 40 <= floored["tiny/b"] <= 60


def test_each_flow_has_its_own_valid_durable() -> None:
    from services.generator.scheduling.intake import MAX_DURABLE_LEN, flow_durable

    assert flow_durable(Flow("maths")) == "generator-maths", "as before tenants"
    assert flow_durable(Flow("maths", "acme")) == "generator-maths~acme"
    flows = [
        Flow("a-b", "c"),
        Flow("a", "b-c"),
        Flow("a", "b"),
        Flow("a-b"),
        Flow("d" * 128, "t" * 128),
        Flow("d" * 128, "t" * 127 + "u"),
        Flow("d" * 128, "t"),
    ]
    names = [flow_durable(f) for f in flows]
    assert len(set(names)) == len(names)
    for name in names:
        # The server refuses these in a consumer name; it becomes a subject token.
        assert len(name) <= MAX_DURABLE_LEN and not set(name) & set(" .*>/\\")
    with pytest.raises(SubjectError, match=r"tenant 'a\.b'"):
        flow_durable(Flow("maths", "a.b"))


def test_domain_status_counts_each_tenant_of_a_domain_with_tenants() -> None:
    from services.generator.scheduling.scheduler import DomainScheduler, SchedulingSettings

    scheduler = DomainScheduler(SchedulingSettings(), {})
    for label in ("x", "x/acme", "x/acme", "y"):
        scheduler.share.started(flow(label))
        scheduler.started(flow(label))
    scheduler.finished(Flow("x", "acme"))
    x, y = scheduler.schedules()
    assert (x.domain, x.started, x.in_flight) == ("x", 3, 2)
    tenants = [(t.tenant, t.started, t.in_flight) for t in x.tenants]
    assert tenants == [("", 1, 1), ("acme", 2, 1)]
    assert (y.domain, y.started, y.in_flight, y.tenants) == ("y", 1, 1, [])
    assert scheduler.in_flight() == "x:2,y:1"


# ---------------------------------------------------------------- quarantine

SETTINGS = QuarantineSettings(
    window_s=100.0, min_samples=10, threshold=0.5, probe_after_s=10.0, max_probe_after_s=30.0
)


def feed(q: Quarantine, domain: str, outcomes: str, start: float = 0.0) -> float:
    """Record outcomes ('x' infra failure, '.' fine), one per second; the last time."""
    now = start
    for i, outcome in enumerate(outcomes):
        now = start + i
        q.record(domain, f"{domain}@{now:g}", infra_failure=outcome == "x", now=now)
    return now


def test_a_failing_domain_is_held_and_the_others_are_not() -> None:
    q = Quarantine(SETTINGS)
    feed(q, "healthy", "x........." * 3)
    now = feed(q, "broken", "x.x.x.x.xx")
    assert q.state("broken") is DomainState.QUARANTINED
    assert not q.allows("broken", now + 1)
    assert q.state("healthy") is DomainState.ACTIVE and q.allows("healthy", now)
    [held] = q.quarantined()
    assert held.domain == "broken" and held.failure_rate == pytest.approx(0.6)


def test_too_few_samples_or_old_failures_do_not_quarantine() -> None:
    q = Quarantine(SETTINGS)
    feed(q, "d", "xxxxxxxxx")  # 9 < min_samples
    assert q.state("d") is DomainState.ACTIVE
    # Those nine fall out of the window before the next ten, which are fine but one.
    feed(q, "d", "x.........", start=200.0)
    assert q.state("d") is DomainState.ACTIVE


def test_a_successful_probe_resumes_the_domain() -> None:
    q = Quarantine(SETTINGS)
    now = feed(q, "d", "x" * 10)
    assert not q.allows("d", now + 9)
    assert q.allows("d", now + 10)  # the probe
    assert q.state("d") is DomainState.PROBING
    assert not q.allows("d", now + 10.5), "one probe at a time"
    q.record("d", "probe", infra_failure=False, now=now + 12)
    assert q.state("d") is DomainState.ACTIVE and q.allows("d", now + 12)


def test_a_failed_or_lost_probe_backs_off() -> None:
    q = Quarantine(SETTINGS)
    now = feed(q, "d", "x" * 10)
    assert q.allows("d", now + 10)
    q.record("d", "probe", infra_failure=True, now=now + 11)
    assert q.state("d") is DomainState.QUARANTINED
    assert not q.allows("d", now + 11 + 19)
    assert q.allows("d", now + 11 + 20)  # the wait doubled to 20 s
    # This probe never reports: after its wait it counts as failed (wait capped at 30 s).
    assert not q.allows("d", now + 31 + 19)
    assert not q.allows("d", now + 31 + 20 + 29)
    assert q.allows("d", now + 31 + 20 + 30)


def test_an_operator_resume_lifts_it_at_once() -> None:
    q = Quarantine(SETTINGS)
    now = feed(q, "d", "x" * 10)
    assert q.resume("d") and not q.resume("d")
    assert q.allows("d", now) and q.quarantined() == []


def test_fair_share_skips_held_domains_and_keeps_serving_the_rest() -> None:
    """The two together, as the intake will use them: held domains are not backlogged."""
    share, q = FairShare(), Quarantine(SETTINGS)
    now = feed(q, "broken", "x" * 10)
    started: deque[Flow] = deque()
    for _ in range(20):
        backlogged = [Flow(d) for d in ("broken", "fine") if q.allows(d, now)]
        chosen = share.pick(backlogged)
        assert chosen is not None
        share.started(chosen, backlogged)
        started.append(chosen)
    assert set(started) == {Flow("fine")}


def test_the_scheduler_names_the_busiest_domains_in_flight() -> None:
    from services.generator.scheduling.scheduler import DomainScheduler, SchedulingSettings

    scheduler = DomainScheduler(SchedulingSettings(), {})
    assert scheduler.in_flight() == ""
    for domain, count in [("a", 1), ("b", 3), ("c", 2), ("d", 1), ("e", 1), ("f", 1)]:
        for _ in range(count):
            scheduler.started(Flow(domain))
    assert scheduler.in_flight(limit=2) == "b:3,c:2,+4 more"
    scheduler.finished(Flow("b"))
    scheduler.finished(Flow("b"))
    scheduler.finished(Flow("b"))
    assert scheduler.in_flight(limit=10) == "c:2,a:1,d:1,e:1,f:1"
