"""The JetStream streams of a Temper stack, as plain data.

Services declare them idempotently at start-up; a client in another language
can create the same streams from this table (or docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from protocol import subjects
from protocol.messages import TIERS

DAY: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    #: ``workqueue``: a message is deleted once acked.  ``limits``: kept until age/size limits.
    retention: Literal["workqueue", "limits"]
    description: str
    #: 0 keeps messages until acked (workqueue) or forever (limits).
    max_age_s: float = 0.0
    #: Republishing a ``Nats-Msg-Id`` seen within this window is a no-op.
    duplicate_window_s: float = 600.0
    max_msgs_per_subject: int = -1
    max_bytes: int = -1
    #: Copies kept on distinct servers of a cluster: 3 survives the loss of any one server.
    #: A deployment setting (``TEMPER_STREAM_REPLICAS``), so the table keeps 1.
    replicas: int = 1
    extra: dict[str, object] = field(default_factory=dict)


def with_replicas(specs: Iterable[StreamSpec], replicas: int) -> tuple[StreamSpec, ...]:
    """The same streams, each kept in ``replicas`` copies."""
    if replicas < 1:
        raise ValueError(f"a stream needs at least one replica, not {replicas}")
    return tuple(replace(spec, replicas=replicas) for spec in specs)


def task_stream_name(tier: int) -> str:
    return f"TEMPER_TASKS_{tier}"


TASK_STREAMS: Final = tuple(
    StreamSpec(
        name=task_stream_name(tier),
        subjects=(subjects.task_tier(tier),),
        retention="workqueue",
        description=f"Tasks of priority tier {tier} (0 is served first)",
    )
    for tier in range(TIERS)
)
ROLLOUTS: Final = StreamSpec(
    name="TEMPER_ROLLOUTS",
    subjects=(subjects.rollouts(),),
    retention="workqueue",
    description="Rollouts waiting to be scored",
)
SCORED: Final = StreamSpec(
    name="TEMPER_SCORED",
    subjects=(subjects.scored_all(),),
    retention="limits",
    description="Scored rollouts, kept for the replay buffer and for clients waiting on a task",
    max_age_s=7 * DAY,
)
POLICY: Final = StreamSpec(
    name="TEMPER_POLICY",
    subjects=(subjects.policy_update(),),
    retention="limits",
    description="Policy updates; a late generator reads the newest",
    max_msgs_per_subject=64,
)
ERRORS: Final = StreamSpec(
    name="TEMPER_ERRORS",
    subjects=(subjects.error_events(),),
    retention="limits",
    description="Error events: rejected input, with the original bytes",
    max_age_s=7 * DAY,
)
DEAD_LETTERS: Final = StreamSpec(
    name="TEMPER_DLQ",
    subjects=(subjects.dead_letters(),),
    retention="limits",
    description="Dead letters: original bytes plus Temper-Dlq-* headers saying why",
    max_age_s=30 * DAY,
)

ALL: Final = (*TASK_STREAMS, ROLLOUTS, SCORED, POLICY, ERRORS, DEAD_LETTERS)
BY_NAME: Final = {spec.name: spec for spec in ALL}
