"""NATS header names used by Temper.  All values are ASCII strings."""

from __future__ import annotations

import re
import uuid
from typing import Final

#: Follows one task through every service: set by the client, copied onto everything derived.
TRACE_ID: Final = "Temper-Trace-Id"
#: JetStream de-duplication id: a republish with the same id inside the window is dropped.
MSG_ID: Final = "Nats-Msg-Id"
#: ``1``: the protocol major version of the payload (also inside the payload as ``v``).
VERSION: Final = "Temper-Version"

# Dead-letter entries: the payload is the original bytes; these say why and from where.
DLQ_CODE: Final = "Temper-Dlq-Code"
DLQ_REASON: Final = "Temper-Dlq-Reason"
DLQ_FIELD: Final = "Temper-Dlq-Field"
DLQ_SUBJECT: Final = "Temper-Dlq-Subject"
DLQ_SOURCE: Final = "Temper-Dlq-Source"
DLQ_SERVICE: Final = "Temper-Dlq-Service"
DLQ_DELIVERIES: Final = "Temper-Dlq-Deliveries"
DLQ_AT: Final = "Temper-Dlq-At"
#: Present only when the original did not fit beside the headers: its full size in bytes.
DLQ_TRUNCATED: Final = "Temper-Dlq-Truncated"

_UNSAFE: Final = re.compile(r"[\r\n\x00-\x1f\x7f]")
MAX_VALUE_LEN: Final = 1024


def new_trace_id() -> str:
    return uuid.uuid4().hex


def clean(value: str, limit: int = MAX_VALUE_LEN) -> str:
    """A header value cannot hold control characters (they would end the header line)."""
    return _UNSAFE.sub(" ", value)[:limit]
