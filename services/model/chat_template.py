"""The chat template as text, for whoever builds prompts from messages it did not render
itself: the gateway extends a conversation from the ids the model sampled, adding only the
template's text of what came after (docs/gateway.md).

Kept apart from ``tokens``, which decides the bytes of the warmed-up policies: a change
here rebuilds none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from services.model.tokens import ChatTokenizer

#: Stands for an assistant turn's text while the template's turn markers are read off.
_MARK: Final = "\u2063temper-turn\u2063"
#: The conversation whose rendering is cut off to leave the markers around later messages.
_BASE: Final = ({"role": "user", "content": "."}, {"role": "assistant", "content": _MARK})


class NotPrefixStable(ValueError):
    """The chat template renders earlier messages differently once more follow them."""


class TemplateTokenizer(ChatTokenizer):
    """A ChatTokenizer that also renders conversations as text and continues them."""

    @classmethod
    def load(cls, model_dir: Path) -> TemplateTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

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
