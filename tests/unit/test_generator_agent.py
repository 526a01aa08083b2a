"""The agent loop on a scripted engine (a test double replaying given outputs) and the
real tokenizer of the tiny model: turn boundaries, masks, limits, failures."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from protocol.messages import (
    ChatMessage,
    FinishReason,
    RolloutStatus,
    SamplingParams,
    Task,
)
from protocol.packed import pack_i32
from services.engines.engine import (
    EngineError,
    GenerateRequest,
    InvalidRequestError,
    Sample,
)
from services.generator.agent import AgentLoop
from services.generator.tools import LocalTools, ToolInfraError, ToolSession
from services.generator.trajectory import LoopLimits
from services.model.tokens import ChatTokenizer
from services.model.tool_format import parse_tool_call
from tests.engines import ScriptedTurns


class ScriptedEngine(ScriptedTurns):
    """Replays scripted turns (token ids) and records every request it got."""

    def __init__(
        self, turns: list[list[int]], *, fail_at: int | None = None, refuse: bool = False
    ) -> None:
        self._turns: Iterator[list[int]] = iter(turns)
        self.requests: list[GenerateRequest] = []
        self._fail_at = fail_at
        self._refuse = refuse

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        if self._refuse:
            raise InvalidRequestError("prompt token id outside the vocabulary [0, 2048)")
        if self._fail_at is not None and len(self.requests) > self._fail_at:
            raise EngineError("scripted engine failure")
        samples = []
        for _ in range(request.n):
            ids = next(self._turns)[: request.sampling.max_new_tokens]
            stop = bool(ids) and ids[-1] in request.sampling.stop_token_ids
            samples.append(
                Sample(
                    output_ids=ids,
                    logprobs=[-0.5] * len(ids),
                    finish="stop" if stop else "length",
                    cached_tokens=len(request.prompt_ids) // 2,
                    version=3,
                )
            )
        return samples


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> ChatTokenizer:
    return ChatTokenizer.load(tiny_model)


def _task(**kwargs: object) -> Task:
    base: dict[str, object] = {
        "id": "t1",
        "domain": "toolcalc",
        "prompt": [ChatMessage(role="user", content="add 2 and 3")],
        "sampling": SamplingParams(max_tokens=64),
    }
    base.update(kwargs)
    return Task(**base)  # type: ignore[arg-type]


def _call(tokenizer: ChatTokenizer, body: dict[str, object]) -> list[int]:
    return tokenizer.encode(f"<tool_call>{json.dumps(body)}</tool_call>")


async def test_tool_turns_append_ids_without_retokenizing(tokenizer: ChatTokenizer) -> None:
    call = _call(tokenizer, {"name": "add", "arguments": {"a": 2, "b": 3}})
    answer = tokenizer.encode("<answer>5</answer>") + list(tokenizer.eos_ids)
    engine = ScriptedEngine([call, answer])
    loop = AgentLoop(engine, tokenizer, LocalTools())
    [rollout] = await loop.run(_task(tools=["add"], max_turns=3))

    prompt = tokenizer.render(_task().prompt)
    observation = tokenizer.encode(tokenizer.observation("5"))
    assert rollout.status is RolloutStatus.OK
    assert list(rollout.token_ids) == prompt + call + observation + answer
    # The second turn was asked for exactly the ids so far: no text round trip in between.
    assert list(engine.requests[1].prompt_ids) == prompt + call + observation
    assert list(rollout.mask) == [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    lp = list(rollout.behaviour_logprobs)
    assert lp[len(call) : len(call) + len(observation)] == [0.0] * len(observation)
    assert [s.kind for s in rollout.segments] == ["gen", "tool", "gen"]
    assert [s.version for s in rollout.segments] == [3, None, 3]
    assert rollout.tool_calls[0].name == "add" and rollout.tool_calls[0].output == "5"
    assert rollout.finish_reason is FinishReason.STOP
    assert "<answer>5</answer>" in rollout.completion_text


class RecordingTools(LocalTools):
    """LocalTools that remember which id each tool session was opened for, and with
    which files."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.files: list[Mapping[str, bytes] | None] = []

    async def open(
        self,
        trajectory_id: str,
        allowed: tuple[str, ...],
        files: Mapping[str, bytes] | None = None,
        snapshot: str | None = None,
    ) -> ToolSession:
        self.opened.append(trajectory_id)
        self.files.append(files)
        return await super().open(trajectory_id, allowed, files, snapshot)


