"""Cheats on the tool domain the warm-up's recovery references teach (a failed call, the
sandbox's error, the fixed call), through the running validator service: the failed call
alone with a guess, a call written but never run, the error text passed off as the
answer.  Only the right final answer after a call earns more than the call's share."""

from __future__ import annotations

import json
from pathlib import Path

from protocol.messages import ScoreStatus, Task, ToolCall
from services.domains.tool_use import NAME_ERROR, domain
from services.validator import ValidatorService
from tests.integration.support import client
from tests.integration.test_validator_service import (
    make_rollout,
    publish,
    scored_results,
    settings,
)

#: The tool run's domain, as the validator service loads it (recovery changes only the
#: warm-up's references, not the task or its validators).
TOOLS = Path(__file__).resolve().parents[2] / "deploy" / "runs" / "domains" / "tools.toml"
#: Case name -> (completion, its tool calls, the most it deserves).
Cases = dict[str, tuple[str, list[ToolCall], float]]


async def test_tool_cheats_score_no_more_than_they_deserve(nats_url: str) -> None:
    modpow = domain("modpow", {"task": "modpow", "recovery": 1.0})
    (example,) = modpow.examples(1, "train", seed=0)
    task, answer = example.task, str(example.task.metadata["answer"])
    broken, fixed, final = example.reference.split("\n")
    failed = ToolCall(
        turn=0, name="python", arguments=_code(broken), output=NAME_ERROR, status="nonzero_exit"
    )
    ran = ToolCall(turn=1, name="python", arguments=_code(fixed), output=f"{answer}\n")
    wrong = f"<answer>{int(answer) + 1}</answer>"
    cases: Cases = {
        "the recovery reference": (example.reference, [failed, ran], 1.0),
        "the failed call, then a guess": (f"{broken}\n{wrong}", [failed], 0.2),
        # The format share is for a well-formed call, run or not: no answer credit.
        "a call written, never run, then a guess": (f"{fixed}\n{wrong}", [], 0.2),
        "the error text as the answer": (f"{broken}\n<answer>{NAME_ERROR}</answer>", [failed], 0.2),
        "the right answer without the call": (final, [], 0.8),
    }
    await _score_within(nats_url, task, cases)


async def _score_within(nats_url: str, task: Task, cases: Cases) -> None:
    """Each case (completion, tool calls, the most it deserves) scored through the
    validator service; the first case is the honest one and earns full marks."""
    service = ValidatorService(settings(nats_url, domains_config=TOOLS))
    async with service, client(nats_url) as nc:
        js = nc.jetstream()
        for index, (text, calls, _) in enumerate(cases.values()):
            await publish(js, make_rollout(task, text, index=index, tool_calls=calls))
        results = await scored_results(js, len(cases))
    got = {s.rollout.sample_index: s for s in results}
    for index, (name, (_, _, deserved)) in enumerate(cases.items()):
        assert got[index].status is ScoreStatus.SCORED, name
        assert 0.0 <= got[index].reward <= deserved, (name, got[index].reward, got[index].details)
    assert got[0].reward == 1.0


def _code(call: str) -> str:
    body = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    return json.dumps(body["arguments"])


async def test_the_failed_call_in_a_probe_s_context_earns_nothing(nats_url: str) -> None:
    """The recovery probe's context already holds a call (misspelt, failed): a completion
    that makes none of its own gets no call share for it, and the error is no answer."""
    params = {"task": "modpow", "difficulty": 1, "failed_first": True}
    (example,) = domain("modpow-failed-first", params).examples(1, "eval", seed=0)
    task, answer = example.task, str(example.task.metadata["answer"])
    call = example.reference.split("\n")[0]
    ran = ToolCall(turn=0, name="python", arguments=_code(call), output=f"{answer}\n")
    cases: Cases = {
        "the fixed call and the answer": (example.reference, [ran], 1.0),
        "a guess after the context's failed call": (f"<answer>{int(answer) + 1}</answer>", [], 0.0),
        "the context's error as the answer": (f"<answer>{NAME_ERROR}</answer>", [], 0.0),
        "the context's call copied as text": (f"{task.prompt[-2].content}", [], 0.2),
    }
    await _score_within(nats_url, task, cases)
