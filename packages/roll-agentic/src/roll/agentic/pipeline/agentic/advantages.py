"""Reward normalization and advantages of agentic batches (pure tensor functions over Batch columns).

Groups are given by ids (``group_id_B``: the envs that shared a seed), not by a fixed ``[P, G]`` reshape, because
an env that timed out leaves its group one member short. The estimators use the id-based helpers of
:mod:`roll.pipelines.algorithms.advantages`:

- ``grpo``: ``(r - mean_g) / (std_g + eps)``; ``dr_grpo``: ``r - mean_g``; ``rloo``: ``n/(n-1) (r - mean_g)``
  (the leave-one-out baseline, written through the group mean); ``reinforce_pp_baseline``: ``r - mean_g``
  whitened over the batch's trained tokens; ``reinforce_pp``: discounted token returns of the (normalized)
  score placed on the last trained token, whitened;
- GiGPO (step mode): ``A^E`` over episode groups plus ``step_weight * A^S`` over anchor-state groups
  (:func:`~roll.pipelines.algorithms.advantages.gigpo_advantages`).

Reward normalization (before the estimator): ``batch`` over all rows, ``group`` within episode groups, ``tag``
within the rows of each env tag (envs with different reward scales train side by side).
"""

from __future__ import annotations

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.pipelines.algorithms import advantages as adv
from roll.pipelines.algorithms.presets import AlgorithmConfig

__all__ = ["compute_advantages", "normalize_scores"]


def normalize_scores(batch: Batch, mode: str, eps: float = 1e-6) -> torch.Tensor:
    """``scores_B`` normalized by ``mode`` (none, batch, group, tag); population std."""
    scores_B = batch.tensors[C.SCORES].float()
    if mode == "none":
        return scores_B
    if mode == "batch":
        return (scores_B - scores_B.mean()) / (scores_B.std(correction=0) + eps)
    if mode == "group":
        return adv.group_normalize(scores_B, batch.tensors[C.GROUP_ID], unbiased=False, eps=eps)
    tags = list(batch.non_tensors[C.TAG])
    tag_ids_B = torch.tensor([sorted(set(tags)).index(t) for t in tags], dtype=torch.long)
    return adv.group_normalize(scores_B, tag_ids_B, unbiased=False, eps=eps)


def compute_advantages(
    batch: Batch,
    algo: AlgorithmConfig,
    *,
    reward_norm: str,
    gigpo_weight: float | None = None,
    gigpo_norm_by_std: bool = True,
) -> torch.Tensor:
    """``advantages_BT`` (0 outside the loss mask) of an agentic batch."""
    mask_BT = batch.tensors[C.RESPONSE_MASK].float()
    scores_B = normalize_scores(batch, reward_norm)
    groups_B = batch.tensors[C.GROUP_ID]
    if gigpo_weight is not None:
        adv_B = adv.gigpo_advantages(
            scores_B, groups_B, batch.tensors[C.STEP_RETURN].float(), batch.tensors[C.ANCHOR_ID],
            step_weight=gigpo_weight, norm_by_std=gigpo_norm_by_std,
        )  # fmt: skip
        return _clip(adv.expand_to_tokens(adv_B, mask_BT), algo) * mask_BT
    if algo.adv_estimator == "reinforce_pp":
        rewards_BT = adv.outcome_to_token_rewards(scores_B, mask_BT)  # on the last trained token
        return _clip(adv.reinforce_pp_advantages(rewards_BT, mask_BT, gamma=algo.gamma)[0], algo) * mask_BT
    centered_B = scores_B - adv.group_mean_std(scores_B, groups_B)[0]
    if algo.adv_estimator == "reinforce_pp_baseline":
        return _clip(adv.masked_whiten(adv.expand_to_tokens(centered_B, mask_BT), mask_BT), algo) * mask_BT
    return _clip(adv.expand_to_tokens(_outcome(scores_B, groups_B, algo), mask_BT), algo) * mask_BT


def _outcome(scores_B: torch.Tensor, groups_B: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    if algo.adv_estimator == "dr_grpo":
        return adv.group_normalize(scores_B, groups_B, norm_by_std=False)
    if algo.adv_estimator == "rloo":
        index_B, n = adv.group_index(groups_B)
        size_B = torch.zeros(n).index_add_(0, index_B, torch.ones_like(scores_B))[index_B]
        centered_B = adv.group_normalize(scores_B, groups_B, norm_by_std=False)
        return centered_B * size_B / (size_B - 1).clamp(min=1)
    return adv.group_normalize(scores_B, groups_B)


def _clip(advantages_BT: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    if algo.advantage_clip is None:
        return advantages_BT
    return adv.clip_advantages(advantages_BT, max_abs=algo.advantage_clip)
