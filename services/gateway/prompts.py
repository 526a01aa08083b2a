"""Prompt ids of a chat call: rendered by the model's template, or, for a call that goes
on from an answer the gateway gave, extended token for token (docs/gateway.md).

The gateway remembers, per session, what it answered: the messages of the call, their
prompt ids and, per choice, the assistant message it returned with the ids the engine
sampled.  A call whose messages are those messages, that assistant message, then new
ones (tool results, a user turn) gets as prompt the earlier prompt ids + the sampled
ids + the template's text of the new messages alone.  The returned turn is never
re-rendered from text, so the prompt continues the trajectory exactly; any other call
is rendered whole and starts a new trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.domains.formats import tool_instructions
from services.gateway.requests import ChatMessageIn, NamedToolChoice, ToolCallIn, ToolSpec
from services.model.chat_template import TemplateTokenizer
from services.model.tool_format import TOOL_CALL_END, TOOL_CALL_START

#: Tools ``tool_instructions`` describes itself.
DESCRIBED = frozenset({"python"})
#: A message as the chat template reads it.
TemplateMessage = dict[str, str]


@dataclass(frozen=True, kw_only=True)
class Answered:
    """One choice the gateway returned, with what it takes to go on from it exactly."""

    #: The call's messages and tools, as the template read them.
    before: tuple[tuple[str, str], ...]
    tools: str
    prompt: tuple[int, ...]
    #: The assistant message returned, as the template would read it back.
    reply: tuple[str, str]
    completion: tuple[int, ...]
    text: str


def template_messages(
    messages: Sequence[ChatMessageIn],
    tools: Sequence[ToolSpec] | None,
    tokenizer: TemplateTokenizer,
) -> list[TemplateMessage]:
    """OpenAI messages as the template reads them: text content, ``developer`` as
    ``system``, an assistant's tool calls in the model's own format, and the tools
    described at the start of the system message when the template does not write them
    itself (as the warm-up taught Temper's own policies: their instructions first)."""
    chat = [_template_message(m) for m in messages]
    if tools and not tokenizer.renders_tools:
        described = tools_prompt(tools)
        if chat and chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": f"{described} {chat[0]['content']}"}
        else:
            chat.insert(0, {"role": "system", "content": described})
    return chat


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The tools, and how to call one, for a template that has no place for them: the
    instructions the warm-up teaches, then the schema of each tool they do not cover."""
    text = tool_instructions(tuple(t.function.name for t in tools))
    for tool in tools:
        spec = tool.function
        if spec.name in DESCRIBED:
            continue
        parameters = json.dumps(spec.parameters or {}, sort_keys=True)
        text += f"\n- {spec.name}: {spec.description or ''} Arguments: {parameters}".rstrip()
    return text


def assistant_text(content: str, calls: Sequence[tuple[str, str]]) -> str:
    """An assistant turn as the model writes it: its text, then each ``(name, arguments
    JSON)`` call as a block."""
    blocks = "".join(
        f'{TOOL_CALL_START}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_END}'
        for name, arguments in calls
    )
    return content + blocks


def forced_opening(choice: str | NamedToolChoice | None) -> str:
    """The start of the assistant turn a ``tool_choice`` forces, written for the model to
    go on from: a call's opening (``required``), or a named function's call up to its
    arguments.  It is part of the prompt, never of what the policy is trained on."""
    if choice == "required":
        return TOOL_CALL_START
    if isinstance(choice, NamedToolChoice):
        return f'{TOOL_CALL_START}{{"name": {json.dumps(choice.function.name)}, "arguments": '
    return ""


def tools_key(tools: Sequence[ToolSpec] | None) -> str:
    return json.dumps([_spec(t) for t in tools or ()], sort_keys=True)


class Prompter:
    """Builds a call's prompt ids, extending a remembered answer when the call goes on
    from one."""

    def __init__(self, tokenizer: TemplateTokenizer) -> None:
        self.tokenizer = tokenizer
        self.extended = 0
        self.rendered = 0

    def prompt(
        self,
        chat: Sequence[TemplateMessage],
        tools_json: str,
        answered: Sequence[Answered],
    ) -> list[int]:
        for answer in reversed(answered):
            ids = self._extend(answer, chat, tools_json)
            if ids is not None:
                self.extended += 1
                return ids
        self.rendered += 1
        return self.tokenizer.encode(self.tokenizer.render_text(chat))

    def _extend(
        self, answer: Answered, chat: Sequence[TemplateMessage], tools_json: str
    ) -> list[int] | None:
        cut = len(answer.before)
        if tools_json != answer.tools or len(chat) <= cut + 1:
            return None
        if _pairs(chat[:cut]) != answer.before or _pair(chat[cut]) != answer.reply:
            return None
        text = self.tokenizer.continuation(chat[cut + 1 :], answer.text)
        return [*answer.prompt, *answer.completion, *self.tokenizer.encode(text)]


def _template_message(message: ChatMessageIn) -> TemplateMessage:
    role = "system" if message.role == "developer" else message.role
    content = _text(message.content)
    if message.role == "assistant" and message.tool_calls:
        content = assistant_text(content, [_call(c) for c in message.tool_calls])
    return {"role": role, "content": content}


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)  # type: ignore[attr-defined]


def _call(call: ToolCallIn) -> tuple[str, str]:
    """A returned call's name and its arguments as the model wrote them: compact JSON
    when they parse (the form the gateway returns), else the text as sent."""
    try:
        arguments: Any = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.name, json.dumps(call.function.arguments)
    return call.function.name, json.dumps(arguments)


def _spec(tool: ToolSpec) -> dict[str, Any]:
    spec = tool.function
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}


def _pair(message: TemplateMessage) -> tuple[str, str]:
    return message["role"], message["content"]


def _pairs(chat: Sequence[TemplateMessage]) -> tuple[tuple[str, str], ...]:
    return tuple(_pair(m) for m in chat)
