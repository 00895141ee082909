"""RLVR's actor worker: :class:`~roll.workers.roles.actor.ActorTrainWorker` plus loss metrics and an lr switch.

Composition would need the base worker to return a loss's metrics; until it does, this subclass adds two
registered methods and nothing else.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.core.batch import Batch
from roll.core.cluster import Dispatch, WorkerContext, register
from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.types import LossFn


class RLVRActorWorker(ActorTrainWorker):
    """The trained policy; ``threads`` sets torch's intra-op threads (CPU runs)."""

    def __init__(self, ctx: WorkerContext, *args: Any, threads: int | None = None, **kwargs: Any) -> None:
        if threads:
            torch.set_num_threads(threads)
        super().__init__(ctx, *args, **kwargs)

    @register(Dispatch.DP_SPLIT)
    def train_with_metrics(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> dict[str, float]:
        """:meth:`train_step`, plus the loss's own metrics (``loss_fn.metrics()``), prefixed ``actor/``."""
        out = self.train_step(batch, loss_fn, temperature)
        collect = getattr(loss_fn, "metrics", None)
        extra = collect() if callable(collect) else {}
        return {**out, **{f"actor/{k}": v for k, v in extra.items()}}

    @register(Dispatch.ONE_TO_ALL)
    def set_lr(self, lr: float) -> None:
        """Use ``lr`` as the base rate from now on (the warm-up trains at its own rate, then RL at its own)."""
        optimizer = self.strategy.optimizer
        for group in optimizer.param_groups:
            group["lr"] = lr
            group["initial_lr"] = lr
        self.strategy.scheduler.base_lrs = [lr for _ in optimizer.param_groups]
