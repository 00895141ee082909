"""The reward-model loss as a :class:`~roll.workers.types.LossFn`: Bradley-Terry over interleaved pairs.

The reward worker's forward fills ``ForwardOutput.scores_B`` (one scalar per sequence, read at its last real token).
Rows are interleaved (``2i`` chosen, ``2i + 1`` rejected), so the loss of a micro-batch is
:func:`~roll.pipelines.algorithms.preference.bradley_terry_loss` of ``scores_B[0::2]`` against
``scores_B[1::2]``, returned as a sum over pairs (one unit per pair); the strategy's division by the global pair
count makes it the published mean ``-mean log sigmoid(r_c - r_r)`` over the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.core import columns as C
from roll.core.errors import WorkerError
from roll.pipelines.algorithms.preference import bradley_terry_loss
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch


@dataclass(frozen=True)
class BradleyTerryLoss(LossDefaults):
    """Sum over pairs of ``-log sigmoid(r_chosen - r_rejected)``."""

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        if output.scores_B is None:
            raise WorkerError("BradleyTerryLoss needs scores_B: train it on a RewardModelWorker")
        scores_B = output.scores_B
        loss, _ = bradley_terry_loss(scores_B[0::2], scores_B[1::2])
        return loss * (scores_B.shape[0] // 2), {}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.INPUT_IDS].shape[0] // 2)
