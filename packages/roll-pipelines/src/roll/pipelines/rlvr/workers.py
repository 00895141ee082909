"""RLVR's worker roles.

:class:`~roll.workers.roles.actor.ActorTrainWorker` already has everything RLVR needs (``train_with_metrics``
for the loss's own metrics, ``set_lr`` for a warm-up at its own rate, ``threads``); the name stays for readers.

:class:`RLVRCriticWorker` is roll-workers' :class:`~roll.workers.roles.critic.CriticWorker` plus what the actor
has and the critic lacks: ``train_with_metrics`` (the value loss's clip fraction and value mean come back with
the step's metrics) and ``threads``. Once ``CriticWorker`` grows them this becomes an alias too.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.core.batch import Batch
from roll.core.cluster import Dispatch, WorkerContext, register
from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.critic import CriticWorker
from roll.workers.types import LossFn

RLVRActorWorker = ActorTrainWorker


class RLVRCriticWorker(CriticWorker):
    """:class:`CriticWorker` with ``train_with_metrics`` and torch's thread count (see the module docstring)."""

    def __init__(
        self,
        ctx: WorkerContext,
        model: ModelConfig,
        strategy: Any,
        total_steps: int = 1,
        strategy_name: str = "fsdp2",
        threads: int | None = None,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        super().__init__(ctx, model, strategy, total_steps, strategy_name)

    @register(Dispatch.DP_SPLIT)
    def train_with_metrics(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step, plus the loss's own metrics (``loss_fn.metrics()``) under ``critic/``."""
        out = self.core.train_step(batch, loss_fn)
        collect = getattr(loss_fn, "metrics", None)
        extra = collect() if callable(collect) else {}
        return {**out, **{f"critic/{k}": v for k, v in extra.items()}}
