"""Exact-match reward for roll's built-in offline tasks (``arithmetic`` by default).

The task owns its answer format, so the reward delegates to ``Task.verify`` instead of re-implementing the
parsing: what SFT teaches and what RL rewards can never drift apart.
"""

from __future__ import annotations

from roll.data.tasks import Task, get_task
from roll.pipelines.rewards.config import ArithmeticRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult


class ArithmeticReward:
    """Score 1 when ``task.verify(response, ground_truth)``, else 0. A malformed ground truth scores 0 with
    ``info["error"]`` (it is a data bug, but one bad row must not kill a training step)."""

    def __init__(self, config: ArithmeticRewardConfig | None = None) -> None:
        self.config = config or ArithmeticRewardConfig()
        self._task: Task = get_task(self.config.task)

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(request) for request in requests]

    def _score_one(self, request: RewardRequest) -> RewardResult:
        try:
            correct = self._task.verify(request.response, request.ground_truth)
        except (ValueError, TypeError) as exc:
            return RewardResult.unscored(
                f"cannot compare with ground truth {request.ground_truth!r}: {exc}", kind="bad ground truth"
            )
        answer = self._task.extract_answer(request.response)
        return RewardResult(score=float(correct), info={"correct": correct, "answer": answer})
