"""``tool_choice`` through the gateway (real generator, tiny policy, the official client):
a named function or ``required`` opens the assistant turn with the call, as prompt the
policy goes on from and is never trained on; ``none`` leaves the tools out of the prompt;
a turn after a forced call still extends its trajectory token for token."""

from __future__ import annotations

from typing import Any

import pytest
from openai import BadRequestError

from services.gateway.service import GatewayService
from tests.integration import test_gateway_generation as generation
from tests.integration.support import Tap
from tests.integration.test_gateway_generation import (
    MODEL,
    SESSION,
    TOOLS,
    engine_sample,
    openai_client,
)

# The generation tests' stack: a generator and the gateway on one nats-server.
nc, stack, answers = generation.nc, generation.stack, generation.answers

QUESTION = [{"role": "user", "content": "What is 12345 * 6789?"}]
NAMED = {"type": "function", "function": {"name": "python"}}
OPENING = '<tool_call>{"name": "python", "arguments": '


async def test_a_named_tool_choice_opens_the_turn_with_its_call(
    stack: GatewayService, answers: Tap
) -> None:
    openai = openai_client(stack)
    first = await openai.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=NAMED,  # type: ignore[arg-type]
    )
    [one] = await answers.wait(1)
    prompt1, completion1, _ = engine_sample(one)
    opening = stack.tokenizer.encode(OPENING)
    assert prompt1[-len(opening) :] == opening  # the engine went on from the call's opening
    message = first.choices[0].message
    if message.tool_calls:
        assert [call.function.name for call in message.tool_calls] == ["python"]
    else:  # the policy wrote no parsable call after it: the text says what it did write
        assert (message.content or "").startswith(OPENING)
    # The opening is prompt: only what the policy sampled is trained on.
    session = stack.sessions.get(stack.keys.lookup("sk-gen-0123456789abcdef").key_id, SESSION)
    assert session is not None
    [trajectory] = session.trajectories
    assert trajectory.prompt == prompt1 and trajectory.completion == completion1
    assert set(trajectory.mask) == {1}

    # The agent sends the answer back with its tool's output: the turn extends it exactly.
    messages: list[Any] = [*QUESTION, message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": "call_0", "content": "83810205"}]
    await openai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    _, two = await answers.wait(2)
    prompt2, _, _ = engine_sample(two)
    assert prompt2[: len(prompt1) + len(completion1)] == prompt1 + completion1
    assert stack.statistics()["prompts_extended"] == 1


async def test_required_opens_a_call_and_none_leaves_the_tools_out(
    stack: GatewayService, answers: Tap
) -> None:
    await openai_client(stack, "required").chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
    )
    none = await openai_client(stack, "none").chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
    )
    await openai_client(stack, "plain").chat.completions.create(model=MODEL, messages=QUESTION)  # type: ignore[arg-type]
    required, without, plain = (engine_sample(r)[0] for r in await answers.wait(3))
    start = stack.tokenizer.encode("<tool_call>")
    assert required[-len(start) :] == start
    assert without == plain  # `none`: the prompt of a call without tools
    assert none.choices[0].message.tool_calls is None


async def test_a_tool_choice_naming_no_given_tool_is_refused(stack: GatewayService) -> None:
    with pytest.raises(BadRequestError, match="not in `tools`") as refused:
        await openai_client(stack).chat.completions.create(
            model=MODEL,
            messages=QUESTION,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "shell"}},
        )
    assert refused.value.status_code == 400
