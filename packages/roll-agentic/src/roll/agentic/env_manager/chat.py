"""Token-in, token-out chat encoding for multi-turn episodes, for templates that rewrite history too.

A multi-turn sample must contain *exactly* the tokens the model generated (re-tokenizing their decoded text can
split differently, and the sampler's log-probs would no longer line up). So an episode is built as a list of
token segments: the template's text (system prompt, observations, role markers) is rendered with the
tokenizer's own chat template and tokenized, and the model's turns are appended as the ids it sampled.

After the model's turn ``k`` and the env's answer, :meth:`ChatEncoder.next_prompt` renders the whole next prompt
``render(history + [assistant_k, user_k+1])`` and compares it, as text, with what the model saw and produced at
turn ``k`` (``render(history)`` plus the answer's text, plus the end-of-turn token when the model stopped on it):

- an *extension* (ChatML, Qwen2.5, Llama 3 ...): only the new text (the template's closing markup, the next user
  turn, the next generation prompt) is tokenized and appended; the sampled ids stay as they were;
- anything else (Qwen3 drops earlier turns' ``<think>`` reasoning; DeepSeek-R1 drops it and its generation prompt
  opens ``<think>``; Llama 3 trims whitespace): the trajectory is *split*: the current segment ends after the
  model's tokens, and a new segment starts with the whole next prompt, tokenized, which is what the model is
  then given. Every segment is trained with its own mask (see :mod:`.episode`).

Special tokens split BPE pre-tokenization, so tokenizing a piece alone gives the same ids as tokenizing the
whole conversation. A template that cannot render the conversation, or whose next prompt leaves out the env's
answer, is rejected with a :class:`~roll.core.errors.DataError`.

The template's own variables (``env_manager.chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``) go to
every render, so the policy's prompts and the split detection's renders see the same template. They are checked
when the encoder is built (:func:`check_template_kwargs`): a name the template never reads, or a value it raises
on, is a :class:`~roll.core.errors.ConfigError` naming the key, before any rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.core import columns as C
from roll.core.errors import ConfigError, DataError
from roll.data.vision import (
    IMAGE_PAD,
    IMAGE_PLACEHOLDER,
    IMAGE_SPAN,
    encode_images,
    expand_image_pads,
    tokens_per_image,
)

__all__ = [
    "ChatEncoder", "EncodedImages", "Message", "NextPrompt", "check_template_kwargs", "merge_images", "vision_rows",
]  # fmt: skip

Message = dict[str, str]
KWARGS_KEY = "env_manager.chat_template_kwargs"
PROBE: list[Message] = [{"role": "user", "content": "Hello."}]
"""The one-turn conversation :func:`check_template_kwargs` renders."""


@dataclass(frozen=True)
class EncodedImages:
    """The patches of some images, in order: ``pixel_values [patches, D]``, ``image_grid_thw [images, 3]``."""

    pixel_values: Any
    image_grid_thw: Any


@dataclass(frozen=True)
class NextPrompt:
    """What follows a model turn: ``ids`` (and their images' patches) extend the current segment, or, when
    ``split``, are the whole prompt of a new segment."""

    ids: list[int]
    images: EncodedImages | None
    split: bool


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


def _template_variables(tokenizer: Any) -> set[str] | None:
    """The variables ``tokenizer``'s chat template reads, or None when that cannot be told (a tokenizer
    stand-in without a Jinja source, a dict of named templates, a transformers without this helper)."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str):
        return None
    try:  # transformers' own Jinja environment, so its tags ({% generation %}) and globals parse as in a render
        from jinja2 import meta
        from transformers.utils.chat_template_utils import _compile_jinja_template

        env = _compile_jinja_template(source).environment
        return set(meta.find_undeclared_variables(env.parse(source))) - set(env.globals)
    except Exception:  # a template that cannot be parsed alone fails loudly at the probe render instead
        return None


def check_template_kwargs(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`~roll.core.errors.ConfigError` naming ``env_manager.chat_template_kwargs.<name>`` when the
    template reads no variable ``name`` (a typo would otherwise be ignored silently: Jinja leaves unknown
    variables undefined), or when rendering a one-turn conversation with the kwargs raises (a value the template
    rejects). Without kwargs, nothing to check."""
    if not template_kwargs:
        return
    known = _template_variables(tokenizer)
    unread = sorted(k for k in template_kwargs if known is not None and k not in known)
    if unread:
        raise ConfigError(
            f"{KWARGS_KEY}.{unread[0]}: the policy tokenizer's chat template reads no variable {unread[0]!r} "
            f"(it reads: {', '.join(sorted(known or ())) or 'none'}); remove it or fix its spelling"
        )
    try:
        tokenizer.apply_chat_template(
            PROBE, tokenize=False, add_generation_prompt=True, **dict(template_kwargs)
        )
    except Exception as exc:
        names = ", ".join(f"{KWARGS_KEY}.{k}={v!r}" for k, v in template_kwargs.items())
        raise ConfigError(
            f"{names}: the chat template cannot render a one-turn conversation with these variables: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


class ChatEncoder:
    """Renders and tokenizes conversation segments with ``tokenizer``'s chat template."""

    def __init__(
        self, tokenizer: Any, image_processor: Any = None, template_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        """``image_processor``: the policy's (a vision-language model's), needed only for image observations.
        ``template_kwargs``: the template's own variables, passed to every render; checked here
        (:func:`check_template_kwargs`)."""
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("the tokenizer has no chat template; agentic episodes are chat conversations")
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        check_template_kwargs(tokenizer, self.template_kwargs)
        self.tokenizer = tokenizer
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        self.eos_text: str = str(tokenizer.eos_token)
        self.pad_token_id: int = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.image_processor = image_processor

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self.template_kwargs,
            )
        except Exception as exc:  # the template is user code: name it and the conversation it failed on
            roles = ", ".join(m["role"] for m in messages)
            raise DataError(
                f"the chat template cannot render the episode's conversation (roles: {roles}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The whole conversation, ending with the generation prompt of an assistant turn."""
        return self.encode(self.render(messages, generation_prompt=True))

    def next_prompt(
        self,
        history: Sequence[Message],
        answer: str,
        stopped_on_eos: bool,
        user: str,
        images: Sequence[Any] = (),
        all_images: Sequence[Any] = (),
    ) -> NextPrompt:
        """The prompt after the model answered ``history`` (which ends with the user turn it acted on) with
        ``answer`` and the env replied ``user`` (showing ``images``); see the module docstring. ``all_images``:
        every image of the conversation, ``images`` included, in order (a split re-encodes them all)."""
        seen = self.render(history, generation_prompt=True)
        produced = seen + answer + (self.eos_text if stopped_on_eos else "")
        messages = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": user}]
        following = self.render(messages, generation_prompt=True)
        if user.strip() not in following:
            raise DataError(
                "the chat template leaves the env's answer out of the next prompt (rendered "
                f"{following[-200:]!r}); the model would never see the observation {user[:80]!r}"
            )
        if following.startswith(produced):
            ids, encoded = self.encode_with_images(following[len(produced) :], images)
            return NextPrompt(ids, encoded, split=False)
        ids, encoded = self.encode_with_images(following, all_images)
        return NextPrompt(ids, encoded, split=True)

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

    def stopped_on_eos(self, response_ids: Sequence[int]) -> bool:
        return bool(response_ids) and response_ids[-1] == self.eos_token_id
