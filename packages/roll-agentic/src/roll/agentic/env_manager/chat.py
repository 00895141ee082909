"""Token-in, token-out chat encoding for multi-turn episodes.

A multi-turn sample must contain *exactly* the tokens the model generated (re-tokenizing their decoded text can
split differently, and the sampler's log-probs would no longer line up). So an episode is built as a list of
token segments: the template's text (system prompt, observations, role markers) is rendered with the
tokenizer's own chat template and tokenized, and the model's turns are appended as the ids it sampled.

The template text between two model turns is found by rendering prefixes of the conversation and taking the
difference (``render(history + [user]) - render(history)``), so any template whose render of a prefix is a
prefix of the render of the whole works (ChatML, Qwen2.5, Llama 3 ...); a template that rewrites earlier turns is
rejected with a :class:`~roll.core.errors.DataError`. Special tokens split BPE pre-tokenization, so tokenizing a
segment alone gives the same ids as tokenizing the whole conversation.

After a model turn, the template closes it (ChatML: ``<|im_end|>\\n``). When the model stopped on the
end-of-turn token itself, that token is already part of its output (and trained), and only the rest of the
closing text (``\\n``) is template markup; when it stopped at the token limit, the whole closing text is markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.core.errors import DataError

__all__ = ["ChatEncoder", "Message"]

Message = dict[str, str]


class ChatEncoder:
    """Renders and tokenizes conversation segments with ``tokenizer``'s chat template."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("the tokenizer has no chat template; agentic episodes are chat conversations")
        self.tokenizer = tokenizer
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        self.eos_text: str = str(tokenizer.eos_token)
        self.pad_token_id: int = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The whole conversation, ending with the generation prompt of an assistant turn."""
        return self.encode(self.render(messages, generation_prompt=True))

    def user_turn_ids(self, history: Sequence[Message], content: str) -> list[int]:
        """Template text that adds a user turn ``content`` after ``history`` and opens the assistant's turn."""
        before = self.render(history, generation_prompt=False)
        after = self.render([*history, {"role": "user", "content": content}], generation_prompt=True)
        return self.encode(_suffix(after, before))

    def close_ids(self, history: Sequence[Message], content: str, stopped_on_eos: bool) -> list[int]:
        """Template text that closes an assistant turn whose text is ``content`` (see the module docstring)."""
        before = self.render(history, generation_prompt=True)
        after = self.render([*history, {"role": "assistant", "content": content}], generation_prompt=False)
        tail = _suffix(after, before)
        if not tail.startswith(content):
            raise DataError("the chat template changes the assistant's text; cannot align model tokens")
        close = tail[len(content) :]
        if stopped_on_eos and close.startswith(self.eos_text):
            close = close[len(self.eos_text) :]
        return self.encode(close) if close else []

    def stopped_on_eos(self, response_ids: Sequence[int]) -> bool:
        return bool(response_ids) and response_ids[-1] == self.eos_token_id


def _suffix(after: str, before: str) -> str:
    if not after.startswith(before):
        raise DataError(
            "the chat template renders a conversation prefix differently from the whole conversation "
            "(it rewrites earlier turns); multi-turn token alignment needs a prefix-stable template"
        )
    return after[len(before) :]
