"""Codec: round trips, interop with plain ``msgpack``, typed errors, size checks."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest

import protocol
from protocol import (
    ANY,
    DEFAULT_MAX_PAYLOAD,
    Codec,
    DecodeError,
    ErrorCode,
    Message,
    PayloadTooLarge,
    VersionError,
    check_size,
    headers_size,
)
from protocol.messages import (
    FinishReason,
    Rollout,
    RolloutStatus,
    SamplingParams,
    SandboxExec,
    Segment,
    Task,
    Timings,
)
from tests.golden.examples import examples

EXAMPLES = examples()
TAGS = sorted(EXAMPLES)


def plain(message: Message) -> dict[str, Any]:
    """What a plain msgpack client sees."""
    value = msgpack.unpackb(ANY.encode(message), raw=False)
    assert isinstance(value, dict)
    return value


def pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def decode_error(codec: Codec[Any], data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        codec.decode(data)
    return caught.value


def mutated(tag: str, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The example of ``tag`` as a plain map, changed, packed again."""
    value = plain(EXAMPLES[tag])
    change(value)
    return pack(value)


def minimal_task() -> dict[str, Any]:
    return {"type": "task", "v": 1, "id": "t1", "domain": "math", "prompt_tokens": pack_le(1, 2)}


def pack_le(*ids: int) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("tag", TAGS)
def test_round_trip_per_type_codec(tag: str) -> None:
    message = EXAMPLES[tag]
    codec: Codec[Message] = Codec(type(message))
    assert codec.decode(codec.encode(message)) == message


@pytest.mark.parametrize("tag", TAGS)
def test_round_trip_any(tag: str) -> None:
    message = EXAMPLES[tag]
    decoded = ANY.decode(ANY.encode(message))
    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize("tag", TAGS)
def test_every_codec_writes_the_same_bytes(tag: str) -> None:
    message = EXAMPLES[tag]
    assert Codec(type(message)).encode(message) == ANY.encode(message) == protocol.encode(message)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = ANY.encode(EXAMPLES["task"])
    assert ANY.decode(bytearray(data)) == ANY.decode(memoryview(data)) == EXAMPLES["task"]


def test_every_tag_has_an_example() -> None:
    assert set(EXAMPLES) == set(protocol.MESSAGE_TYPES)


# --------------------------------------------------------------------------- plain msgpack interop


@pytest.mark.parametrize("tag", TAGS)
def test_plain_msgpack_sees_a_map_with_type_and_v(tag: str) -> None:
    message = EXAMPLES[tag]
    value = plain(message)
    assert value["type"] == tag
    assert value["v"] == protocol.PROTOCOL_VERSION == 1
    field_names = {f.encode_name for f in msgspec.structs.fields(type(message))}
    assert set(value) == field_names | {"type"}


def test_plain_msgpack_sees_bin_for_bytes_and_str_for_enums() -> None:
    rollout = EXAMPLES["rollout"]
    assert isinstance(rollout, Rollout)
    value = plain(rollout)
    for name in ("tokens", "logprobs", "loss_mask"):
        assert type(value[name]) is bytes
    assert value["tokens"] == rollout.tokens
    assert value["finish_reason"] == "length"
    assert value["status"] == "invalid"
    assert value["task"]["type"] == "task"
    assert type(value["task"]["prompt_tokens"]) is bytes
    assert value["segments"][1] == {
        "start": 6,
        "end": 9,
        "kind": "tool",
        "version": None,
        "server": "",
        "cached_tokens": 0,
    }
    assert type(value["timings"]["total_s"]) is float


def test_floats_travel_as_float64() -> None:
    raw = ANY.encode(EXAMPLES["stats"])
    # 0.0625 as a msgpack float64 (0xcb + 8 big-endian bytes), never float32 (0xca).
    assert b"\xcb" + struct.pack(">d", 0.0625) in raw
    assert b"\xca" not in raw


