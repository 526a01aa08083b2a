"""The runtime every service shares.

Lifecycle, NATS, consumers, responders, logs, metrics, settings.  Its names load on first
use, so that a light submodule (settings, errors) does not pull in the NATS client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.runtime.lazy import exports

if TYPE_CHECKING:
    from services.runtime.batch import BatchHandler, Outcome, Result
    from services.runtime.bus import Publication, PublishResult, StreamAck
    from services.runtime.consumer import ConsumerTuning, Delivery
    from services.runtime.errors import Reject, RequestRejected
    from services.runtime.jetstream import ConsumerSpec
    from services.runtime.responder import Request
    from services.runtime.service import Service
    from services.runtime.settings import RuntimeSettings

__all__ = [
    "BatchHandler",
    "ConsumerSpec",
    "ConsumerTuning",
    "Delivery",
    "Outcome",
    "Publication",
    "PublishResult",
    "Reject",
    "Request",
    "RequestRejected",
    "Result",
    "RuntimeSettings",
    "Service",
    "StreamAck",
]

__getattr__ = exports(
    __name__,
    {
        "BatchHandler": "services.runtime.batch",
        "Outcome": "services.runtime.batch",
        "Result": "services.runtime.batch",
        "Publication": "services.runtime.bus",
        "PublishResult": "services.runtime.bus",
        "StreamAck": "services.runtime.bus",
        "ConsumerTuning": "services.runtime.consumer",
        "Delivery": "services.runtime.consumer",
        "Reject": "services.runtime.errors",
        "RequestRejected": "services.runtime.errors",
        "ConsumerSpec": "services.runtime.jetstream",
        "Request": "services.runtime.responder",
        "Service": "services.runtime.service",
        "RuntimeSettings": "services.runtime.settings",
    },
)
