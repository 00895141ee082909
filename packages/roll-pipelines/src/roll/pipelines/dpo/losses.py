"""DPO-family losses as :class:`~roll.workers.types.LossFn` objects over interleaved pair batches.

A micro-batch holds pairs interleaved (row ``2i`` chosen, ``2i + 1`` rejected, see
:mod:`roll.pipelines.common.data`) and the reference's summed response log-probs in ``ref_logp`` ``[2B]``. The
loss of a pair is :func:`~roll.pipelines.algorithms.preference.dpo_loss` (sigmoid; conservative DPO with
``label_smoothing``), :func:`~roll.pipelines.algorithms.preference.ipo_loss` or
:func:`~roll.pipelines.algorithms.preference.simpo_loss` (no reference); the LossFn returns their *sum* over the
micro-batch's pairs (one unit per pair), so the strategy's division by the global pair count gives the published
mean over the whole batch. :class:`KTOLoss` does the same over unpaired rows (one unit per row).

With the sum, :class:`DPOLoss` returns the train-side preference metrics (reward accuracy, margin, chosen and
rejected implicit rewards) as means over the micro-batch's pairs; the strategy weights them by pairs, so
``ActorTrainWorker.train_step`` reports them for each optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from roll.core.columns import DESIRABLE, IGNORE_INDEX, LABELS, REF_SEQ_LOGP
from roll.core.errors import DataError
from roll.pipelines.algorithms.preference import (
    PreferenceOutput,
    dpo_loss,
    ipo_loss,
    kto_loss,
    sequence_logp,
    simpo_loss,
)
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch

DPOLossType = Literal["sigmoid", "ipo", "simpo"]


def response_logp(logp_BT: torch.Tensor, labels_BT: torch.Tensor, *, average: bool = False) -> torch.Tensor:
    """Each row's response log-prob (sum, or per-token mean when ``average``) ``[B]``."""
    return sequence_logp(logp_BT, labels_BT.to(logp_BT.device) != IGNORE_INDEX, average=average)


def preference_output(
    logp_B: torch.Tensor,
    ref_logp_B: torch.Tensor | None,
    *,
    loss_type: DPOLossType,
    beta: float,
    label_smoothing: float = 0.0,
    gamma: float = 0.0,
) -> PreferenceOutput:
    """The chosen loss on interleaved rows: even rows chosen, odd rows rejected."""
    if loss_type == "simpo":  # reference-free: ref_logp_B is not read
        return simpo_loss(logp_B[0::2], logp_B[1::2], beta=beta, gamma=gamma, label_smoothing=label_smoothing)
    if ref_logp_B is None:
        raise DataError(
            f"the {loss_type} loss needs reference log-probs ({REF_SEQ_LOGP}); the batch has none"
        )
    ref_logp_B = ref_logp_B.to(logp_B.device, logp_B.dtype)
    args = (logp_B[0::2], logp_B[1::2], ref_logp_B[0::2], ref_logp_B[1::2])
    if loss_type == "ipo":
        return ipo_loss(*args, beta=beta)
    return dpo_loss(*args, beta=beta, label_smoothing=label_smoothing)


@dataclass
class DPOLoss(LossDefaults):
    """Sum over pairs of the DPO (sigmoid / conservative), IPO or SimPO loss (``gamma``: SimPO's margin); one unit
    per pair.

    ``average_logp`` uses per-token mean response log-probs (what IPO's authors do) instead of sums.
    """

    loss_type: DPOLossType = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    average_logp: bool = False
    gamma: float = 0.0
    paired_rows = True  # unannotated: a class attribute, not a constructor field
    """Rows are interleaved chosen/rejected pairs: the strategy may run each pair's common prefix once."""

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        """The pairs' summed loss, and ``reward_accuracy``, ``reward_margin``, ``chosen_reward`` and
        ``rejected_reward`` (means over the pairs, before the update)."""
        logp_B = response_logp(output.logp_BT, micro_batch[LABELS], average=self.average_logp)
        result = preference_output(
            logp_B,
            micro_batch.get(REF_SEQ_LOGP),
            loss_type=self.loss_type,
            beta=self.beta,
            label_smoothing=self.label_smoothing,
            gamma=self.gamma,
        )
        return result.loss * (logp_B.shape[0] // 2), result.metrics

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[LABELS].shape[0] // 2)

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor:
        """The only positions the loss reads (the response tokens): the strategy projects and scores just these."""
        return micro_batch[LABELS] != IGNORE_INDEX


@dataclass
class KTOLoss(LossDefaults):
    """Sum over rows of the KTO loss of unpaired completions (labels in ``desirable_B``); one unit per row.

    ``kl`` is the step's reference point ``z0`` (:func:`~roll.pipelines.algorithms.preference.kto_reference_point`
    over the step's mismatched pairs, computed by the pipeline before the step and detached), so every
    micro-batch of the step uses the same one. Metrics: ``kl``, ``chosen_reward``, ``rejected_reward``,
    ``reward_margin`` (micro-batch means).
    """

    beta: float = 0.1
    kl: float = 0.0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    average_logp: bool = False

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        logp_B = response_logp(output.logp_BT, micro_batch[LABELS], average=self.average_logp)
        result = kto_loss(
            logp_B, micro_batch[REF_SEQ_LOGP].to(logp_B), micro_batch[DESIRABLE].to(logp_B.device),
            kl=self.kl, beta=self.beta, desirable_weight=self.desirable_weight,
            undesirable_weight=self.undesirable_weight,
        )  # fmt: skip
        return result.loss * logp_B.shape[0], result.metrics

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[LABELS].shape[0])

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor:
        """The only positions the loss reads (the completion tokens)."""
        return micro_batch[LABELS] != IGNORE_INDEX
