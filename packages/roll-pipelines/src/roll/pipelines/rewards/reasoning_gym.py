"""Score rows of ``reasoning_gym:<task>`` sources with reasoning-gym's own ``score_answer`` (extra
``roll-pipelines[reasoning-gym]``).

The row's ``ground_truth`` is the JSON entry :mod:`roll.data.procedural` wrote (``task``, ``answer``,
``metadata``); the answer is taken from the response as :class:`~.config.ReasoningGymRewardConfig` says, and the
score is ``reasoning_gym.get_score_answer_fn(task)(answer, entry)``, in [0, 1] (partial credit where the task gives
it). A response with no answer scores 0 with ``info["error"]``; a ground truth that is not such an entry also
scores 0 with the reason (a data bug, but one row must not stop a step).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from roll.core.errors import PluginError
from roll.pipelines.rewards.config import ReasoningGymRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult

_PATTERNS = {
    "answer_is": re.compile(r"answer is:?\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.MULTILINE),
    "answer_tag": re.compile(r"<answer>(.*?)</answer>", re.DOTALL),
}


def extract_answer(response: str, how: str) -> str | None:
    """The answer in ``response`` by the rule ``how`` (last match), or None."""
    if how == "none":
        return response.strip()
    matches = _PATTERNS[how].findall(response)
    return matches[-1].strip() if matches else None


class ReasoningGymReward:
    """One scorer per task, looked up once and kept."""

    def __init__(self, config: ReasoningGymRewardConfig | None = None) -> None:
        self.config = config or ReasoningGymRewardConfig()
        try:
            import reasoning_gym
        except ImportError as exc:
            raise PluginError(
                f"reward 'reasoning_gym' needs reasoning-gym ({exc}): pip install 'roll-pipelines[reasoning-gym]'"
            ) from exc
        self._get_fn: Callable[[str], Callable[..., float]] = reasoning_gym.get_score_answer_fn
        self._fns: dict[str, Callable[..., float]] = {}

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(r) for r in requests]

    def _score_one(self, request: RewardRequest) -> RewardResult:
        try:
            entry: dict[str, Any] = json.loads(request.ground_truth)
            task = str(entry["task"])
            fn = self._fns.get(task) or self._fns.setdefault(task, self._get_fn(task))
        except (ValueError, KeyError, TypeError) as exc:
            return RewardResult.unscored(
                f"ground truth is not a reasoning_gym entry: {exc}", kind="bad ground truth"
            )
        answer = extract_answer(request.response, self.config.extract)
        if answer is None:
            return RewardResult.failed("no answer found", correct=False, task=task)
        score = float(fn(answer, entry))
        return RewardResult(
            score, {"correct": score >= self.config.correct_at, "answer": answer, "task": task}
        )
