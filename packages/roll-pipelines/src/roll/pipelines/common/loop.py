"""Pieces of the offline modes' step loop: reading rows, one optimizer step per chunk, reducing metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from roll.core.batch import Batch
from roll.core.config.batch import BatchConfig
from roll.core.tracking import reduce_metrics
from roll.workers.roles.actor import LOSS_METRIC_PREFIX
from roll.workers.types import LossFn

if TYPE_CHECKING:
    from roll.workers.roles.clusters import ChunkTrainer

TRAIN_METRIC_REDUCTION = {"loss": "mean", "grad_norm": "max", "lr": "max", "tokens": "sum", "units": "max"}
"""Per-rank train_step metrics: ``loss``, ``grad_norm``, ``lr`` and ``units`` are already global (equal on every
rank), ``tokens`` are this rank's."""


def optimizer_chunks(rows: Sequence[Any], batch: BatchConfig) -> list[list[Any]]:
    """The step's rows cut into ``optimizer_steps_per_step`` consecutive chunks (one optimizer step each)."""
    n = batch.optimizer_steps_per_step
    size = len(rows) // n
    return [list(rows[i * size : (i + 1) * size]) for i in range(n)]


def train_chunks(cluster: ChunkTrainer, chunks: Sequence[Batch], loss_fn: LossFn) -> dict[str, float]:
    """One ``train_step`` per chunk; metrics of the last optimizer step, tokens summed over the step.

    The loss's own metrics (DPO's reward accuracy and margin) join the step's under their own names, without the
    role's ``actor/`` prefix (the rank mean: ranks hold equal numbers of units)."""
    metrics: dict[str, float] = {}
    tokens = 0.0
    for chunk in chunks:
        per_rank = cluster.train_step(chunk, loss_fn)
        per_rank = [{k.removeprefix(LOSS_METRIC_PREFIX): v for k, v in r.items()} for r in per_rank]
        metrics = reduce_metrics(per_rank, TRAIN_METRIC_REDUCTION)
        tokens += metrics.pop("tokens", 0.0)
    metrics["tokens"] = tokens
    return metrics


def sum_metrics(per_call: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Add up ``*_sum`` counters over calls (each already reduced over ranks)."""
    total: dict[str, float] = {}
    for metrics in per_call:
        for name, value in metrics.items():
            total[name] = total.get(name, 0.0) + value
    return total