async def test_every_turn_of_every_sample_routes_by_the_task_id(tokenizer: ChatTokenizer) -> None:
    call = _call(tokenizer, {"name": "echo", "arguments": {"x": 1}})
    engine = ScriptedEngine([call] * 6)
    tools = RecordingTools()
    rollouts = await AgentLoop(engine, tokenizer, tools).run(
        _task(tools=["echo"], max_turns=3, n=2)
    )
    assert [r.finish_reason for r in rollouts] == [FinishReason.MAX_TURNS] * 2
    # Turn 1 (both samples at once), then turns 2 and 3 of each sample.
    assert [r.n for r in engine.requests] == [2, 1, 1, 1, 1]
    # One server holds the group's prompt and each sample's later turns extend it.
    assert {r.trajectory_id for r in engine.requests} == {"t1"}
    # Tool state stays private to each sample.
    assert sorted(tools.opened) == ["t1/0", "t1/1"]


async def test_max_turns_stops_a_conversation_that_keeps_calling(tokenizer: ChatTokenizer) -> None:
    call = _call(tokenizer, {"name": "echo", "arguments": {"x": 1}})
    engine = ScriptedEngine([call, call, call])
    [rollout] = await AgentLoop(engine, tokenizer, LocalTools()).run(
        _task(tools=["echo"], max_turns=2)
    )
    assert rollout.finish_reason is FinishReason.MAX_TURNS
    assert len(engine.requests) == 2
    assert len(rollout.tool_calls) == 1


async def test_malformed_call_is_shown_to_the_model_not_an_infra_failure(
    tokenizer: ChatTokenizer,
) -> None:
    bad = tokenizer.encode("<tool_call>{not json</tool_call>")
    engine = ScriptedEngine([bad, list(tokenizer.eos_ids)])
    [rollout] = await AgentLoop(engine, tokenizer, LocalTools()).run(
        _task(tools=["add"], max_turns=2)
    )
    assert rollout.status is RolloutStatus.OK
    assert rollout.tool_calls[0].status == "invalid"
    assert "not valid JSON" in rollout.tool_calls[0].output


async def test_group_of_n_samples_gets_distinct_ids(tokenizer: ChatTokenizer) -> None:
    outs = [tokenizer.encode(str(i)) + list(tokenizer.eos_ids) for i in range(4)]
    rollouts = await AgentLoop(ScriptedEngine(outs), tokenizer, LocalTools()).run(_task(n=4))
    assert [r.id for r in rollouts] == [f"t1/{i}" for i in range(4)]
    assert [r.sample_index for r in rollouts] == [0, 1, 2, 3]
    assert len({r.completion_text for r in rollouts}) == 4


async def test_prompt_longer_than_the_context_is_invalid(tokenizer: ChatTokenizer) -> None:
    engine = ScriptedEngine([])
    loop = AgentLoop(engine, tokenizer, LocalTools(), LoopLimits(context_len=16))
    task = _task(prompt=[], prompt_tokens=pack_i32(list(range(40))), n=2)
    rollouts = await loop.run(task)
    assert [r.status for r in rollouts] == [RolloutStatus.INVALID] * 2
    assert "40 tokens" in (rollouts[0].error or "")
    assert engine.requests == []


