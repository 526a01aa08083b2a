"""Every subject Temper uses, built here and nowhere else.

The major protocol version is part of every subject (``temper.v1.``), so a v2
stack can run beside a v1 stack on one NATS cluster.
"""

from __future__ import annotations

import re
from typing import Final

from protocol.errors import SubjectError
from protocol.messages import PROTOCOL_VERSION, TIERS

PREFIX: Final = f"temper.v{PROTOCOL_VERSION}"
_TOKEN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,127}\Z")


def token(value: str, what: str = "token") -> str:
    """Check that ``value`` can be one subject token."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise SubjectError(f"{what} {value!r} cannot be a subject token (use A-Z a-z 0-9 _ -)")
    return value


def _tier(tier: int) -> int:
    if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier < TIERS:
        raise SubjectError(f"tier {tier} is outside 0..{TIERS - 1}")
    return tier


# Work
def task(tier: int, domain: str) -> str:
    return f"{PREFIX}.task.{_tier(tier)}.{token(domain, 'domain')}"


def task_tier(tier: int) -> str:
    """Filter matching every task of one tier."""
    return f"{PREFIX}.task.{_tier(tier)}.>"


def rollout(domain: str) -> str:
    return f"{PREFIX}.rollout.{token(domain, 'domain')}"


def rollouts() -> str:
    return f"{PREFIX}.rollout.>"


def scored(domain: str, task_id: str) -> str:
    return f"{PREFIX}.scored.{token(domain, 'domain')}.{token(task_id, 'task id')}"


def scored_all() -> str:
    return f"{PREFIX}.scored.>"


def scored_for_task(task_id: str) -> str:
    """Filter matching the scored rollouts of one task, whatever its domain."""
    return f"{PREFIX}.scored.*.{token(task_id, 'task id')}"


# Request/reply
def sandbox_exec() -> str:
    return f"{PREFIX}.sandbox.exec"


def sandbox_session() -> str:
    """Request/reply (queue group): SandboxOpen -> SandboxSession."""
    return f"{PREFIX}.sandbox.session"


def sandbox_instance(instance: str) -> str:
    """Request/reply to one sandbox instance: the requests of the sessions it holds."""
    return f"{PREFIX}.sandbox.instance.{token(instance, 'instance')}"


def replay_sample() -> str:
    return f"{PREFIX}.replay.sample"


def replay_commit() -> str:
    """Request/reply: BatchCommit | LeaseRelease -> CommitReply."""
    return f"{PREFIX}.replay.commit"


def domains() -> str:
    """Request/reply (queue group ``validator``): DomainsRequest -> DomainList."""
    return f"{PREFIX}.domains"


# Weights
def policy_update() -> str:
    return f"{PREFIX}.policy.update"


def weight_ack(service: str) -> str:
    return f"{PREFIX}.policy.ack.{token(service, 'service')}"


def policy_weights(instance: str) -> str:
    """Request/reply to one learner instance: WeightGroupOpen -> WeightGroup, WeightSend ->
    WeightSending (then the broadcast).  The ``uri`` of a ``torch_distributed`` PolicyUpdate."""
    return f"{PREFIX}.policy.weights.{token(instance, 'instance')}"


# Control
def heartbeat(service: str) -> str:
    return f"{PREFIX}.control.heartbeat.{token(service, 'service')}"


def heartbeats() -> str:
    return f"{PREFIX}.control.heartbeat.>"


def stats(service: str) -> str:
    return f"{PREFIX}.control.stats.{token(service, 'service')}"


def stats_all() -> str:
    """Every service's Stats."""
    return f"{PREFIX}.control.stats.*"


def health(service: str) -> str:
    """Request/reply: every instance of ``service`` answers with a Heartbeat."""
    return f"{PREFIX}.control.health.{token(service, 'service')}"


def ping() -> str:
    """Request/reply: every instance of every service answers with a Heartbeat."""
    return f"{PREFIX}.control.ping"


def status() -> str:
    """Request/reply: the control service answers with a StackStatus."""
    return f"{PREFIX}.control.status"


def domain_control() -> str:
    """Request/reply: every generator instance answers a DomainControl with a DomainSchedules."""
    return f"{PREFIX}.control.domain"


# Errors
def error_event(service: str) -> str:
    return f"{PREFIX}.error.{token(service, 'service')}"


def error_events() -> str:
    return f"{PREFIX}.error.>"


def dead_letter(source: str) -> str:
    """Dead-letter subject for input that came from ``source`` (a stream or a service name)."""
    return f"{PREFIX}.dlq.{token(source, 'source')}"


def dead_letters() -> str:
    return f"{PREFIX}.dlq.>"
