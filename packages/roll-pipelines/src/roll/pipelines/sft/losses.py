"""The SFT loss as a :class:`~roll.workers.types.LossFn`: summed token negative log-likelihood.

The strategy hands the loss ``logp_BT[b, t] = log p(ids[b, t] | ids[b, :t])``; the labels are unshifted (``-100``
off the assistant tokens), so the trained positions are exactly ``labels_BT != -100`` and the loss sum is
``sum_{b,t: label != -100} -logp_BT[b, t]``. The strategy divides it by the global count of trained tokens, which
makes a step's loss :func:`roll.pipelines.algorithms.preference.sft_cross_entropy` (token mean) over the whole
batch, however it is split into micro-batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.core.columns import IGNORE_INDEX, LABELS
from roll.pipelines.algorithms.aggregate import masked_sum
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch


@dataclass(frozen=True)
class SFTLoss(LossDefaults):
    """Token-sum cross-entropy over label tokens; one unit per trained token."""

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        mask_BT = micro_batch[LABELS].to(output.logp_BT.device) != IGNORE_INDEX
        return masked_sum(-output.logp_BT, mask_BT), {}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float((micro_batch[LABELS] != IGNORE_INDEX).sum())

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor:
        """The only positions the loss reads (the label tokens): the strategy projects and scores just these."""
        return micro_batch[LABELS] != IGNORE_INDEX