@pytest.mark.parametrize("tag", TAGS)
def test_plain_msgpack_repack_decodes_to_the_typed_value(tag: str) -> None:
    assert ANY.decode(pack(plain(EXAMPLES[tag]))) == EXAMPLES[tag]


def test_hand_built_rollout_decodes() -> None:
    raw = pack(
        {
            "type": "rollout",
            "v": 1,
            "id": "t1/0",
            "task": minimal_task(),
            "sample_index": 0,
            "tokens": pack_le(1, 2, 3, 4, 5),
            "prompt_len": 2,
            "logprobs": struct.pack("<3f", -0.5, -1.0, 0.0),
            "loss_mask": bytes([1, 1, 0]),
            "segments": [
                {"start": 0, "end": 2, "version": 3},
                {"start": 2, "end": 3, "kind": "tool"},
            ],
            "finish_reason": "max_turns",
            "timings": {"total_s": 2},
        }
    )
    rollout = Codec(Rollout).decode(raw)
    assert rollout.task == Task(id="t1", domain="math", prompt_tokens=pack_le(1, 2))
    assert rollout.completion_ids.tolist() == [3, 4, 5]
    assert rollout.behaviour_logprobs.tolist() == [-0.5, -1.0, 0.0]
    assert rollout.mask.tolist() == [1, 1, 0]
    assert rollout.segments == [
        Segment(start=0, end=2, version=3),
        Segment(start=2, end=3, kind="tool"),
    ]
    assert rollout.policy_version == 3
    assert rollout.finish_reason is FinishReason.MAX_TURNS
    assert rollout.status is RolloutStatus.OK
    # An int where a float is declared is accepted (msgpack writers may shrink 2.0 to 2).
    assert rollout.timings == Timings(total_s=2.0)


def test_unknown_keys_are_ignored() -> None:
    def add_future_fields(value: dict[str, Any]) -> None:
        value["added_in_v1_9"] = {"nested": [1, 2, b"\x00"]}
        value["task"]["hint"] = "x"
        value["task"]["sampling"]["min_p"] = 0.05
        value["segments"][0]["engine_step"] = 17

    assert ANY.decode(mutated("rollout", add_future_fields)) == EXAMPLES["rollout"]


def test_missing_optional_fields_take_defaults() -> None:
    task = Codec(Task).decode(pack(minimal_task()))
    assert task == Task(id="t1", domain="math", prompt_tokens=pack_le(1, 2))
    assert task.tier == 1
    assert task.sampling == SamplingParams()
    assert task.deadline is None
    assert task.metadata == {}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({k: v for k, v in minimal_task().items() if k != "id"}, "$.id"),
        ({k: v for k, v in minimal_task().items() if k != "domain"}, "$.domain"),
        ({"type": "rollout", "v": 1, "id": "r", "sample_index": 0}, "$.task"),
        ({"type": "rollout", "v": 1, "id": "r", "task": minimal_task()}, "$.sample_index"),
        (
            {"type": "rollout", "v": 1, "id": "r", "sample_index": 0, "task": {"type": "task"}},
            "$.task.id",
        ),
        ({"type": "error", "v": 1, "message": "m"}, "$.code"),
    ],
)
def test_missing_required_field_is_named(raw: dict[str, Any], field: str) -> None:
    for codec in (ANY, Codec(protocol.MESSAGE_TYPES[raw["type"]])):
        error = decode_error(codec, pack(raw))
        assert error.code is ErrorCode.VALIDATION
        assert error.field == field


def test_missing_type_tag() -> None:
    raw = {k: v for k, v in minimal_task().items() if k != "type"}
    error = decode_error(ANY, pack(raw))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$.type")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\xff\xff\xff", b"\x81", b"\x92\x01", b"\xdf\xff\xff\xff\xff", b"{}"],
)
def test_garbage_is_not_msgpack(data: bytes) -> None:
    for codec in (ANY, Codec(Task)):
        error = decode_error(codec, data)
        assert error.code in (ErrorCode.NOT_MSGPACK, ErrorCode.VALIDATION)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\xa3ab", pack(minimal_task()) + b"\x00"])
