"""The :class:`~roll.workers.types.LossFn` objects of the RL modes (rlvr, agentic, on-policy distillation): the
policy loss (every :data:`~.registry.POLICY_LOSSES` entry, with KL, entropy bonus, the train/infer mismatch
metrics and a :data:`~.registry.MISMATCH_CORRECTIONS` correction), the critic's value
loss and the warm-up's masked NLL.

A LossFn returns a *sum* over its units and the training strategy divides by the global unit count of the whole
optimizer step (all micro-batches, all ranks). The aggregation modes of :mod:`.aggregate` are turned into that
contract by binding their global counts to 1 (``Aggregation(mode, num_global_tokens=1, num_global_seqs=1)``
gives the *sum* of what the mode averages) and reporting the mode's unit in :meth:`count_units`: tokens for
``token-mean``, sequences for the ``seq-mean-*`` modes. So the loss of a step is exactly the mode's global mean,
whatever the micro-batching or data parallelism.

Each loss returns its metrics (means over the micro-batch's units) with its sum; the strategy weights them by
units and the worker returns them next to its own.

Batch columns read (names from :mod:`roll.core.columns`): ``response_mask_BT``, ``advantages_BT``, and as the
algorithm asks ``old_logp_BT`` (several optimizer steps per rollout), ``ref_logp_BT`` (KL in the loss),
``infer_logp_BT`` (mismatch metrics, TIS/MIS/IcePop), ``old_values_BT`` and ``returns_BT`` (the critic), ``labels_BT`` (the NLL).

A driver builds these objects and sends them to the trainers, and a driver should not carry torch: this module
imports the torch-side algorithm modules inside the methods that compute, which run in the trainers only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from roll.core import columns as C
from roll.core.errors import DataError
from roll.pipelines.algorithms.choices import LossAggMode
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import MISMATCH_CORRECTIONS, POLICY_LOSSES
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from roll.pipelines.algorithms.aggregate import Aggregation


def _aggregation(mode: LossAggMode, norm_len: int) -> Aggregation:
    """``Aggregation(mode)`` with its global counts bound to 1 (see the module docstring)."""
    from roll.pipelines.algorithms.aggregate import Aggregation

    return Aggregation(mode, num_global_tokens=1.0, num_global_seqs=1.0, norm_len=norm_len)


def _units(micro_batch: MicroBatch, mode: LossAggMode) -> float:
    """A micro-batch's units under ``mode``: trained tokens, or sequences (a split trajectory's segment rows
    are :data:`~roll.core.columns.SEQ_UNITS` shares of one)."""
    mask_BT = micro_batch[C.RESPONSE_MASK]
    if mode == "token-mean":
        return float(mask_BT.sum())
    units_B = micro_batch.get(C.SEQ_UNITS)
    return float(mask_BT.shape[0]) if units_B is None else float(units_B.sum())


def _rows_agg(agg: Aggregation, micro_batch: MicroBatch, like: torch.Tensor) -> Aggregation:
    """``agg`` bound to the micro-batch's :data:`~roll.core.columns.SEQ_UNITS` / ``SEQ_TOKENS`` (on ``like``'s
    device), so a split trajectory weighs as one sequence (:mod:`.aggregate`); ``agg`` itself without them."""
    units_B, tokens_B = micro_batch.get(C.SEQ_UNITS), micro_batch.get(C.SEQ_TOKENS)
    return agg.for_rows(
        None if units_B is None else units_B.to(like), None if tokens_B is None else tokens_B.to(like)
    )


class PolicyLoss(LossDefaults):
    """Policy-gradient loss of an :class:`AlgorithmConfig`: surrogate + optional KL, entropy bonus and mismatch
    correction (TIS, MIS, IcePop; :mod:`.mismatch`), and the mismatch metrics whenever ``infer_logp_BT`` is there.

    ``norm_len`` is Dr. GRPO's constant (``loss_agg_norm_len`` or the rollout's max new tokens).
    ``use_old_logp=False`` treats the current policy as the old one (one optimizer step per rollout, where both
    are equal), which saves a forward pass; the ratio is then 1 and only its gradient matters.
    """

    def __init__(
        self, algo: AlgorithmConfig, *, norm_len: int, use_old_logp: bool, kl_coef: float = 0.0
    ) -> None:
        self.algo = algo
        self.kl_coef = kl_coef
        self.use_old_logp = use_old_logp
        self.needs_entropy = True  # logged every step; cheap next to the forward pass
        self.norm_len = algo.loss_agg_norm_len or norm_len

    @property
    def agg(self) -> Aggregation:
        return _aggregation(self.algo.loss_agg_mode, self.norm_len)

    def count_units(self, micro_batch: MicroBatch) -> float:
        """Response tokens (``token-mean``) or sequences (rows, or their :data:`~roll.core.columns.SEQ_UNITS`
        shares where a split trajectory's rows make one sequence), plus the
        :data:`~roll.core.columns.CARRIED_UNITS` of rows left out as :meth:`inert_rows`."""
        units = _units(micro_batch, self.algo.loss_agg_mode)
        carried_B = micro_batch.get(C.CARRIED_UNITS)
        return units if carried_B is None else units + float(carried_B.sum())

    def inert_rows(self, micro_batch: MicroBatch) -> torch.Tensor | None:
        """``bool [B]``: rows whose contribution to the gradient is exactly zero, or None when no row can be.

        Every surrogate here (PPO, GSPO, CISPO, TOPR, SAPO, GMPO, with or without a mismatch correction) is the
        advantage times a factor, so a row whose advantages are 0 on all its response tokens (a GRPO group whose
        samples all scored the same) adds 0 to the loss and to every gradient; only its units count, through the
        normalizer. A KL loss or an
        entropy bonus pulls on every row, so with either no row is inert. ``skip_zero_advantage: false`` turns
        the check off.
        """
        a = self.algo
        if not a.skip_zero_advantage or a.kl_mode == "loss" or a.entropy_coef > 0:
            return None
        if POLICY_LOSSES.entry(a.loss_type).batch_coupled:
            return None  # clip_cov / kl_cov pick tokens by statistics over the whole micro-batch
        live_BT = (micro_batch[C.ADVANTAGES] != 0) & micro_batch[C.RESPONSE_MASK].bool()
        inert_B: torch.Tensor = ~live_BT.any(dim=-1)
        return inert_B

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor:
        """The only positions the loss reads (the response tokens): the strategy projects and scores just these,
        and the entropy is taken there only."""
        return micro_batch[C.RESPONSE_MASK].bool()

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        from roll.pipelines.algorithms.kl import kl_loss
        from roll.pipelines.algorithms.policy_loss import entropy_bonus

        logp_BT = output.logp_BT
        mask_BT = micro_batch[C.RESPONSE_MASK].to(logp_BT.dtype)
        old_BT = micro_batch[C.OLD_LOGP].to(logp_BT) if self.use_old_logp else logp_BT.detach()
        adv_BT = micro_batch[C.ADVANTAGES].to(logp_BT)
        is_weight_BT, metrics = self._mismatch(old_BT, micro_batch, mask_BT)
        agg = _rows_agg(self.agg, micro_batch, logp_BT)
        loss, pg_metrics = self._surrogate(logp_BT, old_BT, adv_BT, mask_BT, is_weight_BT, agg)
        metrics.update(pg_metrics)
        if self.algo.kl_mode == "loss":
            kl, kl_metrics = kl_loss(
                logp_BT, micro_batch[C.REF_LOGP].to(logp_BT), mask_BT,
                coef=self.kl_coef, estimator=self.algo.kl_estimator, agg=agg,
            )  # fmt: skip
            loss, metrics = loss + kl, {**metrics, **kl_metrics}
        if output.entropy_BT is not None:
            bonus, ent_metrics = entropy_bonus(
                output.entropy_BT, mask_BT, coef=self.algo.entropy_coef, agg=agg
            )
            loss = loss + bonus if self.algo.entropy_coef > 0 else loss
            metrics.update(ent_metrics)
        return loss, metrics

    def _mismatch(
        self, old_BT: torch.Tensor, micro_batch: MicroBatch, mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The rollout-vs-trainer metrics whenever the batch carries the sampler's log-probs, and the weight of
        the configured correction (None without one). ``old_BT`` is the trainer's log-prob of the policy that
        sampled (``old_logp_BT``, or this forward's own when one optimizer step trains on the rollout)."""
        from roll.pipelines.algorithms.mismatch import mismatch_metrics

        if C.INFER_LOGP not in micro_batch:
            return None, {}
        infer_BT = micro_batch[C.INFER_LOGP].to(old_BT)
        metrics = mismatch_metrics(old_BT, infer_BT, mask_BT)
        correction = self.algo.correction()
        if correction is None:
            return None, metrics
        weight_BT, correction_metrics = MISMATCH_CORRECTIONS.implementation(correction.type)(
            old_BT, infer_BT, mask_BT, cfg=correction
        )
        return weight_BT, {**metrics, **correction_metrics}

    def _surrogate(
        self,
        logp_BT: torch.Tensor,
        old_BT: torch.Tensor,
        adv_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        is_weight_BT: torch.Tensor | None,
        agg: Aggregation,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        surrogate = POLICY_LOSSES.implementation(self.algo.loss_type)
        out: tuple[torch.Tensor, dict[str, torch.Tensor]] = surrogate(
            logp_BT, old_BT, adv_BT, mask_BT, algo=self.algo, is_weight_BT=is_weight_BT, agg=agg
        )
        return out


# The surrogates of POLICY_LOSSES, as (logp, old, adv, mask, *, algo, is_weight_BT, agg) -> (loss, metrics).


@POLICY_LOSSES.bind("ppo")
def _ppo(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import ppo_policy_loss

    return ppo_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT,
        clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip_c=algo.dual_clip_c, **kw,
    )  # fmt: skip


@POLICY_LOSSES.bind("gspo")
def _gspo(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import gspo_policy_loss

    return gspo_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, clip_low=algo.clip_low, clip_high=algo.clip_high, **kw
    )


@POLICY_LOSSES.bind("cispo")
def _cispo(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import cispo_policy_loss

    return cispo_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, clip_low=algo.clip_low, clip_high=algo.clip_high, **kw
    )


@POLICY_LOSSES.bind("topr")
def _topr(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import topr_policy_loss

    return topr_policy_loss(logp_BT, old_BT, adv_BT, mask_BT, level=algo.topr_level, **kw)


@POLICY_LOSSES.bind("sapo")
def _sapo(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import sapo_policy_loss

    return sapo_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, tau_pos=algo.sapo_tau_pos, tau_neg=algo.sapo_tau_neg, **kw
    )


@POLICY_LOSSES.bind("gmpo")
def _gmpo(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.policy_loss import gmpo_policy_loss

    return gmpo_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, clip_low=algo.clip_low, clip_high=algo.clip_high, **kw
    )


@POLICY_LOSSES.bind("clip_cov")
def _clip_cov(
    logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any
) -> Any:
    from roll.pipelines.algorithms.covariance import clip_cov_policy_loss

    return clip_cov_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, clip_low=algo.clip_low, clip_high=algo.clip_high,
        ratio=algo.cov_ratio, cov_lb=algo.clip_cov_lb, cov_ub=algo.clip_cov_ub, **kw,
    )  # fmt: skip


@POLICY_LOSSES.bind("kl_cov")
def _kl_cov(logp_BT: Tensor, old_BT: Tensor, adv_BT: Tensor, mask_BT: Tensor, *, algo: Any, **kw: Any) -> Any:
    from roll.pipelines.algorithms.covariance import kl_cov_policy_loss

    return kl_cov_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, ratio=algo.cov_ratio, coef=algo.kl_cov_coef, **kw
    )


POLICY_LOSSES.check_bound()


class ValueLoss(LossDefaults):
    """The critic's clipped value loss on the response tokens, aggregated as the policy loss is.

    Reads ``old_values_BT`` (the values the advantages were computed with, already shifted by
    :func:`action_values`) and ``returns_BT``; the forward's ``values_BT`` is shifted here the same way.
    Metrics: ``vf_clip_frac``, ``value_mean``, ``value_error`` (masked mean of ``|V - R|``).
    """

    def __init__(self, *, clip_range: float | None, agg_mode: LossAggMode, norm_len: int) -> None:
        self.clip_range = clip_range
        self.agg_mode, self.norm_len = agg_mode, norm_len

    @property
    def agg(self) -> Aggregation:
        return _aggregation(self.agg_mode, self.norm_len)

    def count_units(self, micro_batch: MicroBatch) -> float:
        return _units(micro_batch, self.agg_mode)

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        from roll.pipelines.algorithms.aggregate import masked_mean
        from roll.pipelines.algorithms.value_loss import action_values, clipped_value_loss

        if output.values_BT is None:
            raise DataError("ValueLoss needs a value head (ForwardOutput.values_BT); train it on the critic")
        values_BT = action_values(output.values_BT)
        mask_BT = micro_batch[C.RESPONSE_MASK].to(values_BT.dtype)
        returns_BT = micro_batch[C.RETURNS].to(values_BT)
        loss, metrics = clipped_value_loss(
            values_BT, micro_batch[C.OLD_VALUES].to(values_BT), returns_BT, mask_BT,
            clip_range=self.clip_range, agg=_rows_agg(self.agg, micro_batch, values_BT),
        )  # fmt: skip
        metrics["value_error"] = masked_mean((values_BT.detach() - returns_BT).abs(), mask_BT)
        return loss, metrics


class MaskedNLLLoss(LossDefaults):
    """Token cross-entropy on a mask (the SFT warm-up's loss), one unit per trained token; metric ``nll``.

    ``mask="labels"`` trains the positions whose ``labels_BT`` is not -100 (rlvr's warm-up rows),
    ``mask="response"`` those of ``response_mask_BT`` (agentic's answer tokens).
    """

    def __init__(self, mask: Literal["labels", "response"] = "labels") -> None:
        self.mask = mask

    def _mask_BT(self, micro_batch: MicroBatch) -> torch.Tensor:
        if self.mask == "labels":
            return micro_batch[C.LABELS] != C.IGNORE_INDEX
        return micro_batch[C.RESPONSE_MASK].bool()

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(self._mask_BT(micro_batch).sum())

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        mask_BT = self._mask_BT(micro_batch).to(output.logp_BT)
        nll_sum = -(output.logp_BT * mask_BT).sum()
        return nll_sum, {"nll": nll_sum.detach() / mask_BT.sum().clamp(min=1)}
