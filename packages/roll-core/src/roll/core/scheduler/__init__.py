"""Rollout scheduling: what runs where and when between the data, the inference workers and the reward workers.

- :mod:`.generate`: :class:`GenerateScheduler`: request-level generation, dynamic sampling through a callback,
  policy-version staleness bounds, async generation, validation generation.
- :mod:`.reward`: :class:`RewardScheduler`: reward-worker clusters by domain, rows routed by tag, non-blocking.
- :mod:`.rank_calls`: calls on one rank of a Cluster (:class:`RankRequest`: a typed cluster method with its
  arguments bound, which the schedulers take) and waiting on whichever call finishes first.

Generic over :class:`~roll.core.batch.Batch` and :class:`~roll.core.cluster.Cluster`: no model, reward or
algorithm code lives here; training modes pass those in as methods and callbacks.
"""

from roll.core.scheduler.generate import (
    GenerateOptions,
    GenerateScheduler,
    GroupFilter,
    PromptSource,
    RolloutBatch,
    Scorer,
)
from roll.core.scheduler.rank_calls import CallPool, RankCall, RankRequest, submit_to_rank
from roll.core.scheduler.reward import ColumnRows, RewardJob, RewardScheduler

__all__ = [
    "CallPool",
    "ColumnRows",
    "GenerateOptions",
    "GenerateScheduler",
    "GroupFilter",
    "PromptSource",
    "RankCall",
    "RankRequest",
    "RewardJob",
    "RewardScheduler",
    "RolloutBatch",
    "Scorer",
    "submit_to_rank",
]
