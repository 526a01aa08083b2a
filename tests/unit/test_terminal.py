"""The terminal family without servers: templates, tasks, the judge on a fake sandbox,
and the generator opening a trajectory's session with the task's files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from protocol.messages import (
    Rollout,
    RolloutStatus,
    Segment,
    ToolCall,
)
from services.domains.api import SANDBOX_FILES, DomainError
from services.domains.terminal.family import CATEGORIES, TEMPLATES, domain, problem
from services.generator.agent import AgentLoop
from services.model.tokens import ChatTokenizer
from services.validator.catalog import metadata_keys
from services.validator.factory import Resources, build
from services.validator.terminal import chain, commands
from tests.unit.test_generator_agent import RecordingTools, ScriptedEngine

TERMINAL = domain("terminal", {})


def test_at_least_30_distinct_templates_each_deterministic_in_its_seed() -> None:
    assert len(TEMPLATES) >= 30
    assert sum(len(group) for group in CATEGORIES.values()) == len(TEMPLATES)
    prompts = set()
    for name, template in TEMPLATES.items():
        first, again = template(random.Random(11)), template(random.Random(11))
        assert first == again, name
        other = template(random.Random(12))
        assert (first.files, first.prompt) != (other.files, other.prompt), name
        assert first.files and first.checks and first.solution, name
        assert all(c.name.isidentifier() and c.message for c in first.checks), name
        prompts.add(first.prompt)
    assert len(prompts) == len(TEMPLATES)


def test_tasks_carry_files_and_checks_never_in_the_prompt() -> None:
    train = TERMINAL.make_tasks(40, "train", seed=3)
    held = TERMINAL.make_tasks(40, "eval", seed=3)
    assert {t.metadata["key"] for t in train}.isdisjoint({t.metadata["key"] for t in held})
    assert TERMINAL.make_tasks(40, "train", seed=3) == train
    for task in train:
        assert task.tools == ["bash"] and task.max_turns == 8
        assert task.metadata[SANDBOX_FILES] and task.metadata["checks"]
        shown = " ".join(m.content for m in task.prompt)
        assert all(json.dumps(c["probe"]) not in shown for c in task.metadata["checks"])
    assert metadata_keys(TERMINAL) == [SANDBOX_FILES, "checks"]
    assert {t.metadata["template"] for t in train + held} <= set(TEMPLATES)


def test_domain_parameters_are_checked() -> None:
    assert domain("t-logs", {"category": "logs"}).source.templates == tuple(CATEGORIES["logs"])  # type: ignore[attr-defined]
    with pytest.raises(DomainError, match="category"):
        domain("t", {"category": "games"})
    with pytest.raises(DomainError, match="unknown parameters"):
        domain("t", {"timeout": 3})


def call(name: str, code: str, status: str = "ok", turn: int = 0) -> ToolCall:
    body = json.dumps({"name": name, "arguments": {"code": code}})
    return ToolCall(turn=turn, name=name, arguments=body, status=status)


def rollout_of(template: str, calls: list[ToolCall], turns: int = 0, seed: int = 1) -> Rollout:
    made = TEMPLATES[template](random.Random(seed))
    task = TERMINAL.task(problem(template, made), "train", 0, 0)
    segments = [Segment(start=i, end=i + 1, kind="gen") for i in range(turns)]
    return Rollout(id="r/0", task=task, sample_index=0, tool_calls=calls, segments=segments)


def test_only_calls_that_ran_a_command_are_replayed_in_order() -> None:
    calls = [
        call("bash", "ls"),
        ToolCall(turn=1, name="", arguments="<tool_call>{", status="invalid"),
        call("python", "print(1)", status="error"),
        call("bash", "cat x", status="nonzero_exit"),
        ToolCall(turn=4, name="bash", arguments='{"name": "bash"}', status="ok"),
    ]
    assert commands(calls) == [("bash", "ls"), ("bash", "cat x")]


def test_chain_counts_failures_and_recoveries() -> None:
    calls = [call("bash", "a", "nonzero_exit"), call("bash", "b"), call("bash", "c", "timeout")]
    assert chain(rollout_of("crlf", calls, turns=4)) == ("4 turns, 3 calls, 2 failed, 1 recovered")


def test_the_validator_needs_sandbox_sessions() -> None:
    [spec] = TERMINAL.validators
    with pytest.raises(DomainError, match="sandbox sessions"):
        build(spec, TERMINAL, Resources(), {})


async def test_the_generator_opens_the_session_with_the_task_files(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    body = json.dumps({"name": "bash", "arguments": {"code": "ls"}})
    engine = ScriptedEngine(
        [tokenizer.encode(f"<tool_call>{body}</tool_call>"), tokenizer.encode("Done.")]
    )
    tools = RecordingTools()
    task = TERMINAL.make_tasks(1, seed=5)[0]
    [generated] = await AgentLoop(engine, tokenizer, tools).run(task)
    expected = {p: t.encode() for p, t in task.metadata[SANDBOX_FILES].items()}
    assert tools.files == [expected]
    assert generated.tool_calls[0].name == "bash"


async def test_sandbox_files_that_are_not_text_make_the_rollout_invalid(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model)
    body = json.dumps({"name": "bash", "arguments": {"code": "ls"}})
    engine = ScriptedEngine([tokenizer.encode(f"<tool_call>{body}</tool_call>")])
    task = TERMINAL.make_tasks(1, seed=5)[0]
    bad = msgspec.structs.replace(task, metadata={**task.metadata, SANDBOX_FILES: ["a.txt"]})
    [generated] = await AgentLoop(engine, tokenizer, RecordingTools()).run(bad)
    assert generated.status is RolloutStatus.INVALID
    assert SANDBOX_FILES in (generated.error or "")
