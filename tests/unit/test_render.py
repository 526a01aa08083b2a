"""render.to_view: packed arrays as numbers, other bytes as base64, the rest plain builtins."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from protocol.codec import ANY, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    Batch,
    ChatMessage,
    ErrorEvent,
    Rollout,
    SandboxExec,
    ScoredRollout,
    Task,
)
from protocol.packed import pack_f32, pack_i32, pack_u8
from protocol.render import to_view
from tests.golden import examples

PROMPT = [11, 12]
COMPLETION = [-1, 2**31 - 1, 0]
LOGPROBS = [-0.5, -1.25, 0.0]  # exactly representable in float32
MASK = [1, 0, 1]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def token_task(**metadata: object) -> Task:
    return Task(id="t1", domain="math", prompt_tokens=pack_i32(PROMPT), metadata=metadata)


def rollout() -> Rollout:
    return Rollout(
        id="t1/0",
        task=token_task(),
        sample_index=0,
        tokens=pack_i32(PROMPT + COMPLETION),
        prompt_len=len(PROMPT),
        logprobs=pack_f32(LOGPROBS),
        loss_mask=pack_u8(MASK),
    )


def test_packed_arrays_become_lists() -> None:
    view = to_view(rollout())
    assert view["tokens"] == PROMPT + COMPLETION
    assert view["logprobs"] == LOGPROBS
    assert view["loss_mask"] == MASK
    assert view["task"]["prompt_tokens"] == PROMPT


def test_nested_packed_arrays_are_unpacked_at_every_depth() -> None:
    scored = ScoredRollout(id="t1/0", rollout=rollout(), reward=1.0)
    batch = Batch(request_id="r1", items=[scored, scored])
    view = to_view(batch)
    for item in view["items"]:
        assert item["rollout"]["tokens"] == PROMPT + COMPLETION
        assert item["rollout"]["task"]["prompt_tokens"] == PROMPT
        assert item["rollout"]["loss_mask"] == MASK


def test_other_bytes_become_base64() -> None:
    sandbox = SandboxExec(id="x1", code="print(1)", stdin=b"\x00\xff", files={"a.bin": b"\x01\x02"})
    view = to_view(sandbox)
    assert view["stdin"] == b64(b"\x00\xff")
    assert view["files"] == {"a.bin": b64(b"\x01\x02")}

    event = ErrorEvent(code=ErrorCode.NOT_MSGPACK, message="bad", original=b"\xc1garbage")
    assert to_view(event)["original"] == b64(b"\xc1garbage")


def test_bytes_under_a_packed_name_in_free_form_maps_stay_base64() -> None:
    # Only struct fields are packed arrays; user data keeps its bytes whatever the key.
    task = token_task(tokens=b"\x01\x00\x00\x00", logprobs=b"\x00\x00\x80\x3f", loss_mask=b"\x01")
    view = to_view(task)
    assert view["metadata"] == {
        "tokens": b64(b"\x01\x00\x00\x00"),
        "logprobs": b64(b"\x00\x00\x80\x3f"),
        "loss_mask": b64(b"\x01"),
    }
    sandbox = SandboxExec(id="x1", code="x", files={"tokens": b"\x01\x00\x00\x00"})
    assert to_view(sandbox)["files"] == {"tokens": b64(b"\x01\x00\x00\x00")}


def test_empty_packed_arrays_are_empty_lists() -> None:
    task = Task(id="t1", domain="math", prompt=[ChatMessage(role="user", content="hi")])
    assert to_view(task)["prompt_tokens"] == []


def test_view_keeps_the_tag_and_plain_fields() -> None:
    view = to_view(rollout())
    assert view["type"] == "rollout"
    assert view["v"] == 1
    assert view["status"] == "ok"
    assert view["task"]["type"] == "task"
    assert view["task"]["sampling"]["max_tokens"] == 256


@pytest.mark.parametrize("name", sorted(examples.examples()))
def test_every_golden_message_renders_to_json(name: str) -> None:
    message = examples.examples()[name]
    view = to_view(message)
    # JSON-able with the standard library: no bytes, no enums, no structs left.
    text = json.dumps(view)
    assert json.loads(text) == view
    # Apart from the unpacked arrays it matches msgspec's own builtins (base64 bytes).
    plain = msgspec.to_builtins(message)
    assert set(view) == set(plain)


def test_to_view_does_not_change_the_message() -> None:
    message = rollout()
    before = encode(message)
    to_view(message)
    assert encode(message) == before
    assert ANY.decode(before) == message