def test_malformed_msgpack_code(data: bytes) -> None:
    assert decode_error(ANY, data).code is ErrorCode.NOT_MSGPACK


@pytest.mark.parametrize("value", [5, "task", [1, 2], None, b"\x00"])
def test_valid_msgpack_that_is_not_a_map(value: object) -> None:
    error = decode_error(ANY, pack(value))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$")


@pytest.mark.parametrize("tag", TAGS)
def test_every_truncation_is_a_decode_error(tag: str) -> None:
    data = ANY.encode(EXAMPLES[tag])
    codec: Codec[Message] = Codec(type(EXAMPLES[tag]))
    for end in range(len(data)):
        assert decode_error(ANY, data[:end]).code is ErrorCode.NOT_MSGPACK
        assert decode_error(codec, data[:end]).code is ErrorCode.NOT_MSGPACK


@pytest.mark.parametrize("tag", TAGS)
def test_wrong_version(tag: str) -> None:
    data = mutated(tag, lambda value: value.update(v=2))
    for codec in (ANY, Codec(type(EXAMPLES[tag]))):
        error = decode_error(codec, data)
        assert isinstance(error, VersionError)
        assert (error.code, error.field) == (ErrorCode.UNSUPPORTED_VERSION, "$.v")
        assert (error.got, error.supported) == (2, 1)


def test_wrong_version_wins_over_validation() -> None:
    # A v2 message may have changed a field; blame the version, not the field.
    data = pack({**minimal_task(), "v": 2, "n": "many", "id": 7})
    error = decode_error(ANY, data)
    assert isinstance(error, VersionError)
    assert error.field == "$.v"


@pytest.mark.parametrize("value", [True, 1.0, "1", None])
def test_version_of_the_wrong_type(value: object) -> None:
    error = decode_error(ANY, pack({**minimal_task(), "v": value}))
    assert error.code in (ErrorCode.VALIDATION, ErrorCode.UNSUPPORTED_VERSION)
    assert error.field == "$.v"


#: (example tag, change, path of the nested ``v``): every place a message nests another.
NESTED_VERSIONS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("rollout", lambda r: r["task"].update(v=99), "$.task.v"),
    ("call_result", lambda c: c["rollouts"][0]["task"].update(v=3), "$.rollouts[0].task.v"),
    ("scored_rollout", lambda s: s["rollout"].update(v=2), "$.rollout.v"),
    ("scored_rollout", lambda s: s["rollout"]["task"].update(v=99), "$.rollout.task.v"),
    ("batch", lambda b: b["items"][1]["rollout"]["task"].update(v=0), "$.items[1].rollout.task.v"),
    ("batch", lambda b: b["items"][0].update(v=2), "$.items[0].v"),
    ("domain_list", lambda d: d["domains"][0]["example"].update(v=7), "$.domains[0].example.v"),
]


def test_every_nesting_of_a_message_is_covered() -> None:
    covered = {tag for tag, _, _ in NESTED_VERSIONS}
    holders = {tag for tag, cls in protocol.MESSAGE_TYPES.items() if Codec(cls)._nested}
    assert holders <= covered, f"nested messages without a version test: {holders - covered}"


