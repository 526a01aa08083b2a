"""The control service's judgement without a server: silent -> unhealthy -> gone -> dropped,
generators lagging behind the newest policy, and how ``temper status`` prints it."""

from __future__ import annotations

from protocol.messages import Heartbeat, ServiceState, ServiceStatus, StackStatus
from services.cli.status_view import status_lines
from services.control.service import Announcements, ControlSettings, Roster

SETTINGS = ControlSettings(
    stale_after_s=10.0, gone_after_s=20.0, forget_after_s=60.0, lagging_after_s=30.0
)
ME = Heartbeat(service="control", instance="ctl", state=ServiceState.RUNNING, healthy=True)


def beat(
    service: str = "generator",
    instance: str = "g1",
    *,
    version: int | None = None,
    state: ServiceState = ServiceState.RUNNING,
) -> Heartbeat:
    return Heartbeat(
        service=service,
        instance=instance,
        state=state,
        healthy=True,
        detail="engine=torch",
        policy_version=version,
    )


def status_of(roster: Roster, now: float, instance: str = "g1") -> ServiceStatus | None:
    found = [s for s in roster.statuses(now, ME) if s.instance == instance]
    return found[0] if found else None


def test_a_silent_instance_turns_unhealthy_then_gone_then_is_dropped() -> None:
    roster = Roster(SETTINGS)
    roster.heard(beat(), now=100.0)

    fresh = status_of(roster, 105.0)
    assert fresh is not None
    assert (fresh.healthy, fresh.gone, fresh.detail) == (True, False, "engine=torch")

    silent = status_of(roster, 115.0)
    assert silent is not None
    assert (silent.healthy, silent.gone) == (False, False)
    assert silent.detail == "no heartbeat for 15s"

    gone = status_of(roster, 121.0)
    assert gone is not None
    assert (gone.gone, gone.healthy, gone.state) == (True, False, ServiceState.RUNNING)
    assert gone.age_s == 21.0

    assert status_of(roster, 161.0) is None
    assert [s.instance for s in roster.statuses(161.0, ME)] == ["ctl"]


def test_a_new_heartbeat_brings_an_instance_back_and_stopped_drops_it_at_once() -> None:
    roster = Roster(SETTINGS)
    roster.heard(beat(), now=0.0)
    roster.heard(beat(), now=25.0)
    back = status_of(roster, 26.0)
    assert back is not None and not back.gone and back.healthy
    roster.heard(beat(state=ServiceState.STOPPED), now=27.0)
    assert status_of(roster, 27.0) is None


def test_a_generator_lags_once_behind_the_newest_version_for_longer_than_the_bound() -> None:
    roster = Roster(SETTINGS)
    roster.policy.announced(3, now=0.0)
    roster.policy.announced(5, now=100.0)
    roster.heard(beat(instance="old", version=3), now=125.0)
    roster.heard(beat(instance="new", version=5), now=125.0)
    roster.heard(beat(service="replay", instance="r1"), now=125.0)

    early = {s.instance: s for s in roster.statuses(129.0, ME)}
    assert (early["old"].policy_version, early["old"].lagging) == (3, False)

    late = {s.instance: s for s in roster.statuses(131.0, ME)}
    assert (late["old"].policy_version, late["old"].lagging) == (3, True)
    assert (late["new"].policy_version, late["new"].lagging) == (5, False)
    assert (late["r1"].policy_version, late["r1"].lagging) == (None, False)


def test_announcements_date_a_lag_from_the_first_newer_version() -> None:
    seen = Announcements(keep=3)
    assert seen.newest is None and seen.behind_since(0) is None
    seen.announced(1, now=10.0)
    seen.announced(1, now=50.0)  # re-announced: the first time counts
    seen.announced(2, now=20.0)
    assert seen.newest == 2
    assert seen.behind_since(0) == 10.0
    assert seen.behind_since(1) == 20.0
    assert seen.behind_since(2) is None
    seen.announced(3, now=30.0)
    seen.announced(4, now=40.0)  # v1 falls out: behind since no later than v2
    assert seen.behind_since(0) == 20.0


def test_status_prints_gone_and_lagging_instances_as_such() -> None:
    def listed(**fields: object) -> ServiceStatus:
        values: dict[str, object] = {
            "service": "generator",
            "instance": "g",
            "state": ServiceState.RUNNING,
            "healthy": True,
            "age_s": 1.0,
        }
        values.update(fields)
        return ServiceStatus(**values)  # type: ignore[arg-type]

    status = StackStatus(
        services=[
            listed(instance="g-ok", policy_version=5),
            listed(instance="g-slow", policy_version=3, lagging=True),
            listed(instance="g-dead", healthy=False, gone=True, detail="no heartbeat for 25s"),
            listed(service="replay", instance="r1", healthy=False, detail="disk full"),
        ]
    )
    rows = {line.split()[1]: line.split() for line in status_lines("nats://x", status)[2:6]}
    assert rows["g-ok"][:5] == ["generator", "g-ok", "running", "healthy", "v5"]
    assert rows["g-slow"][:6] == ["generator", "g-slow", "running", "healthy", "v3", "lagging"]
    assert rows["g-dead"][:5] == ["generator", "g-dead", "gone", "-", "-"]
    assert rows["g-dead"][-4:] == ["no", "heartbeat", "for", "25s"]
    assert rows["r1"][:5] == ["replay", "r1", "running", "UNHEALTHY", "-"]
