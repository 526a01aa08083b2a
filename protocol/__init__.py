"""Temper wire protocol, version 1: message types, codec, subjects, streams, errors.

Pure: importing it performs no I/O and pulls in no ML framework.  The async
client lives in :mod:`protocol.client` and is imported explicitly.
"""

from protocol.codec import ANY, DEFAULT_MAX_PAYLOAD, Codec, check_size, encode, headers_size
from protocol.errors import (
    DecodeError,
    ErrorCode,
    PayloadTooLarge,
    ProtocolError,
    RemoteError,
    SubjectError,
    VersionError,
)
from protocol.messages import *  # noqa: F403
from protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, TIERS, AnyMessage, Message
from protocol.packed import (
    f32_list,
    i32_list,
    pack_f32,
    pack_i32,
    pack_u8,
    unpack_f32,
    unpack_i32,
    unpack_u8,
)

__all__ = [
    "ANY",
    "DEFAULT_MAX_PAYLOAD",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "TIERS",
    "AnyMessage",
    "Codec",
    "DecodeError",
    "ErrorCode",
    "Message",
    "PayloadTooLarge",
    "ProtocolError",
    "RemoteError",
    "SubjectError",
    "VersionError",
    "check_size",
    "encode",
    "f32_list",
    "headers_size",
    "i32_list",
    "pack_f32",
    "pack_i32",
    "pack_u8",
    "unpack_f32",
    "unpack_i32",
    "unpack_u8",
]
