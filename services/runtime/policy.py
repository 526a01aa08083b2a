"""The newest PolicyUpdate kept in ``TEMPER_POLICY``: where a starting service catches up.

A generator starting late serves that version at once; a learner starting without a
checkpoint of it numbers its versions on from it, so versions strictly increase across
restarts whatever was lost.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext

from protocol import streams, subjects
from protocol.codec import Codec
from protocol.errors import DecodeError
from protocol.messages import PolicyUpdate

_CODEC: Codec[PolicyUpdate] = Codec(PolicyUpdate)


async def last_policy_update(
    js: JetStreamContext, log: structlog.typing.FilteringBoundLogger
) -> PolicyUpdate | None:
    """None when nothing was announced yet (or the stream is not there); an undecodable
    stored update is logged and treated as none."""
    try:
        stored = await js.get_last_msg(streams.POLICY.name, subjects.policy_update())
    except (nats.js.errors.NotFoundError, nats.errors.Error):
        return None
    try:
        return _CODEC.decode(stored.data or b"")
    except DecodeError as error:
        log.warning("bad_stored_policy_update", error=str(error))
        return None
