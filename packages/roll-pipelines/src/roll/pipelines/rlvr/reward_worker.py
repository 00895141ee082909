"""Reward workers: Ray actors around the ``roll.reward`` plugins, one cluster per reward domain.

A worker builds its reward function once (``spec.build(spec.config_model(**options))``), then scores batches of
generated rows off the training path: the :class:`~roll.core.scheduler.RewardScheduler` submits each request's
samples as soon as they are generated, so scoring overlaps the next generation. Rewards that can hang (math-verify,
the code sandbox) enforce their own timeouts; a bad *response* scores 0 with the reason in ``info``.

The worker takes and returns plain lists (the scheduler is built with ``columns=REWARD_COLUMNS``), and this module
imports no torch: a text reward's process stays at ~100 MB instead of ~650 and starts in a second or two. A reward
plugin that needs torch (a reward model) imports it in its own ``build``.

Columns read (:data:`REWARD_COLUMNS`): ``text`` (the decoded response), ``ground_truth``, optional ``prompt``,
``tag``. Written: ``scores_B`` and ``correct_B`` (1.0 when the reward's ``info`` says the answer is correct, else
the score clipped to [0, 1]; the accuracy metric), ``reward_error_B`` (1.0 when the reward could not score the
row); the scheduler makes them float32 tensors.
"""

from __future__ import annotations

import os
from typing import Any

from roll.core import columns as C
from roll.core import plugins
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.pipelines.rewards.types import RewardFunction, RewardRequest, RewardResult

__all__ = ["REWARD_COLUMNS", "RewardWorker"]

REWARD_COLUMNS = (C.TEXT, C.PROMPT, C.GROUND_TRUTH, C.TAG)
"""The columns a reward worker gets; pass as ``RewardScheduler(columns=...)``."""

Rows = dict[str, list[Any]]


class RewardWorker(Worker):
    """Scores rows with the ``roll.reward`` plugin ``reward_type`` built from ``options``."""

    def __init__(self, ctx: WorkerContext, reward_type: str, options: dict[str, Any]) -> None:
        super().__init__(ctx)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # for a plugin that brings torch along
        spec = plugins.load("roll.reward", reward_type)
        config = spec.config_model(**options) if spec.config_model is not None else None
        self.reward: RewardFunction = spec.build(config) if config is not None else spec.build()

    @register(Dispatch.RANK_ZERO)  # the RewardScheduler sends each rank its share itself
    def score(self, rows: Rows) -> dict[str, list[float]]:
        """``scores_B``, ``correct_B`` and ``reward_error_B`` of every row, in order."""
        n = len(next(iter(rows.values()), []))
        results = self.reward.score([_request(rows, i) for i in range(n)])
        return {
            C.SCORES: [float(r.score) for r in results],
            C.CORRECT: [_correct(r) for r in results],
            C.REWARD_ERROR: [float("error" in r.info) for r in results],
        }


def _request(rows: Rows, i: int) -> RewardRequest:
    def text(column: str) -> str:
        value = rows[column][i] if column in rows else None
        return str(value) if value is not None else ""

    return RewardRequest(
        response=text(C.TEXT), prompt=text(C.PROMPT), ground_truth=text(C.GROUND_TRUTH), tag=text(C.TAG)
    )


def _correct(result: RewardResult) -> float:
    if "correct" in result.info:
        return float(bool(result.info["correct"]))
    return min(max(result.score, 0.0), 1.0)
