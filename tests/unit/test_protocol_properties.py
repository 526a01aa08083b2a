"""Property tests: generated messages round-trip; decoders raise nothing but DecodeError."""

from __future__ import annotations

import string
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ANY, TIERS, Codec, DecodeError, Message, pack_f32, pack_i32, pack_u8
from protocol.errors import ErrorCode
from protocol.messages import (
    ChatMessage,
    ErrorEvent,
    FinishReason,
    Rollout,
    RolloutStatus,
    SampleRequest,
    SamplingParams,
    SandboxExec,
    SandboxLimits,
    ScoredRollout,
    ScoreStatus,
    Segment,
    Task,
    Timings,
    ToolCall,
    ValidatorDetail,
)
from tests.golden.examples import examples

# No example database: the suite must not leave files behind in the repository.
ROUND_TRIP = settings(max_examples=150, deadline=None, database=None)
FUZZ = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ALNUM = string.ascii_letters + string.digits
ENCODED_EXAMPLES = [ANY.encode(message) for message in examples().values()]
CODECS: list[Codec[Any]] = [ANY, Codec(Task), Codec(Rollout), Codec(SandboxExec)]

# ----------------------------------------------------------------- strategies

tokens = st.builds(
    str.__add__, st.sampled_from(ALNUM), st.text(alphabet=ALNUM + "_-", max_size=127)
)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
# msgpack integers span int64 and uint64; larger Python ints cannot be encoded at all.
wire_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
non_neg_ints = st.integers(min_value=0, max_value=2**63 - 1)
positive_ints = st.integers(min_value=1, max_value=2**63 - 1)
# NaN is a valid float on the wire but never equal to itself, which a round trip compares.
floats = st.floats(allow_nan=False)
non_neg_floats = st.floats(min_value=0.0, allow_nan=False)
optional_floats = st.none() | floats
texts = st.text(max_size=40)

plain_values = st.recursive(
    st.none() | st.booleans() | wire_ints | floats | texts | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
metadata = st.dictionaries(texts, plain_values, max_size=5)

sampling_params = st.builds(
    SamplingParams,
    temperature=non_neg_floats,
    top_p=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    top_k=st.integers(min_value=-1, max_value=2**31),
    max_tokens=positive_ints,
    stop=st.lists(texts, max_size=3),
    stop_token_ids=st.lists(int32s, max_size=3),
    seed=st.none() | wire_ints,
)
chat_messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=texts,
    name=st.none() | texts,
)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    # Exactly one prompt form is set: chat messages or packed token ids.
    if draw(st.booleans()):
        prompt, prompt_tokens = draw(st.lists(chat_messages, min_size=1, max_size=4)), b""
    else:
        prompt, prompt_tokens = [], pack_i32(draw(st.lists(int32s, min_size=1, max_size=64)))
    return Task(
        id=draw(tokens),
        domain=draw(tokens),
        tier=draw(st.integers(min_value=0, max_value=TIERS - 1)),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        tools=draw(st.lists(texts, max_size=3)),
        sampling=draw(sampling_params),
        n=draw(st.integers(min_value=1, max_value=4096)),
        max_turns=draw(positive_ints),
        max_total_tokens=draw(st.none() | positive_ints),
        deadline=draw(optional_floats),
        attempt=draw(non_neg_ints),
        created_at=draw(optional_floats),
        metadata=draw(metadata),
    )


segments = st.builds(
    Segment,
    start=non_neg_ints,
    end=non_neg_ints,
    kind=st.sampled_from(["gen", "tool"]),
    version=st.none() | wire_ints,
)
tool_calls = st.builds(
    ToolCall,
    turn=non_neg_ints,
    name=texts,
    arguments=texts,
    output=texts,
    status=texts,
    duration_s=non_neg_floats,
)
timings = st.builds(
    Timings,
    queued_s=non_neg_floats,
    generate_s=non_neg_floats,
    tool_s=non_neg_floats,
    total_s=non_neg_floats,
)


@st.composite
def rollouts(draw: st.DrawFn) -> Rollout:
    # logprobs and loss_mask have one entry per completion token (tokens after prompt_len).
    ids = draw(st.lists(int32s, max_size=200))
    prompt_len = draw(st.integers(min_value=0, max_value=len(ids)))
    completion = len(ids) - prompt_len
    logprobs = draw(st.lists(st.floats(width=32), min_size=completion, max_size=completion))
    mask = draw(st.lists(st.integers(0, 1), min_size=completion, max_size=completion))
    return Rollout(
        id=draw(texts),
        task=draw(tasks()),
        sample_index=draw(non_neg_ints),
        tokens=pack_i32(ids),
        prompt_len=prompt_len,
        logprobs=pack_f32(logprobs),
        loss_mask=pack_u8(mask),
        segments=draw(st.lists(segments, max_size=3)),
        tool_calls=draw(st.lists(tool_calls, max_size=2)),
        completion_text=draw(texts),
        finish_reason=draw(st.sampled_from(FinishReason)),
        status=draw(st.sampled_from(RolloutStatus)),
        error=draw(st.none() | texts),
        timings=draw(timings),
        cached_prompt_tokens=draw(non_neg_ints),
        engine=draw(texts),
        generator=draw(texts),
        created_at=draw(optional_floats),
    )


