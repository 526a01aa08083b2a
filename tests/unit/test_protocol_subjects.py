"""Subjects and streams: every name comes from protocol.subjects and is a valid NATS subject."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import pytest

from protocol import TIERS, SubjectError, Task, streams, subjects
from protocol.errors import ErrorCode, SubjectMismatch

BAD_TOKENS = [".", "a.b", "*", ">", "a*", "a>", " ", "a b", "", "a\n", "a\tb", "é", "-a", "x" * 129]
#: A concrete subject: dot-separated tokens, no wildcards, no whitespace.
CONCRETE = re.compile(r"^temper\.v1(\.[A-Za-z0-9_-]+)+\Z")
#: A filter may also use `*` as a whole token and `>` as the last token.
FILTER = re.compile(r"^temper\.v1(\.([A-Za-z0-9_-]+|\*))*(\.>)?\Z")


#: Public functions of protocol.subjects that build no subject from tokens: ``of_task``
#: is ``task`` on a Task's fields (tested with the tenant subjects).
NOT_BUILDERS = {"token", "of_task"}


def builders() -> dict[str, Callable[..., str]]:
    return {
        name: function
        for name, function in inspect.getmembers(subjects, inspect.isfunction)
        if function.__module__ == subjects.__name__
        and not name.startswith("_")
        and name not in NOT_BUILDERS
    }


def sample_args(function: Callable[..., str]) -> list[object]:
    values = {
        "tier": 2,
        "domain": "math",
        "task_id": "task-1",
        "service": "generator",
        "source": "TEMPER_ROLLOUTS",
        "instance": "sandbox-0",
        "tenant": "acme",
    }
    return [values[name] for name in inspect.signature(function).parameters]


@pytest.mark.parametrize("name", sorted(builders()))
def test_every_builder_returns_a_v1_subject(name: str) -> None:
    function = builders()[name]
    subject = function(*sample_args(function))
    assert subject.startswith("temper.v1.")
    assert FILTER.match(subject), subject


def test_concrete_subjects() -> None:
    assert subjects.task(0, "math") == "temper.v1.task.0.math"
    assert subjects.rollout("code") == "temper.v1.rollout.code"
    assert subjects.scored("math", "task-1") == "temper.v1.scored.math.task-1"
    assert subjects.sandbox_exec() == "temper.v1.sandbox.exec"
    assert subjects.replay_sample() == "temper.v1.replay.sample"
    assert subjects.policy_update() == "temper.v1.policy.update"
    assert subjects.weight_ack("generator") == "temper.v1.policy.ack.generator"
    assert subjects.heartbeat("sandbox") == "temper.v1.control.heartbeat.sandbox"
    assert subjects.stats("sandbox") == "temper.v1.control.stats.sandbox"
    assert subjects.health("sandbox") == "temper.v1.control.health.sandbox"
    assert subjects.ping() == "temper.v1.control.ping"
    assert subjects.status() == "temper.v1.control.status"
    assert subjects.error_event("validator") == "temper.v1.error.validator"
    assert subjects.dead_letter("TEMPER_ROLLOUTS") == "temper.v1.dlq.TEMPER_ROLLOUTS"
    for subject in (subjects.task(3, "a"), subjects.scored("a", "b"), subjects.ping()):
        assert CONCRETE.match(subject)


def test_filters() -> None:
    assert subjects.task_tier(1) == "temper.v1.task.1.>"
    assert subjects.rollouts() == "temper.v1.rollout.>"
    assert subjects.scored_all() == "temper.v1.scored.>"
    assert subjects.scored_for_task("task-1") == "temper.v1.scored.*.task-1"
    assert subjects.heartbeats() == "temper.v1.control.heartbeat.>"
    assert subjects.error_events() == "temper.v1.error.>"
    assert subjects.dead_letters() == "temper.v1.dlq.>"


@pytest.mark.parametrize("bad", BAD_TOKENS)
@pytest.mark.parametrize(
    "build",
    [
        lambda t: subjects.task(0, t),
        subjects.rollout,
        lambda t: subjects.scored(t, "task-1"),
        lambda t: subjects.scored("math", t),
        subjects.scored_for_task,
        subjects.weight_ack,
        subjects.heartbeat,
        subjects.stats,
        subjects.health,
        subjects.error_event,
        subjects.dead_letter,
        subjects.token,
    ],
)
def test_bad_tokens_are_refused(build: Callable[[str], str], bad: str) -> None:
    with pytest.raises(SubjectError) as caught:
        build(bad)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_non_string_token_is_refused() -> None:
    with pytest.raises(SubjectError):
        subjects.token(5)  # type: ignore[arg-type]


def test_a_tenant_is_one_more_token_and_the_default_tenant_none() -> None:
    assert subjects.task(1, "math", "") == subjects.task(1, "math") == "temper.v1.task.1.math"
    assert subjects.task(1, "math", "acme") == "temper.v1.task.1.math.acme"
    assert CONCRETE.match(subjects.task(1, "math", "acme"))
    # The tier's stream and its filter take both forms.
    assert subjects.task(1, "math", "acme").startswith(subjects.task_tier(1)[:-1])


@pytest.mark.parametrize("bad", [t for t in BAD_TOKENS if t])
def test_bad_tenants_are_refused_by_name(bad: str) -> None:
    with pytest.raises(SubjectError, match=rf"^tenant {re.escape(repr(bad))} cannot be"):
        subjects.task(0, "math", bad)


@pytest.mark.parametrize("tenant", ["", "acme"])
@pytest.mark.parametrize("tier", range(TIERS))
def test_a_task_route_reads_what_task_builds(tier: int, tenant: str) -> None:
    route = subjects.TaskRoute.parse(subjects.task(tier, "math", tenant))
    assert route == subjects.TaskRoute(tier, "math", tenant)


@pytest.mark.parametrize(
    "subject",
    [
        "temper.v1.task.1",
        "temper.v1.task.1.math.acme.more",
        "temper.v1.task.x.math",
        "temper.v1.task.01.math",
        f"temper.v1.task.{TIERS}.math",
        "temper.v1.task.1.math.",
        "temper.v1.task.1..acme",
        "temper.v1.rollout.math",
        "temper.v2.task.1.math",
    ],
)
def test_a_task_route_refuses_what_task_never_builds(subject: str) -> None:
    with pytest.raises(SubjectError):
        subjects.TaskRoute.parse(subject)


def _task(domain: str = "math", tenant: str = "", tier: int = 1) -> Task:
    return Task(id="t1", domain=domain, tenant=tenant, tier=tier, prompt_tokens=b"\x01\0\0\0")


@pytest.mark.parametrize(
    ("said", "got"), [("acme", "other"), ("acme", ""), ("", "acme")], ids=["other", "to", "from"]
)
def test_a_task_on_another_tenants_subject_is_refused(said: str, got: str) -> None:
    route = subjects.TaskRoute.parse(subjects.task(1, "math", said))
    with pytest.raises(SubjectMismatch) as caught:
        route.check(_task(tenant=got))
    error = caught.value
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$.tenant")
    shown = repr(got) if got else "'' (the default tenant)"
    subject = subjects.task(1, "math", said)
    assert f"task 't1' has tenant {shown} but came on {subject}" in str(error)


def test_domain_and_tier_are_not_compared_with_the_subjects() -> None:
    """v1 readers never compared them (the subject decides): still so."""
    route = subjects.TaskRoute.parse(subjects.task(0, "math", "acme"))
    route.check(_task(domain="code", tenant="acme", tier=3))


@pytest.mark.parametrize("tier", range(TIERS))
def test_every_tier_has_subjects(tier: int) -> None:
    assert subjects.task(tier, "d") == f"temper.v1.task.{tier}.d"
    assert subjects.task_tier(tier) == f"temper.v1.task.{tier}.>"


@pytest.mark.parametrize("tier", [-1, TIERS, 99])
def test_tier_bounds(tier: int) -> None:
    with pytest.raises(SubjectError):
        subjects.task(tier, "d")
    with pytest.raises(SubjectError):
        subjects.task_tier(tier)


def test_streams_cover_their_subjects_without_overlap() -> None:
    names = [spec.name for spec in streams.ALL]
    assert len(names) == len(set(names))
    assert names[:TIERS] == [f"TEMPER_TASKS_{tier}" for tier in range(TIERS)]
    filters = [subject for spec in streams.ALL for subject in spec.subjects]
    assert len(filters) == len(set(filters))
    assert all(FILTER.match(subject) for subject in filters)
    assert streams.BY_NAME["TEMPER_SCORED"].subjects == (subjects.scored_all(),)
    # A client waiting on one task reads TEMPER_SCORED with this filter.
    assert subjects.scored_for_task("t").startswith(subjects.scored_all()[:-1])


def test_work_streams_are_work_queues() -> None:
    for spec in (*streams.TASK_STREAMS, streams.ROLLOUTS):
        assert spec.retention == "workqueue"
    for spec in (streams.SCORED, streams.POLICY, streams.ERRORS, streams.DEAD_LETTERS):
        assert spec.retention == "limits"


def test_a_task_is_published_on_the_subject_of_its_tier_domain_and_tenant() -> None:
    assert subjects.of_task(_task("code", tier=2)) == "temper.v1.task.2.code"
    named = _task("code", "acme", tier=2)
    assert subjects.of_task(named) == "temper.v1.task.2.code.acme"
    assert subjects.TaskRoute.parse(subjects.of_task(named)).tenant == "acme"
