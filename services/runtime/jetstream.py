"""Idempotent declaration of the JetStream streams and consumers a service needs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from protocol.streams import StreamSpec

_RETENTION = {"workqueue": api.RetentionPolicy.WORK_QUEUE, "limits": api.RetentionPolicy.LIMITS}


def stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention],
        storage=api.StorageType.FILE,
        description=spec.description,
        max_age=spec.max_age_s or None,
        # The server refuses a dedup window longer than the stream keeps messages.
        duplicate_window=min(spec.duplicate_window_s, spec.max_age_s or spec.duplicate_window_s),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_bytes=spec.max_bytes,
        allow_direct=True,
        num_replicas=spec.replicas,
    )


async def ensure_stream(js: JetStreamContext, spec: StreamSpec) -> api.StreamInfo:
    """Create the stream, or bring an existing one to this configuration.

    Safe to call from every instance of every service at once.  A stream kept in more
    copies than ``spec`` asks for keeps them: one process started without the cluster's
    replica setting must not quietly take the stack's fault tolerance away.
    """
    config = stream_config(spec)
    try:
        return await js.add_stream(config)
    except BadRequestError:
        # Exists with another configuration (e.g. an older max_age): update in place.
        return await js.update_stream(await _keeping_replicas(js, config))


async def _keeping_replicas(js: JetStreamContext, config: api.StreamConfig) -> api.StreamConfig:
    current = (await js.stream_info(config.name or "")).config.num_replicas or 1
    if current > (config.num_replicas or 1):
        return replace(config, num_replicas=current)
    return config


async def ensure_streams(js: JetStreamContext, specs: Iterable[StreamSpec]) -> None:
    for spec in specs:
        await ensure_stream(js, spec)


@dataclass(frozen=True, kw_only=True)
class ConsumerSpec:
    """A durable pull consumer.  Every process using the same durable shares its work."""

    stream: str
    durable: str
    filter_subject: str | None = None
    #: Redelivered if not acked (or marked in progress) within this time.
    ack_wait_s: float = 30.0
    #: After this many deliveries a failing message goes to the dead-letter stream.
    max_deliver: int = 5
    max_ack_pending: int = 1024
    #: Only messages stored after the durable was made (else the whole stream, oldest first).
    new_only: bool = False


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        durable_name=spec.durable,
        filter_subject=spec.filter_subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        deliver_policy=api.DeliverPolicy.NEW if spec.new_only else api.DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
    )


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> api.ConsumerInfo:
    # The server creates the durable, or updates it in place if only mutable fields differ.
    return await js.add_consumer(spec.stream, consumer_config(spec))


async def stream_exists(js: JetStreamContext, name: str) -> bool:
    try:
        await js.stream_info(name)
    except NotFoundError:
        return False
    return True
