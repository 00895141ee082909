"""The ``keyword`` reward: a length rule and a keyword rule on each response.

A response of more than ``max_words`` words (split on whitespace) fails the length rule: a *bad response*, not a
bug, so it gets ``RewardResult.failed`` (score 0, the reason in ``info["error"]``), never an exception. Otherwise

    score = length_weight + (1 - length_weight) * (share of the required words the response contains)

The required words are ``options.keywords`` plus, with ``use_ground_truth``, the words of the row's ``ground_truth``
column (the data's answer); words are compared case-folded, without surrounding punctuation. ``info["correct"]``
(the accuracy metric) is true when every required word is there.
"""

from __future__ import annotations

import re

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.types import RewardSpec
from roll.pipelines.rewards.types import RewardRequest, RewardResult

WORD = re.compile(r"[\w.]+")


class KeywordConfig(RollModel):
    """The options of ``type: keyword`` (strict: an unknown or ill-typed option is a config error)."""

    keywords: list[str] = Field(default_factory=list, description="words every response should contain")
    use_ground_truth: bool = Field(True, description="also require the words of the row's ground_truth")
    max_words: int = Field(32, ge=1, description="the length rule: longer responses score 0")
    length_weight: float = Field(
        0.5, ge=0.0, le=1.0, description="the score of a short response without keywords"
    )


class KeywordReward:
    """``score(requests) -> results``: one result per request, in order (roll's RewardFunction protocol)."""

    def __init__(self, config: KeywordConfig) -> None:
        self.config = config

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._one(r) for r in requests]

    def _one(self, request: RewardRequest) -> RewardResult:
        cfg = self.config
        length = len(request.response.split())
        if length > cfg.max_words:
            return RewardResult.failed(f"{length} words, over max_words={cfg.max_words}", words=length)
        words = set(_words(request.response))
        required = [k.casefold() for k in cfg.keywords]
        if cfg.use_ground_truth:
            required += _words(request.ground_truth)
        found = sum(1 for k in required if k in words)
        share = found / len(required) if required else 1.0
        score = cfg.length_weight + (1.0 - cfg.length_weight) * share
        return RewardResult(score, {"correct": found == len(required), "words": length})


def _words(text: str) -> list[str]:
    return [w.strip(".").casefold() for w in WORD.findall(text)]


def build(config: KeywordConfig) -> KeywordReward:
    """roll.core.types.RewardBuild: runs once in each reward worker (a Ray actor)."""
    return KeywordReward(config)


SPEC = RewardSpec(
    name="keyword",
    build=build,
    config_model=KeywordConfig,
    description="share of required words (options, ground truth) in the response; 0 past max_words",
)