async def test_engine_error_is_infra_failure_never_an_output(tokenizer: ChatTokenizer) -> None:
    call = _call(tokenizer, {"name": "add", "arguments": {"a": 1}})
    engine = ScriptedEngine([call], fail_at=1)
    [rollout] = await AgentLoop(engine, tokenizer, LocalTools()).run(
        _task(tools=["add"], max_turns=3)
    )
    assert rollout.status is RolloutStatus.INFRA_FAILURE
    assert rollout.finish_reason is FinishReason.ERROR
    assert "scripted engine failure" in (rollout.error or "")


async def test_first_turn_engine_error_fails_every_sample(tokenizer: ChatTokenizer) -> None:
    rollouts = await AgentLoop(ScriptedEngine([], fail_at=0), tokenizer, LocalTools()).run(
        _task(n=3)
    )
    assert [r.status for r in rollouts] == [RolloutStatus.INFRA_FAILURE] * 3
    assert all(r.logprobs == b"" and r.prompt_len > 0 for r in rollouts)


async def test_a_request_the_engine_refuses_is_invalid(tokenizer: ChatTokenizer) -> None:
    task = _task(prompt=[], prompt_tokens=pack_i32([5, 99999]), n=2)
    rollouts = await AgentLoop(ScriptedEngine([], refuse=True), tokenizer, LocalTools()).run(task)
    assert [r.status for r in rollouts] == [RolloutStatus.INVALID] * 2
    assert "vocabulary" in (rollouts[0].error or "")


async def test_tool_machinery_failure_is_infra_failure(tokenizer: ChatTokenizer) -> None:
    class BrokenTools:
        async def open(
            self,
            trajectory_id: str,
            allowed: tuple[str, ...],
            files: object = None,
            snapshot: object = None,
        ) -> object:
            raise ToolInfraError("no sandbox service answered")

    call = _call(tokenizer, {"name": "python", "arguments": {"code": "print(1)"}})
    [rollout] = await AgentLoop(ScriptedEngine([call]), tokenizer, BrokenTools()).run(  # type: ignore[arg-type]
        _task(tools=["python"], max_turns=3)
    )
    assert rollout.status is RolloutStatus.INFRA_FAILURE
    assert "no sandbox service answered" in (rollout.error or "")


async def test_total_token_budget_caps_generation(tokenizer: ChatTokenizer) -> None:
    long = list(range(100, 160))
    engine = ScriptedEngine([long])
    prompt_len = len(tokenizer.render(_task().prompt))
    [rollout] = await AgentLoop(engine, tokenizer, LocalTools()).run(
        _task(max_total_tokens=prompt_len + 10)
    )
    assert engine.requests[0].sampling.max_new_tokens == 10
    assert len(rollout.completion_ids) == 10
    assert rollout.finish_reason is FinishReason.LENGTH


async def test_stop_ids_include_eos_tool_end_and_single_token_stops(
    tokenizer: ChatTokenizer,
) -> None:
    engine = ScriptedEngine([list(tokenizer.eos_ids)])
    sampling = SamplingParams(stop=["\n", "two tokens here"], stop_token_ids=[7], seed=11)
    await AgentLoop(engine, tokenizer, LocalTools()).run(_task(tools=["add"], sampling=sampling))
    stops = set(engine.requests[0].sampling.stop_token_ids)
    assert {7, *tokenizer.eos_ids, tokenizer.tool_call_end_id} <= stops
    assert tokenizer.encode("\n")[0] in stops
    assert engine.requests[0].sampling.seed == 11


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "add"),
        ("text <tool_call>[1, 2]</tool_call>", 'string "name"'),
        ('<tool_call>{"name": "x", "arguments": 3}</tool_call>', "must be an object"),
        ("no call at all", "no <tool_call>"),
    ],
)
def test_parse_tool_call(text: str, expected: str) -> None:
    parsed = parse_tool_call(text)
    found = parsed if isinstance(parsed, str) else parsed.name
    assert expected in found
