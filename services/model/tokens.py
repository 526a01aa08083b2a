"""Text <-> token ids for the agent loop, from the model directory's own tokenizer.

Conversations are kept as ids: the prompt is rendered once by the chat template, and
each later piece (a tool observation) is encoded on its own and appended, so earlier
tokens are never re-tokenized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from protocol.messages import ChatMessage

TOOL_CALL_END = "</tool_call>"
#: Stands for an assistant turn's text while the template's turn markers are read off.
_MARK: Final = "\u2063temper-turn\u2063"
#: The conversation whose rendering is cut off to leave the markers around later messages.
_BASE: Final = ({"role": "user", "content": "."}, {"role": "assistant", "content": _MARK})


class NotPrefixStable(ValueError):
    """The chat template renders earlier messages differently once more follow them."""


class ChatTokenizer:
    """The Hugging Face tokenizer of a model directory, with the few operations the loop needs."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self._tok = hf_tokenizer
        eos = hf_tokenizer.eos_token_id
        self.eos_ids: tuple[int, ...] = () if eos is None else (int(eos),)
        self.end_turn = hf_tokenizer.eos_token or ""
        self.tool_call_end_id = self._single_id(TOOL_CALL_END)

    @classmethod
    def load(cls, model_dir: Path) -> ChatTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def _single_id(self, text: str) -> int | None:
        ids = self._tok.encode(text, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 else None

    def render(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt ids of a conversation, ending with the assistant's turn opening."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        ids = self._tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def render_text(
        self,
        chat: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        open_turn: bool = True,
    ) -> str:
        """The template's text of a conversation given as the template reads it (dicts),
        ending with the assistant's turn opening when ``open_turn``."""
        text = self._tok.apply_chat_template(
            [dict(m) for m in chat],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=open_turn,
            tokenize=False,
        )
        return str(text)

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes the tools it is given into the prompt."""
        return "tools" in str(getattr(self._tok, "chat_template", None) or "")

    def continuation(self, chat: Sequence[Mapping[str, Any]], completion_text: str) -> str:
        """The text that follows an assistant turn the model wrote (``completion_text``, its
        ids decoded) to add ``chat`` and open the next assistant turn, exactly as the
        template writes those markers: the turn's close (less the end-of-turn token the
        completion holds when it sampled one), then the new messages.  Appended as ids
        after the sampled ids, it extends the conversation without re-tokenizing it."""
        closed = self.render_text(_BASE, open_turn=False)
        full = self.render_text([*_BASE, *chat], open_turn=True)
        if not full.startswith(closed):
            raise NotPrefixStable("the chat template rewrites earlier turns as the chat grows")
        close = closed[closed.index(_MARK) + len(_MARK) :]
        end = self.end_turn
        if end and close.startswith(end) and completion_text.endswith(end):
            close = close[len(end) :]
        return close + full[len(closed) :]

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def observation(self, output: str) -> str:
        """Text appended after a tool call: ends the assistant turn, shows the tool output,
        and opens the next assistant turn (ChatML, as the chat template writes it)."""
        return (
            f"{self.end_turn}\n<|im_start|>tool\n{output}{self.end_turn}\n<|im_start|>assistant\n"
        )