scored_rollouts = st.builds(
    ScoredRollout,
    id=texts,
    rollout=rollouts(),
    reward=floats,
    status=st.sampled_from(ScoreStatus),
    details=st.lists(
        st.builds(
            ValidatorDetail,
            name=texts,
            score=floats,
            weight=floats,
            status=st.sampled_from(ScoreStatus),
            message=texts,
        ),
        max_size=3,
    ),
    error=st.none() | texts,
    validator=texts,
    scored_at=optional_floats,
)
sandbox_limits = st.builds(
    SandboxLimits,
    timeout_s=st.none() | st.floats(min_value=0.0, exclude_min=True, allow_nan=False),
    memory_mb=st.none() | positive_ints,
    pids=st.none() | positive_ints,
    cpus=st.none() | st.floats(min_value=0.0, exclude_min=True, allow_nan=False),
    output_bytes=st.none() | positive_ints,
    disk_mb=st.none() | positive_ints,
)


@st.composite
def sandbox_execs(draw: st.DrawFn) -> SandboxExec:
    # Exactly one of code (source) and command (argv) is set.
    code, command = (draw(texts), None) if draw(st.booleans()) else (None, draw(st.lists(texts)))
    return SandboxExec(
        id=draw(texts),
        session=draw(st.none() | texts),
        language=draw(texts),
        code=code,
        command=command,
        stdin=draw(st.binary(max_size=64)),
        files=draw(st.dictionaries(texts, st.binary(max_size=64), max_size=3)),
        limits=draw(sandbox_limits),
    )


sample_requests = st.builds(
    SampleRequest,
    id=texts,
    learner_version=non_neg_ints,
    max_samples=positive_ints,
    max_staleness=st.none() | non_neg_ints,
    domain_weights=st.dictionaries(texts, non_neg_floats, max_size=4),
    whole_groups=st.booleans(),
    wait_s=non_neg_floats,
)
error_events = st.builds(
    ErrorEvent,
    code=st.sampled_from(ErrorCode),
    message=texts,
    field=st.none() | texts,
    service=texts,
    instance=texts,
    subject=texts,
    trace_id=texts,
    original=st.binary(max_size=128),
    original_size=non_neg_ints,
    truncated=st.booleans(),
    at=floats,
)
messages = st.one_of(
    tasks(), rollouts(), scored_rollouts, sandbox_execs(), sample_requests, error_events
)

# ----------------------------------------------------------------- round trips


def assert_round_trip(message: Message) -> None:
    codec: Codec[Message] = Codec(type(message))
    data = codec.encode(message)
    assert codec.decode(data) == message
    assert ANY.decode(data) == message
    # A plain msgpack client that decodes and re-encodes changes nothing a reader sees.
    assert ANY.decode(msgpack.packb(msgpack.unpackb(data, raw=False), use_bin_type=True)) == message


@ROUND_TRIP
@given(tasks())
def test_task_round_trip(task: Task) -> None:
    assert_round_trip(task)


@ROUND_TRIP
@given(rollouts())
def test_rollout_round_trip(rollout: Rollout) -> None:
    assert_round_trip(rollout)
    completion = len(rollout.token_ids) - rollout.prompt_len
    assert len(rollout.behaviour_logprobs) == len(rollout.mask) == completion


@settings(ROUND_TRIP, max_examples=50)
@given(scored_rollouts)
def test_scored_rollout_round_trip(scored: ScoredRollout) -> None:
    assert_round_trip(scored)


@ROUND_TRIP
@given(sandbox_execs())
def test_sandbox_exec_round_trip(request: SandboxExec) -> None:
    assert_round_trip(request)


@ROUND_TRIP
@given(st.one_of(sample_requests, error_events))
def test_other_messages_round_trip(message: Message) -> None:
    assert_round_trip(message)


# ----------------------------------------------------------------- decoders never crash


def decode_or_reject(codec: Codec[Any], data: bytes) -> None:
    """Decoding yields a message or a DecodeError; anything else propagates and fails the test."""
    try:
        message = codec.decode(data)
    except DecodeError as error:
        assert isinstance(error.code, ErrorCode)
        assert error.message
        return
    # Whatever was accepted can be written again.
    codec.encode(message)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_only_raise_decode_error(data: bytes) -> None:
    for codec in CODECS:
        decode_or_reject(codec, data)


@FUZZ
@given(plain_values)
def test_arbitrary_msgpack_only_raises_decode_error(value: object) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    for codec in CODECS:
        decode_or_reject(codec, data)


@st.composite
def mutations(draw: st.DrawFn) -> bytes:
    """A valid encoding, damaged: truncated, bytes flipped, or spliced with other bytes."""
    data = bytearray(draw(st.sampled_from(ENCODED_EXAMPLES)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        kind = draw(st.sampled_from(["truncate", "flip", "set", "insert", "delete", "splice"]))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and data:
            data[at] ^= draw(st.integers(min_value=1, max_value=255))
        elif kind == "set" and data:
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
        elif kind == "splice":
            other = draw(st.sampled_from(ENCODED_EXAMPLES))
            start = draw(st.integers(min_value=0, max_value=len(other)))
            data[at:] = other[start:]
    return bytes(data)


@FUZZ
@given(mutations())
def test_damaged_encodings_only_raise_decode_error(data: bytes) -> None:
    for codec in CODECS:
        decode_or_reject(codec, data)


@settings(ROUND_TRIP, max_examples=100)
@given(st.sampled_from(ENCODED_EXAMPLES), st.data())
def test_every_strict_prefix_is_not_msgpack(data: bytes, draw: st.DataObject) -> None:
    end = draw.draw(st.integers(min_value=0, max_value=len(data) - 1))
    try:
        ANY.decode(data[:end])
    except DecodeError as error:
        assert error.code is ErrorCode.NOT_MSGPACK
    else:
        raise AssertionError("a truncated message decoded")
