"""The :class:`~roll.workers.types.LossFn` objects of the agentic pipeline, on :mod:`roll.pipelines.algorithms`.

Same contract as every roll loss: ``__call__`` returns a *sum* over units and the strategy divides by the global
unit count of the optimizer step. An aggregation mode is turned into that contract by binding its global counts
to 1 (``Aggregation(mode, num_global_tokens=1, num_global_seqs=1)`` is the *sum* of what the mode averages) and
reporting the mode's unit in :meth:`count_units` (tokens for ``token-mean``, sequences otherwise).

Columns read: ``response_mask_BT`` (the loss mask: model-sampled tokens only), ``advantages_BT`` and, when
several optimizer steps share one rollout, ``old_logp_BT``.
"""

from __future__ import annotations

import torch

from roll.core import columns as C
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.policy_loss import (
    cispo_policy_loss,
    entropy_bonus,
    gspo_policy_loss,
    ppo_policy_loss,
    topr_policy_loss,
)
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, MicroBatch

__all__ = ["AgenticPolicyLoss", "MaskedNLLLoss"]


class AgenticPolicyLoss:
    """The preset's policy-gradient surrogate (PPO, GSPO, CISPO or TOPR) plus its entropy bonus."""

    def __init__(self, algo: AlgorithmConfig, *, norm_len: int, use_old_logp: bool) -> None:
        self.algo = algo
        self.use_old_logp = use_old_logp
        self.needs_entropy = True
        self.agg = Aggregation(
            algo.loss_agg_mode,
            num_global_tokens=1.0,
            num_global_seqs=1.0,
            norm_len=algo.loss_agg_norm_len or norm_len,
        )

    def count_units(self, micro_batch: MicroBatch) -> float:
        mask_BT = micro_batch[C.RESPONSE_MASK]
        return float(mask_BT.sum()) if self.algo.loss_agg_mode == "token-mean" else float(mask_BT.shape[0])

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        logp_BT = output.logp_BT
        mask_BT = micro_batch[C.RESPONSE_MASK].to(logp_BT.dtype)
        old_BT = micro_batch[C.OLD_LOGP].to(logp_BT) if self.use_old_logp else logp_BT.detach()
        adv_BT = micro_batch[C.ADVANTAGES].to(logp_BT)
        loss, metrics = self._surrogate(logp_BT, old_BT, adv_BT, mask_BT)
        if output.entropy_BT is not None:
            bonus, ent = entropy_bonus(output.entropy_BT, mask_BT, coef=self.algo.entropy_coef, agg=self.agg)
            loss = loss + bonus if self.algo.entropy_coef > 0 else loss
            metrics = {**metrics, **ent}
        return loss, metrics

    def _surrogate(
        self, logp_BT: torch.Tensor, old_BT: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        a = self.algo
        if a.loss_type == "gspo":
            return gspo_policy_loss(
                logp_BT, old_BT, adv_BT, mask_BT, clip_low=a.clip_low, clip_high=a.clip_high, agg=self.agg
            )
        if a.loss_type == "cispo":
            return cispo_policy_loss(
                logp_BT, old_BT, adv_BT, mask_BT, clip_low=a.clip_low, clip_high=a.clip_high, agg=self.agg
            )
        if a.loss_type == "topr":
            return topr_policy_loss(logp_BT, old_BT, adv_BT, mask_BT, level=a.topr_level, agg=self.agg)
        return ppo_policy_loss(
            logp_BT, old_BT, adv_BT, mask_BT,
            clip_low=a.clip_low, clip_high=a.clip_high, dual_clip_c=a.dual_clip_c, agg=self.agg,
        )  # fmt: skip


class MaskedNLLLoss:
    """Token cross-entropy on ``response_mask_BT`` (the warm-up's loss: the answer tokens only)."""

    needs_entropy = False

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        mask_BT = micro_batch[C.RESPONSE_MASK].to(output.logp_BT.dtype)
        nll_sum = -(output.logp_BT * mask_BT).sum()
        return nll_sum, {"nll": nll_sum.detach() / mask_BT.sum().clamp(min=1)}
