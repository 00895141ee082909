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
from dataclasses import dataclass
from typing import Any

from roll.core import columns as C
from roll.core.errors import DataError
from roll.data.vision import (
    IMAGE_PAD,
    IMAGE_PLACEHOLDER,
    IMAGE_SPAN,
    encode_images,
    expand_image_pads,
    tokens_per_image,
)

__all__ = ["ChatEncoder", "EncodedImages", "Message", "merge_images", "vision_rows"]

Message = dict[str, str]


@dataclass(frozen=True)
class EncodedImages:
    """The patches of some images, in order: ``pixel_values [patches, D]``, ``image_grid_thw [images, 3]``."""

    pixel_values: Any
    image_grid_thw: Any


def merge_images(parts: Sequence[EncodedImages]) -> EncodedImages | None:
    """One row's images from its segments' (in order); None when there are none."""
    if not parts:
        return None
    import torch

    return EncodedImages(
        torch.cat([p.pixel_values for p in parts]), torch.cat([p.image_grid_thw for p in parts])
    )


def vision_rows(rows: Sequence[EncodedImages | None]) -> dict[str, list[Any]]:
    """The per-row vision columns (``roll.core.columns.VISION_COLUMNS``) of ``rows``; ``{}`` when no row has
    images, so text batches keep exactly their columns."""
    if all(r is None for r in rows):
        return {}
    return {
        C.PIXEL_VALUES: [r.pixel_values if r is not None else None for r in rows],
        C.IMAGE_GRID_THW: [r.image_grid_thw if r is not None else None for r in rows],
    }


class ChatEncoder:
    """Renders and tokenizes conversation segments with ``tokenizer``'s chat template."""

    def __init__(self, tokenizer: Any, image_processor: Any = None) -> None:
        """``image_processor``: the policy's (a vision-language model's), needed only for image observations."""
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("the tokenizer has no chat template; agentic episodes are chat conversations")
        self.tokenizer = tokenizer
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        self.eos_text: str = str(tokenizer.eos_token)
        self.pad_token_id: int = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.image_processor = image_processor

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
        return self.user_turn_with_images(history, content, ())[0]

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

    def encode_with_images(self, text: str, images: Sequence[Any]) -> tuple[list[int], EncodedImages | None]:
        """``text`` (one ``<image>`` per image) as ids with each image's vision span expanded, and the images'
        patches; without images exactly :meth:`encode`."""
        if not images:
            return self.encode(text), None
        if self.image_processor is None:
            raise DataError(
                "an env gives image observations but the policy model has no image processor; use a "
                "vision-language model (a tiny-vl-* preset or a Qwen2-VL folder) for image envs"
            )
        if text.count(IMAGE_PLACEHOLDER) != len(images):
            raise DataError(
                f"an observation segment has {text.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} marker(s) for "
                f"{len(images)} image(s) (does the system prompt contain {IMAGE_PLACEHOLDER}?)"
            )
        pixels, grid = encode_images(images, self.image_processor)
        merge = int(getattr(self.image_processor, "merge_size", 1) or 1)
        pad_id = int(self.tokenizer.convert_tokens_to_ids(IMAGE_PAD))
        ids = self.encode(text.replace(IMAGE_PLACEHOLDER, IMAGE_SPAN))
        expanded, _ = expand_image_pads(ids, tokens_per_image(grid, merge), pad_id)
        return expanded, EncodedImages(pixels, grid)

    def prompt_with_images(
        self, messages: Sequence[Message], images: Sequence[Any]
    ) -> tuple[list[int], EncodedImages | None]:
        """:meth:`prompt_ids` of a conversation whose user turns hold ``images`` at their markers."""
        return self.encode_with_images(self.render(messages, generation_prompt=True), images)

    def user_turn_with_images(
        self, history: Sequence[Message], content: str, images: Sequence[Any]
    ) -> tuple[list[int], EncodedImages | None]:
        """:meth:`user_turn_ids` for a user turn holding ``images`` at its markers."""
        before = self.render(history, generation_prompt=False)
        after = self.render([*history, {"role": "user", "content": content}], generation_prompt=True)
        return self.encode_with_images(_suffix(after, before), images)

    def stopped_on_eos(self, response_ids: Sequence[int]) -> bool:
        return bool(response_ids) and response_ids[-1] == self.eos_token_id


def _suffix(after: str, before: str) -> str:
    if not after.startswith(before):
        raise DataError(
            "the chat template renders a conversation prefix differently from the whole conversation "
            "(it rewrites earlier turns); multi-turn token alignment needs a prefix-stable template"
        )
    return after[len(before) :]