@pytest.mark.parametrize(("tag", "change", "field"), NESTED_VERSIONS)
def test_nested_wrong_version_is_named(
    tag: str, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    data = mutated(tag, change)
    for codec in (ANY, Codec(type(EXAMPLES[tag]))):
        error = decode_error(codec, data)
        assert isinstance(error, VersionError), error.message
        assert (error.code, error.field) == (ErrorCode.UNSUPPORTED_VERSION, field)
        assert error.supported == 1 and error.got != 1
        assert field in error.message


@pytest.mark.parametrize(("tag", "change", "field"), NESTED_VERSIONS)
def test_nested_wrong_version_wins_over_nested_validation(
    tag: str, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    # The nested message of another version may have changed the field it trips over.
    def broken(value: dict[str, Any]) -> None:
        change(value)
        nested: Any = value
        for step in re.findall(r"\.(\w+)|\[(\d+)\]", field.removesuffix(".v")):
            nested = nested[step[0]] if step[0] else nested[int(step[1])]
        nested["id"] = 7  # every nested message has a string id

    for codec in (ANY, Codec(type(EXAMPLES[tag]))):
        error = decode_error(codec, mutated(tag, broken))
        assert (error.code, error.field) == (ErrorCode.UNSUPPORTED_VERSION, field)


def test_nested_without_v_takes_this_version() -> None:
    # ``v`` has a default: an old writer that left it out of the nested task is still v1.
    data = mutated("scored_rollout", lambda s: s["rollout"]["task"].pop("v"))
    assert ANY.decode(data) == EXAMPLES["scored_rollout"]


@pytest.mark.parametrize("value", [True, 1.0, "1", None])
def test_nested_version_of_the_wrong_type(value: object) -> None:
    data = mutated("rollout", lambda r: r["task"].update(v=value))
    error = decode_error(Codec(Rollout), data)
    assert error.code in (ErrorCode.VALIDATION, ErrorCode.UNSUPPORTED_VERSION)
    assert error.field == "$.task.v"


@pytest.mark.parametrize("value", ["2", 2.5, [2], {"major": 2}, False])
@pytest.mark.parametrize(("tag", "where"), [("task", ()), ("scored_rollout", ("rollout", "task"))])
def test_a_version_that_is_no_integer_is_a_validation_error(
    value: object, tag: str, where: tuple[str, ...]
) -> None:
    def change(message: dict[str, Any]) -> None:
        for key in where:
            message = message[key]
        message["v"] = value

    error = decode_error(ANY, mutated(tag, change))
    assert (error.code, error.field) == (
        ErrorCode.VALIDATION,
        "$" + "".join(f".{k}" for k in where) + ".v",
    )


def _at_stack_depth(depth: int, call: Callable[[], DecodeError]) -> DecodeError:
    return call() if depth == 0 else _at_stack_depth(depth - 1, call)


@pytest.mark.parametrize("nesting", [850, 950, 990])
def test_a_deeply_nested_version_gets_one_answer_wherever_it_is_decoded(nesting: int) -> None:
    # Nesting close to the recursion limit decodes, or not, depending on how deep in the
    # stack the decoder is called; the error must not depend on it.
    fields = {k: v for k, v in minimal_task().items() if k != "v"}
    data = pack({**fields, "v": None})[:-1] + b"\x91" * nesting + b"\xc0"  # None packs last
    answers = {
        (error.code, error.field, type(error))
        for error in (
            _at_stack_depth(depth, lambda: decode_error(ANY, data)) for depth in (0, 200, 600)
        )
    }
    assert answers == {(ErrorCode.VALIDATION, "$.v", DecodeError)}


@pytest.mark.parametrize("tag", ["nope", "Task", "", "task.v2"])
def test_unknown_type_tag(tag: str) -> None:
    for codec in (ANY, Codec(Task)):
        error = decode_error(codec, pack({**minimal_task(), "type": tag}))
        assert (error.code, error.field) == (ErrorCode.UNKNOWN_TYPE, "$.type")


def test_known_tag_on_the_wrong_codec() -> None:
    error = decode_error(Codec(Task), ANY.encode(EXAMPLES["rollout"]))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$.type")


@pytest.mark.parametrize(
    ("tag", "change", "field"),
    [
        ("task", lambda t: t.update(n="eight"), "$.n"),
        ("task", lambda t: t.update(n=0), "$.n"),
        ("task", lambda t: t.update(n=4097), "$.n"),
        ("task", lambda t: t["sampling"].update(temperature="hot"), "$.sampling.temperature"),
        ("task", lambda t: t["sampling"].update(temperature=-0.1), "$.sampling.temperature"),
        ("task", lambda t: t["sampling"].update(top_p=0.0), "$.sampling.top_p"),
        ("task", lambda t: t["sampling"].update(top_k=-2), "$.sampling.top_k"),
        ("task", lambda t: t["prompt"][1].update(role="bot"), "$.prompt[1].role"),
        ("task", lambda t: t.update(metadata={1: 2}), "$.metadata"),
        ("task", lambda t: t.update(prompt="hi"), "$.prompt"),
        ("rollout", lambda r: r["task"].update(id=5), "$.task.id"),
        ("rollout", lambda r: r.update(tokens="abcd"), "$.tokens"),
        ("rollout", lambda r: r.update(sample_index=-1), "$.sample_index"),
        ("rollout", lambda r: r["segments"][2].update(kind="llm"), "$.segments[2].kind"),
        ("rollout", lambda r: r.update(finish_reason="done"), "$.finish_reason"),
        ("sandbox_exec", lambda s: s["limits"].update(timeout_s=0), "$.limits.timeout_s"),
        ("sandbox_exec", lambda s: s["files"].update({"x": "text"}), "$.files[...]"),
        (
            "sample_request",
            lambda s: s["domain_weights"].update(math=-1.0),
            "$.domain_weights[...]",
        ),
        (
            "batch",
            lambda b: b["items"][1]["rollout"]["task"].update(tier=9),
            "$.items[1].rollout.task.tier",
        ),
        ("error", lambda e: e.update(code="oops"), "$.code"),
    ],
)
def test_wrong_field_is_named(
    tag: str, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    data = mutated(tag, change)
    for codec in (ANY, Codec(type(EXAMPLES[tag]))):
        error = decode_error(codec, data)
        assert (error.code, error.field) == (ErrorCode.VALIDATION, field), error.message
        assert field in error.message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.update(logprobs=r["logprobs"][:-4]), "$.logprobs"),
        (lambda r: r.update(logprobs=r["logprobs"] + b"\x00\x00\x80\xbf"), "$.logprobs"),
        (lambda r: r.update(loss_mask=r["loss_mask"][:-1]), "$.logprobs"),
        (lambda r: r.update(logprobs=r["logprobs"][:-1]), "$.logprobs"),
        (lambda r: r.update(tokens=r["tokens"][:-2]), "$.tokens"),
        (lambda r: r.update(prompt_len=1000), "$.prompt_len"),
        (lambda r: r["task"].update(prompt_tokens=b"\x01\x00\x00"), "$.task.prompt_tokens"),
    ],
)
def test_inconsistent_packed_arrays(change: Callable[[dict[str, Any]], None], field: str) -> None:
    error = decode_error(Codec(Rollout), mutated("rollout", change))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, field), error.message


