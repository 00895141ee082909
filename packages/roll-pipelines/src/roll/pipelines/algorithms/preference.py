"""Preference losses for the DPO and reward-model pipelines, and the SFT token cross-entropy.

DPO-family losses take summed log-probabilities of whole responses (``[B]``, one per pair, see
:func:`sequence_logp`) under the policy and the frozen reference, and return a :class:`PreferenceOutput`:
the mean loss, the implicit rewards ``beta * (logp - ref_logp)`` of chosen and rejected (detached), and metrics
(``reward_accuracy``: fraction of pairs where chosen's implicit reward is higher; ``reward_margin``: mean
chosen minus rejected implicit reward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_sum

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PreferenceOutput:
    """A DPO-family loss with its implicit rewards and metrics."""

    loss: torch.Tensor
    chosen_rewards_B: torch.Tensor
    rejected_rewards_B: torch.Tensor
    metrics: Metrics


def sequence_logp(logp_BT: torch.Tensor, mask_BT: torch.Tensor, *, average: bool = False) -> torch.Tensor:
    """Log-probability of each response, ``sum_t logp * mask`` (or its per-token mean when ``average``), ``[B]``."""
    total_B = masked_sum(logp_BT, mask_BT, dim=-1)
    return total_B / mask_BT.sum(dim=-1).clamp(min=1) if average else total_B


def _log_ratio_gap(
    policy_chosen_logp_B: torch.Tensor,
    policy_rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    chosen_B = policy_chosen_logp_B - ref_chosen_logp_B.detach()
    rejected_B = policy_rejected_logp_B - ref_rejected_logp_B.detach()
    return chosen_B - rejected_B, chosen_B, rejected_B


def _output(
    loss: torch.Tensor, chosen_B: torch.Tensor, rejected_B: torch.Tensor, beta: float
) -> PreferenceOutput:
    chosen_rewards_B = beta * chosen_B.detach()
    rejected_rewards_B = beta * rejected_B.detach()
    metrics = {
        "reward_accuracy": (chosen_rewards_B > rejected_rewards_B).float().mean(),
        "reward_margin": (chosen_rewards_B - rejected_rewards_B).mean(),
        "chosen_reward": chosen_rewards_B.mean(),
        "rejected_reward": rejected_rewards_B.mean(),
    }
    return PreferenceOutput(loss, chosen_rewards_B, rejected_rewards_B, metrics)


def dpo_loss(
    policy_chosen_logp_B: torch.Tensor,
    policy_rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> PreferenceOutput:
    """DPO sigmoid loss (Rafailov et al. 2023), with conservative DPO's label smoothing (Mitchell 2023).

    With ``h = (logp_c - ref_c) - (logp_r - ref_r)`` and ``eps = label_smoothing``::

        L = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

    ``eps`` is the assumed probability that a preference label is flipped (cDPO); ``eps = 0`` is plain DPO.
    """
    if beta <= 0 or not 0 <= label_smoothing < 0.5:
        raise ConfigError(
            f"DPO needs beta > 0 and 0 <= label_smoothing < 0.5; got beta={beta}, {label_smoothing}"
        )
    h_B, chosen_B, rejected_B = _log_ratio_gap(
        policy_chosen_logp_B, policy_rejected_logp_B, ref_chosen_logp_B, ref_rejected_logp_B
    )
    logits_B = beta * h_B
    losses_B = -(1 - label_smoothing) * F.logsigmoid(logits_B) - label_smoothing * F.logsigmoid(-logits_B)
    return _output(losses_B.mean(), chosen_B, rejected_B, beta)


def ipo_loss(
    policy_chosen_logp_B: torch.Tensor,
    policy_rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
    *,
    beta: float = 0.1,
) -> PreferenceOutput:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences").

    ``L = (h - 1 / (2 * beta))^2`` with ``h`` as in :func:`dpo_loss` and ``beta`` the paper's ``tau``: a squared
    loss that regresses the log-ratio gap to a finite target instead of pushing it to infinity. The paper's
    reference implementations use per-token *average* log-probs; pass ``sequence_logp(..., average=True)``
    for that. Implicit rewards are reported as ``beta * (logp - ref_logp)``.
    """
    if beta <= 0:
        raise ConfigError(f"IPO needs beta > 0, got {beta}")
    h_B, chosen_B, rejected_B = _log_ratio_gap(
        policy_chosen_logp_B, policy_rejected_logp_B, ref_chosen_logp_B, ref_rejected_logp_B
    )
    losses_B = (h_B - 1 / (2 * beta)) ** 2
    return _output(losses_B.mean(), chosen_B, rejected_B, beta)


def bradley_terry_loss(
    chosen_rewards_B: torch.Tensor, rejected_rewards_B: torch.Tensor, *, margin_B: torch.Tensor | None = None
) -> tuple[torch.Tensor, Metrics]:
    """Reward-model loss under the Bradley-Terry model: ``-log sigmoid(r_c - r_r - m)``, mean over pairs.

    ``margin_B`` (Llama 2's margin, Touvron et al. 2023) asks for a larger gap on pairs rated far apart.
    Metrics: ``accuracy`` (fraction with ``r_c > r_r``) and ``margin`` (mean ``r_c - r_r``).
    """
    gap_B = chosen_rewards_B - rejected_rewards_B
    target_B = gap_B if margin_B is None else gap_B - margin_B
    loss = -F.logsigmoid(target_B).mean()
    metrics = {"accuracy": (gap_B.detach() > 0).float().mean(), "margin": gap_B.detach().mean()}
    return loss, metrics


def sft_cross_entropy(
    logits_BTV: torch.Tensor,
    labels_BT: torch.Tensor,
    *,
    ignore_index: int = -100,
    agg: Aggregation = TOKEN_MEAN,
) -> torch.Tensor:
    """Token cross-entropy ``-log softmax(logits)[label]`` over positions whose label is not ``ignore_index``.

    ``labels_BT[b, t]`` is the target of ``logits_BTV[b, t]`` (already shifted: the label of position ``t`` is
    token ``t + 1`` of the input). Reduced by ``agg`` (token-mean by default; pass ``num_global_tokens`` for
    micro-batches).
    """
    mask_BT = labels_BT != ignore_index
    safe_labels_BT = labels_BT.masked_fill(~mask_BT, 0)
    logp_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    nll_BT = -logp_BTV.gather(-1, safe_labels_BT.unsqueeze(-1)).squeeze(-1)
    return agg(nll_BT, mask_BT)
