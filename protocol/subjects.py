"""Every subject Temper uses, built here and nowhere else.

The major protocol version is part of every subject (``temper.v1.``), so a v2
stack can run beside a v1 stack on one NATS cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from protocol.errors import SubjectError, SubjectMismatch
from protocol.messages import PROTOCOL_VERSION, TIERS, Task

PREFIX: Final = f"temper.v{PROTOCOL_VERSION}"
_TASKS: Final = f"{PREFIX}.task."
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
def task(tier: int, domain: str, tenant: str = "") -> str:
    """``<tier>.<domain>`` for the default tenant (empty), as before tenants existed;
    another tenant is one more token, so that each tenant's tasks can have a consumer of
    their own (JetStream filters on subjects, never on a message's fields)."""
    subject = f"{PREFIX}.task.{_tier(tier)}.{token(domain, 'domain')}"
    return f"{subject}.{token(tenant, 'tenant')}" if tenant else subject


def of_task(message: Task) -> str:
    """The subject ``message`` is published on: its tier, domain and tenant."""
    return task(message.tier, message.domain, message.tenant)


def task_tier(tier: int) -> str:
    """Filter matching every task of one tier."""
    return f"{PREFIX}.task.{_tier(tier)}.>"


@dataclass(frozen=True, slots=True)
class TaskRoute:
    """What a task's subject says: the tier, domain and tenant it is scheduled in."""

    tier: int
    domain: str
    tenant: str = ""

    @classmethod
    def parse(cls, subject: str) -> TaskRoute:
        """The route of a subject :func:`task` builds; SubjectError for any other."""
        tokens = subject.removeprefix(_TASKS).split(".")
        if subject.startswith(_TASKS) and len(tokens) in (2, 3) and tokens[0].isdecimal():
            route = cls(int(tokens[0]), *tokens[1:])
            if task(route.tier, route.domain, route.tenant) == subject:
                return route
        raise SubjectError(
            f"{subject!r} is not a task subject ({_TASKS}<tier>.<domain>[.<tenant>])"
        )

    def check(self, message: Task) -> None:
        """SubjectMismatch unless the task's tenant is the subject's: the subject decides
        whose share the task is taken in, and the task would be counted as another's.
        Tier and domain are not compared (the subject decides, docs/protocol.md §5.1):
        v1 readers never refused those, and a tighter rule would break old writers."""
        if message.tenant != self.tenant:
            raise SubjectMismatch(
                f"task {message.id!r} has tenant {_shown(message.tenant)} but came on "
                f"{task(self.tier, self.domain, self.tenant)} (tenant {_shown(self.tenant)}); "
                "publish a task on the subject of its own tenant",
                field="$.tenant",
            )


def _shown(value: str) -> str:
    return repr(value) if value else "'' (the default tenant)"


def rollout(domain: str) -> str:
    return f"{PREFIX}.rollout.{token(domain, 'domain')}"


def rollouts() -> str:
    return f"{PREFIX}.rollout.>"


def scored(domain: str, task_id: str) -> str:
    return f"{PREFIX}.scored.{token(domain, 'domain')}.{token(task_id, 'task id')}"


def scored_all() -> str:
    return f"{PREFIX}.scored.>"


def scored_in_domain(domain: str) -> str:
    """Filter matching the scored rollouts of every task of one domain."""
    return f"{PREFIX}.scored.{token(domain, 'domain')}.*"


def scored_for_task(task_id: str) -> str:
    """Filter matching the scored rollouts of one task, whatever its domain."""
    return f"{PREFIX}.scored.*.{token(task_id, 'task id')}"


# Request/reply
def gateway_reply(instance: str, task_id: str) -> str:
    """Where a generator answers one gateway call, the task ``task_id`` (a core subject:
    nothing of a call is durable, and a gateway that is gone has nobody to answer)."""
    return f"{PREFIX}.gateway.reply.{token(instance, 'instance')}.{token(task_id, 'task id')}"


def gateway_cancel() -> str:
    """Where a gateway says it gave up on a call (core: every generator hears it, and the
    one serving the call stops)."""
    return f"{PREFIX}.gateway.cancel"


def gateway_replies(instance: str) -> str:
    """Every reply to one gateway instance's calls."""
    return f"{PREFIX}.gateway.reply.{token(instance, 'instance')}.>"


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