@pytest.mark.parametrize("bad", ["a.b", "a b", "", "*", ">", "-x", "_x", "a\n", "é", "a" * 129])
@pytest.mark.parametrize("name", ["id", "domain"])
def test_ids_and_domains_must_be_subject_tokens(name: str, bad: str) -> None:
    error = decode_error(ANY, pack({**minimal_task(), name: bad}))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, f"$.{name}")


def test_a_task_without_tenant_decodes_as_the_default_tenant() -> None:
    """Writers from before tenants send no ``tenant`` (nor does the golden task)."""
    golden = (Path(__file__).parents[1] / "golden" / "v1" / "task.msgpack").read_bytes()
    for data in (pack(minimal_task()), golden):
        assert "tenant" not in msgpack.unpackb(data, raw=False)
        for codec in (ANY, Codec(Task)):
            decoded = codec.decode(data)
            assert isinstance(decoded, Task) and decoded.tenant == ""


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "-x", "_x", "a\n", "é", "a" * 129, 7])
def test_a_tenant_is_a_subject_token_or_empty(bad: object) -> None:
    error = decode_error(ANY, pack({**minimal_task(), "tenant": bad}))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$.tenant")
    assert Codec(Task).decode(pack({**minimal_task(), "tenant": "acme-1"})).tenant == "acme-1"


