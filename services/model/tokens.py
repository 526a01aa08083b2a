"""Text <-> token ids for the agent loop, from the model directory's own tokenizer.

Conversations are kept as ids: the prompt is rendered once by the chat template, and
each later piece (a tool observation) is encoded on its own and appended, so earlier
tokens are never re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.messages import ChatMessage

TOOL_CALL_END = "</tool_call>"


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
