"""The built-in exact-match reward: the (extracted, normalized) response equals the ground truth.

Usable two ways: as the reward type ``exact_match`` (options: :class:`ExactMatchConfig`), or as a plain function
through the python reward: ``{type: python, options: {function: "roll.pipelines.rewards.exact:exact_match"}}``.

Normalization, in order: take the answer (group 1 of the *last* match of ``pattern`` when one is set, else the
whole response), collapse runs of whitespace to one space, strip surrounding whitespace and the characters of
``strip_chars``, then compare case-insensitively unless ``case_sensitive``. A response where ``pattern`` matches
nothing scores 0 with ``info["error"] = "no answer found"``.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from roll.core.config.base import RollModel
from roll.pipelines.rewards.types import RewardRequest, RewardResult


class ExactMatchConfig(RollModel):
    """Options of the ``exact_match`` reward (see the module docstring for the normalization)."""

    pattern: str | None = Field(
        None, description=r"regex whose last match holds the answer (group 1 if any), e.g. 'answer is (\S+)'"
    )
    case_sensitive: bool = Field(False, description="compare answers case-sensitively")
    strip_chars: str = Field(".", description="characters stripped from both ends after whitespace")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from exc
        return value


def normalize(text: str, *, case_sensitive: bool = False, strip_chars: str = ".") -> str:
    """``"  The  Answer. "`` -> ``"the answer"`` (whitespace collapsed, ends stripped, case folded)."""
    text = " ".join(text.split()).strip(strip_chars).strip()
    return text if case_sensitive else text.casefold()


def extract(response: str, pattern: str | None) -> str | None:
    """The answer in ``response``: group 1 (or the whole match) of ``pattern``'s last match; None if none."""
    if pattern is None:
        return response
    matches = list(re.finditer(pattern, response))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.groups() else last.group(0)


def exact_match(response: str, ground_truth: str, **_: object) -> bool:
    """True when the normalized response equals the normalized ground truth (defaults of ExactMatchConfig)."""
    return normalize(response) == normalize(ground_truth)


class ExactMatchReward:
    """Score 1.0 on an exact match after :func:`extract` and :func:`normalize`, else 0.0."""

    def __init__(self, config: ExactMatchConfig | None = None) -> None:
        self.config = config or ExactMatchConfig()

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(r) for r in requests]

    def _score_one(self, request: RewardRequest) -> RewardResult:
        cfg = self.config
        answer = extract(request.response, cfg.pattern)
        if answer is None:
            return RewardResult.failed("no answer found", correct=False)

        def norm(text: str) -> str:
            return normalize(text, case_sensitive=cfg.case_sensitive, strip_chars=cfg.strip_chars)

        correct = norm(answer) == norm(request.ground_truth)
        return RewardResult(float(correct), {"correct": correct, "answer": answer})
