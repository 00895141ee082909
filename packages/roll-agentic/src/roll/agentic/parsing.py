"""Extract an env action from a model's output, and say whether the output kept the requested format.

The requested format is ``[<think>...</think>] <answer>ACTION</answer>``. The parser is lenient about *finding*
an action and strict about *judging* the format, so an env manager can both step the env and apply a format
penalty:

=====================================================  ==================  ===========
output                                                 action              format_ok
=====================================================  ==================  ===========
``<think>box left</think><answer>Left</answer>``       ``"Left"``          True
``<answer> up. </answer>`` (case, punctuation)         ``"Up"``            True
``<answer>I go Up</answer>`` (extra words)             ``"Up"`` (last)     False
``I will go Down`` (no tag, fallback on)               ``"Down"`` (last)   False
``<answer>Jump</answer>`` / ``blah`` / empty           ``None``            False
``<think>never closed...``                             ``None``            False
=====================================================  ==================  ===========

With ``valid_actions=None`` (free-form answers such as an arithmetic expression) the stripped text of the last
answer tag is the action.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from pydantic import Field

from roll.core.config.base import RollModel

__all__ = ["ActionParseConfig", "ParsedAction", "parse_action", "strip_think"]


class ActionParseConfig(RollModel):
    """How :func:`parse_action` reads a model's output."""

    answer_tag: str = Field(
        default="answer",
        pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$",
        description="the action is read from the last <tag>...</tag> of the output",
    )
    strip_think: bool = Field(
        default=True, description="drop <think>...</think> before looking for the answer"
    )
    require_think: bool = Field(
        default=False, description="format_ok only if a closed <think> block comes first"
    )
    fallback_to_last_word: bool = Field(
        default=True,
        description="without a valid answer tag, take the last valid action word (format_ok False)",
    )


class ParsedAction(NamedTuple):
    action: str | None
    format_ok: bool


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][A-Za-z_\-]*")


def strip_think(text: str) -> tuple[str, bool]:
    """``text`` without its thinking, and whether every opened ``<think>`` block was closed.

    An unclosed ``<think>`` swallows the rest of the output: a model cut off mid-thought has not answered. A
    lone ``</think>`` (chat templates that open the block in the prompt) ends thinking: the text before it goes.
    """
    stripped = _THINK_BLOCK.sub(" ", text)
    start = stripped.lower().find("<think>")
    if start >= 0:
        return stripped[:start], False
    parts = re.split(r"</think>", stripped, flags=re.IGNORECASE)
    return parts[-1], True


def parse_action(
    text: str, valid_actions: Sequence[str] | None = None, config: ActionParseConfig | None = None
) -> ParsedAction:
    """The action in ``text`` (canonical spelling from ``valid_actions``) and whether the format was kept."""
    config = config or ActionParseConfig()
    body, think_ok = strip_think(text) if config.strip_think else (text, True)
    if config.require_think and not _has_leading_think(text):
        think_ok = False
    answer = _last_tag(body, config.answer_tag)
    if valid_actions is None:
        action = answer.strip() if answer is not None and answer.strip() else None
        return ParsedAction(action, think_ok and action is not None)
    canon = {a.lower(): a for a in valid_actions}
    if answer is not None:
        exact = canon.get(_normalize(answer))
        if exact is not None:
            return ParsedAction(exact, think_ok)
        return ParsedAction(_last_valid_word(answer, canon), False)
    if config.fallback_to_last_word:
        return ParsedAction(_last_valid_word(body, canon), False)
    return ParsedAction(None, False)


def _last_tag(text: str, tag: str) -> str | None:
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL | re.IGNORECASE)
    return matches[-1] if matches else None


def _normalize(answer: str) -> str:
    return answer.strip().strip(".!,;:'\"`*").strip().lower()


def _last_valid_word(text: str, canon: dict[str, str]) -> str | None:
    for word in reversed(_WORD.findall(text)):
        action = canon.get(word.lower())
        if action is not None:
            return action
    return None


def _has_leading_think(text: str) -> bool:
    return re.match(r"\s*<think>.*?</think>", text, flags=re.DOTALL | re.IGNORECASE) is not None
