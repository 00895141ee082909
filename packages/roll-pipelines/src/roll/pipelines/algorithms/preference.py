"""Preference losses for the DPO and reward-model pipelines (DPO, cDPO, IPO, SimPO on pairs; KTO on unpaired
completions), and the SFT token cross-entropy.

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

from roll.core.columns import IGNORE_INDEX
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


def simpo_loss(
    policy_chosen_logp_B: torch.Tensor,
    policy_rejected_logp_B: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
) -> PreferenceOutput:
    """SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward").

    Reference-free: the implicit reward is ``beta`` times the *length-normalized* log-probability (pass
    ``sequence_logp(..., average=True)``), and a target margin ``gamma`` separates chosen from rejected::

        L = -(1 - eps) log sigmoid(beta (c - r) - gamma) - eps log sigmoid(-(beta (c - r) - gamma))

    ``eps = label_smoothing`` as in cDPO (TRL's CPOTrainer applies it to SimPO too). Defaults follow the paper's
    ranges (``beta`` 2 to 2.5, ``gamma / beta`` about 0.5). Implicit rewards are ``beta * c`` and ``beta * r``.
    """
    if beta <= 0 or not 0 <= label_smoothing < 0.5:
        raise ConfigError(
            f"SimPO needs beta > 0 and 0 <= label_smoothing < 0.5; got beta={beta}, {label_smoothing}"
        )
    logits_B = beta * (policy_chosen_logp_B - policy_rejected_logp_B) - gamma
    losses_B = -(1 - label_smoothing) * F.logsigmoid(logits_B) - label_smoothing * F.logsigmoid(-logits_B)
    return _output(losses_B.mean(), policy_chosen_logp_B, policy_rejected_logp_B, beta)


def kto_reference_point(kl_policy_logp_B: torch.Tensor, kl_ref_logp_B: torch.Tensor) -> torch.Tensor:
    """KTO's reference point ``z0``: ``max(0, mean(logp - ref_logp))`` over *mismatched* pairs ``(x_i, y_j)``, a
    batch estimate of ``KL(pi || pi_ref)``; detached (the paper and TRL do not backpropagate through it)."""
    return (kl_policy_logp_B - kl_ref_logp_B).detach().mean().clamp(min=0)


def kto_loss(
    policy_logp_B: torch.Tensor,
    ref_logp_B: torch.Tensor,
    desirable_B: torch.Tensor,
    *,
    kl: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> PreferenceOutput:
    """KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization"), on *unpaired*
    completions, each labelled desirable or not.

    With ``h = logp - ref_logp`` of a completion and the reference point ``z0 = kl``
    (:func:`kto_reference_point`)::

        desirable:    L = w_d * (1 - sigmoid(beta * (h - z0)))
        undesirable:  L = w_u * (1 - sigmoid(beta * (z0 - h)))

    averaged over all completions (TRL's convention; the paper's value function ``lambda_D``/``lambda_U`` are
    ``desirable_weight``/``undesirable_weight``; balance them as ``w_d n_D / (w_u n_U)`` in ``[1, 4/3]``).
    Returns a :class:`PreferenceOutput` whose ``chosen_rewards_B`` are ``beta * h`` of the desirable completions
    and ``rejected_rewards_B`` of the undesirable ones; metrics ``kl``, ``chosen_reward``, ``rejected_reward``,
    ``reward_margin`` (their difference, 0 if one side is absent).
    """
    if beta <= 0 or desirable_weight <= 0 or undesirable_weight <= 0:
        raise ConfigError(
            f"KTO needs beta > 0 and positive weights; got beta={beta}, {desirable_weight}, {undesirable_weight}"
        )
    desirable_B = desirable_B.bool()
    h_B = policy_logp_B - ref_logp_B.detach()
    z0 = torch.as_tensor(kl, dtype=h_B.dtype, device=h_B.device).detach()
    chosen_loss_B = desirable_weight * (1 - torch.sigmoid(beta * (h_B - z0)))
    rejected_loss_B = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - h_B)))
    losses_B = torch.where(desirable_B, chosen_loss_B, rejected_loss_B)
    rewards_B = beta * h_B.detach()
    chosen_B, rejected_B = rewards_B[desirable_B], rewards_B[~desirable_B]
    zero = rewards_B.new_zeros(())
    chosen_mean = chosen_B.mean() if chosen_B.numel() else zero
    rejected_mean = rejected_B.mean() if rejected_B.numel() else zero
    metrics = {
        "kl": z0,
        "chosen_reward": chosen_mean,
        "rejected_reward": rejected_mean,
        "reward_margin": chosen_mean - rejected_mean if chosen_B.numel() and rejected_B.numel() else zero,
    }
    return PreferenceOutput(losses_B.mean(), chosen_B, rejected_B, metrics)


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
    ignore_index: int = IGNORE_INDEX,
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
