"""The runtime every service shares.

Lifecycle, NATS, consumers, responders, logs, metrics, settings.
"""

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
