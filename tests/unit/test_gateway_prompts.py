"""A chat call's prompt ids: OpenAI messages as the template reads them, and a next turn
that extends the earlier prompt and sampled ids token for token (docs/gateway.md)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.domains.formats import tool_instructions
from services.gateway.prompts import (
    Answered,
    Prompter,
    assistant_text,
    template_messages,
    tools_key,
    tools_prompt,
)
from services.gateway.requests import ChatMessageIn, ToolSpec
from services.model.chat_template import TemplateTokenizer

TOOLS = msgspec.convert(
    [
        {
            "function": {
                "name": "python",
                "description": "Runs code.",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
            }
        }
    ],
    list[ToolSpec],
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> TemplateTokenizer:
    return TemplateTokenizer.load(tiny_model)


def messages(*items: dict[str, object]) -> list[ChatMessageIn]:
    return msgspec.convert(list(items), list[ChatMessageIn])


def test_openai_messages_become_what_the_template_reads(tokenizer: TemplateTokenizer) -> None:
    chat = template_messages(
        messages(
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "function": {"name": "python", "arguments": '{"code":  "1"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ),
        TOOLS,
        tokenizer,
    )
    # The tiny policy's template has no place for tools: the instructions its warm-up
    # teaches come first in the system message, as in the tool domains' prompts.
    assert chat[0] == {
        "role": "system",
        "content": f"{tool_instructions(('python',))} Be brief.",
    }
    assert chat[1] == {"role": "user", "content": "ab"}
    # A call as the model writes it, its arguments as compact JSON.
    assert chat[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
    }
    assert chat[3] == {"role": "tool", "content": "1"}


def _answered(
    tokenizer: TemplateTokenizer, chat: list[dict[str, str]], sampled: str, content: str
) -> Answered:
    prompt = tokenizer.encode(tokenizer.render_text(chat))
    return Answered(
        before=tuple((m["role"], m["content"]) for m in chat),
        tools=tools_key(None),
        prompt=tuple(prompt),
        reply=("assistant", content),
        completion=tuple(tokenizer.encode(sampled)),
        text=sampled,
    )


@pytest.mark.parametrize(
    ("sampled", "content"),
    [
        # The model ended its turn: the end-of-turn token is among the sampled ids.
        ("The answer is 5.<|im_end|>", "The answer is 5."),
        # The turn ended at a tool call (a stop token): the template's close is added.
        (
            '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
            '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
        ),
    ],
)
def test_a_next_turn_extends_the_sampled_ids_and_reads_as_the_template_writes_it(
    tokenizer: TemplateTokenizer, sampled: str, content: str
) -> None:
    first = [{"role": "user", "content": "2 + 3?"}]
    answer = _answered(tokenizer, first, sampled, content)
    prompter = Prompter(tokenizer)
    chat = [*first, {"role": "assistant", "content": content}, {"role": "tool", "content": "5"}]
    ids = prompter.prompt(chat, tools_key(None), [answer])
    assert (prompter.extended, prompter.rendered) == (1, 0)
    assert ids[: len(answer.prompt) + len(answer.completion)] == [
        *answer.prompt,
        *answer.completion,
    ]
    # The same conversation the template would write, though no earlier turn was re-tokenized.
    assert tokenizer.decode(ids) == tokenizer.render_text(chat)


def test_a_call_that_rewrites_history_or_its_tools_is_rendered_whole(
    tokenizer: TemplateTokenizer,
) -> None:
    first = [{"role": "user", "content": "2 + 3?"}]
    answer = _answered(tokenizer, first, "5<|im_end|>", "5")
    prompter = Prompter(tokenizer)
    edited = [*first, {"role": "assistant", "content": "5!"}, {"role": "user", "content": "ok"}]
    assert prompter.prompt(edited, tools_key(None), [answer]) == tokenizer.encode(
        tokenizer.render_text(edited)
    )
    kept = [*first, {"role": "assistant", "content": "5"}, {"role": "user", "content": "ok"}]
    prompter.prompt(kept, tools_key(TOOLS), [answer])
    # A repeat of the answered call itself (nothing new after the reply) is no extension.
    prompter.prompt([*first, {"role": "assistant", "content": "5"}], tools_key(None), [answer])
    assert (prompter.extended, prompter.rendered) == (0, 3)
    prompter.prompt(kept, tools_key(None), [answer])
    assert prompter.extended == 1


def test_a_tool_the_instructions_do_not_cover_is_described_by_its_schema() -> None:
    shell = msgspec.convert(
        [
            {
                "function": {
                    "name": "grep",
                    "description": "Searches.",
                    "parameters": {"type": "object"},
                }
            }
        ],
        list[ToolSpec],
    )
    text = tools_prompt([*TOOLS, *shell])
    assert text.startswith(tool_instructions(("python", "grep")))
    assert text.endswith('\n- grep: Searches. Arguments: {"type": "object"}')
    assert "- python:" not in text


def test_an_assistant_turn_is_written_in_the_models_call_format() -> None:
    text = assistant_text("Let me run it. ", [("python", '{"code": "print(1)"}')])
    assert text == (
        'Let me run it. <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}'
        "</tool_call>"
    )
