"""The RL objective of a run: from a scored batch to advantages, and the policy loss that trains on them.

:class:`PolicyObjective` holds what an :class:`~roll.pipelines.algorithms.presets.AlgorithmConfig` needs across
steps: the KL controller (its coefficient moves with the measured KL when adaptive) and the running reward
statistics (``reward_norm: running``), both part of a checkpoint. Its steps, called by every RL mode:

- :meth:`advantages`: reward normalization over the batch's groups (``group_id_B``), KL in the reward when asked,
  then the registered estimator (:func:`~roll.pipelines.algorithms.estimators.estimate_advantages`); writes
  ``advantages_BT`` (and ``returns_BT`` with a critic);
- :meth:`loss`: the :class:`~roll.pipelines.algorithms.losses.PolicyLoss` at the controller's coefficient;
- :meth:`observe`: the KL controller sees the step's measured KL.

The forward-only columns the objective reads (``old_values_BT``, ``ref_logp_BT``, ``old_logp_BT``) come from
:meth:`~roll.pipelines.policy.group.PolicyGroup.prepare`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.batch import Batch
from roll.pipelines.algorithms.kl_control import build_kl_controller
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import AlgorithmConfig

if TYPE_CHECKING:
    import torch

    from roll.pipelines.algorithms.stats import RunningMeanStd


class PolicyObjective:
    """See the module docstring: ``algorithm.adv_estimator`` estimates, ``algorithm.reward_norm`` normalizes."""

    def __init__(self, algorithm: AlgorithmConfig) -> None:
        a = self.algorithm = algorithm
        self.kl = build_kl_controller(a.kl_coef, target=a.kl_target, horizon=a.kl_horizon)
        self.running: RunningMeanStd | None = None
        if a.reward_norm == "running":
            from roll.pipelines.algorithms.stats import RunningMeanStd

            self.running = RunningMeanStd()

    def advantages(self, batch: Batch, rewards_B: torch.Tensor, **params: Any) -> Batch:
        """``advantages_BT`` (0 off ``response_mask_BT``) of ``batch`` for the per-row ``rewards_B``; ``params``
        override :class:`EstimatorParams` (GiGPO's ``step_weight``, ``norm_by_std``). Runs where the batch is
        torch (rlvr: in the train actor, :mod:`roll.pipelines.rlvr.tensor_work`)."""
        from roll.pipelines.algorithms.estimators import AdvantageInputs, EstimatorParams, estimate_advantages
        from roll.pipelines.algorithms.stats import normalize_rewards

        t = batch.tensors
        mask_BT = t[C.RESPONSE_MASK].float()
        normalized_B = normalize_rewards(
            rewards_B.float(), mode=self.algorithm.reward_norm, group_ids_B=t[C.GROUP_ID],
            tags=list(batch[C.TAG]) if C.TAG in batch else None, running=self.running,
        )  # fmt: skip
        inputs = AdvantageInputs(
            normalized_B, mask_BT, group_ids_B=t[C.GROUP_ID], values_BT=t.get(C.OLD_VALUES),
            kl_BT=self.sampled_kl_BT(batch) if self.algorithm.kl_mode == "reward" else None,
            step_returns_B=t.get(C.STEP_RETURN), anchor_ids_B=t.get(C.ANCHOR_ID),
        )  # fmt: skip
        est = EstimatorParams.of(self.algorithm, kl_coef=self.kl.value)
        out = estimate_advantages(
            self.algorithm.adv_estimator, inputs, replace(est, **params) if params else est
        )
        batch[C.ADVANTAGES] = out.advantages_BT
        if out.returns_BT is not None and C.OLD_VALUES in t:
            batch[C.RETURNS] = out.returns_BT
        return batch

    def sampled_kl_BT(self, batch: Batch) -> torch.Tensor:
        """Per-token KL of the sampling policy to the reference (KL in the reward), 0 off the response."""
        from roll.pipelines.algorithms.kl import kl_estimate

        t = batch.tensors
        logp_BT = t[C.OLD_LOGP] if C.OLD_LOGP in t else t[C.INFER_LOGP]
        kl_BT = kl_estimate(logp_BT, t[C.REF_LOGP], estimator=self.algorithm.kl_estimator)
        return kl_BT * t[C.RESPONSE_MASK].float()

    def loss(self, *, norm_len: int, use_old_logp: bool) -> PolicyLoss:
        return PolicyLoss(self.algorithm, norm_len=norm_len, use_old_logp=use_old_logp, kl_coef=self.kl.value)

    def observe(self, metrics: Mapping[str, float], rows: int) -> None:
        """The step's measured KL (``actor/kl``) moves an adaptive controller."""
        self.kl.update(metrics.get("actor/kl", 0.0), rows)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"kl": self.kl.state_dict()}
        if self.running is not None:
            state["running"] = dict(vars(self.running))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.kl.load_state_dict(dict(state["kl"]))
        if self.running is not None and "running" in state:
            vars(self.running).update(state["running"])