@pytest.mark.parametrize("good", ["a", "A-1_b", "0" * 128, "task-0001"])
def test_token_boundaries_accepted(good: str) -> None:
    assert Codec(Task).decode(pack({**minimal_task(), "id": good})).id == good


@pytest.mark.parametrize("tier", [-1, 4, 100])
def test_tier_out_of_range(tier: int) -> None:
    error = decode_error(ANY, pack({**minimal_task(), "tier": tier}))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$.tier")


@pytest.mark.parametrize("tier", range(protocol.TIERS))
def test_tiers_in_range(tier: int) -> None:
    assert Codec(Task).decode(pack({**minimal_task(), "tier": tier})).tier == tier


@pytest.mark.parametrize(
    "prompt", [{}, {"prompt": [{"role": "user", "content": "hi"}]}], ids=["neither", "both"]
)
def test_task_needs_exactly_one_prompt_form(prompt: dict[str, Any]) -> None:
    raw = {k: v for k, v in minimal_task().items() if k != "prompt_tokens"}
    if prompt:
        raw = {**minimal_task(), **prompt}
    error = decode_error(ANY, pack(raw))
    assert (error.code, error.field) == (ErrorCode.VALIDATION, "$")


@pytest.mark.parametrize("extra", [{}, {"code": "x", "command": ["ls"]}], ids=["neither", "both"])
def test_sandbox_exec_needs_code_or_command(extra: dict[str, Any]) -> None:
    error = decode_error(ANY, pack({"type": "sandbox_exec", "v": 1, "id": "e", **extra}))
    assert error.code is ErrorCode.VALIDATION
    ok = {"type": "sandbox_exec", "v": 1, "id": "e", "command": ["ls", "-l"]}
    assert ANY.decode(pack(ok)) == SandboxExec(id="e", command=["ls", "-l"])


def test_deep_nesting_is_a_decode_error() -> None:
    # Nesting past the recursion limit, inside a free-form field, must not escape as RecursionError.
    head = pack(minimal_task())
    count = head[0] & 0x0F
    deep = b"\x91" * 100_000 + b"\xc0"
    data = bytes([0x80 | (count + 1)]) + head[1:] + pack("metadata") + b"\x81\xa1k" + deep
    for codec in (ANY, Codec(Task)):
        assert decode_error(codec, data).code is ErrorCode.VALIDATION


def test_decode_error_hierarchy() -> None:
    assert issubclass(VersionError, DecodeError)
    assert issubclass(DecodeError, protocol.ProtocolError)


# --------------------------------------------------------------------------- size


def test_headers_size_is_the_exact_header_block() -> None:
    headers = {"Nats-Msg-Id": "task-0001", "Temper-Trace-Id": "4bf9", "Temper-Version": "1"}
    block = (
        b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"
    )
    assert headers_size(headers) == len(block)


def test_headers_size_counts_utf8_bytes() -> None:
    assert headers_size({"K": "é"}) == len("NATS/1.0\r\nK: é\r\n\r\n".encode())


@pytest.mark.parametrize("headers", [None, {}])
def test_no_headers_no_block(headers: dict[str, str] | None) -> None:
    assert headers_size(headers) == 0


def test_check_size_limit_is_inclusive() -> None:
    headers = {"Nats-Msg-Id": "x"}
    limit = 100
    fits = b"\x00" * (limit - headers_size(headers))
    check_size(fits, headers, limit)
    with pytest.raises(PayloadTooLarge) as caught:
        check_size(fits + b"\x00", headers, limit)
    error = caught.value
    assert (error.size, error.limit, error.code) == (limit + 1, limit, ErrorCode.TOO_LARGE)
    assert str(limit + 1) in str(error)


def test_default_max_payload_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_PAYLOAD == 1024 * 1024
    check_size(b"\x00" * DEFAULT_MAX_PAYLOAD, None, DEFAULT_MAX_PAYLOAD)
    with pytest.raises(PayloadTooLarge):
        check_size(b"\x00" * DEFAULT_MAX_PAYLOAD, {"K": "v"}, DEFAULT_MAX_PAYLOAD)
