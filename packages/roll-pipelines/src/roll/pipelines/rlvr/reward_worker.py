"""Reward workers: Ray actors around the ``roll.reward`` plugins, one cluster per reward domain.

A worker builds its reward function once (``spec.build(spec.config_model(**options))``), then scores batches of
generated rows off the training path: the :class:`~roll.core.scheduler.RewardScheduler` submits each request's
samples as soon as they are generated, so scoring overlaps the next generation. Rewards that can hang (math-verify,
the code sandbox) enforce their own timeouts; a bad *response* scores 0 with the reason in ``info``.

Columns read: ``text`` (the decoded response), ``ground_truth``, optional ``prompt``, ``tag``. Written:
``scores_B`` (float) and ``correct_B`` (1.0 when the reward's ``info`` says the answer is correct, else the score
clipped to [0, 1]; the accuracy metric), ``reward_error_B`` (1.0 when the reward could not score the row).
"""

from __future__ import annotations

from typing import Any

import torch

from roll.core import columns as C
from roll.core import plugins
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.pipelines.rewards.types import RewardFunction, RewardRequest, RewardResult


class RewardWorker(Worker):
    """Scores rows with the ``roll.reward`` plugin ``reward_type`` built from ``options``."""

    def __init__(self, ctx: WorkerContext, reward_type: str, options: dict[str, Any]) -> None:
        super().__init__(ctx)
        torch.set_num_threads(1)
        spec = plugins.load("roll.reward", reward_type)
        config = spec.config_model(**options) if spec.config_model is not None else None
        self.reward: RewardFunction = spec.build(config) if config is not None else spec.build()

    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        """``scores_B``, ``correct_B`` and ``reward_error_B`` of every row, in order."""
        results = self.reward.score([_request(batch, i) for i in range(len(batch))])
        return Batch(
            {
                C.SCORES: torch.tensor([r.score for r in results], dtype=torch.float32),
                C.CORRECT: torch.tensor([_correct(r) for r in results], dtype=torch.float32),
                C.REWARD_ERROR: torch.tensor(
                    [float("error" in r.info) for r in results], dtype=torch.float32
                ),
            }
        )


def _request(batch: Batch, i: int) -> RewardRequest:
    def text(column: str) -> str:
        return str(batch[column][i]) if column in batch and batch[column][i] is not None else ""

    return RewardRequest(
        response=text(C.TEXT), prompt=text(C.PROMPT), ground_truth=text(C.GROUND_TRUTH), tag=text(C.TAG)
    )


def _correct(result: RewardResult) -> float:
    if "correct" in result.info:
        return float(bool(result.info["correct"]))
    return min(max(result.score, 0.0), 1.0)
