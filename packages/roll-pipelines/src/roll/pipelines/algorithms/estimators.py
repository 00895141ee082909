"""Every advantage estimator of :data:`~.registry.ESTIMATORS`, each in one function with its formula and paper.

This is the code every RL mode runs (rlvr, agentic and on-policy distillation, through
:func:`estimate_advantages`) and the code the golden tests check (``tests/pipelines/test_algorithms_estimators.py``).
The tensor helpers the estimators share (whitening, group statistics, discounted returns, reward normalization
and clipping) are in :mod:`.stats`.

Rows carry a group id (``group_ids_B``: the samples of one prompt, the envs of one seed); RLVR's prompt-major
``[P, G]`` layout is just the ids :func:`layout_group_ids` ``(P, G)`` = ``arange(P).repeat_interleave(G)``, and a
group one member short (an env that timed out) needs nothing special. Group statistics are Bessel-corrected
(divide by ``n - 1``) with ``eps = 1e-6``; a group of one, or a group whose rewards are all equal, gets advantage
0 (no comparison, no signal). Outcome estimators return one value per row, broadcast over its trained tokens.

The estimators, each a function below with its docstring (``r`` outcome rewards, ``g`` the row's group of
``n_g`` rows, ``V`` critic values):

- ``gae`` (Schulman et al. 2016): ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``;
- ``grpo`` (Shao et al. 2024): ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``;
- ``dr_grpo`` (Liu et al. 2025): ``A_i = r_i - mean_g(r)``;
- ``rloo`` (Ahmadian et al. 2024): ``A_i = r_i - (sum_g(r) - r_i) / (n_g - 1)``;
- ``reinforce_pp`` (Hu 2025): returns ``R_t = r_t + gamma R_{t+1}``, whitened over the batch's trained tokens;
- ``reinforce_pp_baseline`` (Hu 2025): ``r_i - mean_g(r)`` on every token, whitened over the batch's tokens;
- ``gigpo`` (Feng et al. 2025): ``A^E + step_weight * A^S``, episode-group plus anchor-state-group advantages.

Inputs (:class:`AdvantageInputs`): outcome rewards ``rewards_B`` (already normalized,
:func:`~.stats.normalize_rewards`), the loss mask ``mask_BT``, and as the estimator needs them ``group_ids_B``,
critic ``values_BT`` (GAE), dense ``token_rewards_BT`` added to the outcome, the per-token ``kl_BT`` to the
reference (KL in the reward: ``kl_coef * kl_BT`` comes off the token rewards, or its row sum off the outcome reward
of an outcome estimator), and GiGPO's ``step_returns_B`` and ``anchor_ids_B``. Returns the masked
``advantages_BT`` (clipped when ``clip`` is set) and, for GAE and REINFORCE++, ``returns_BT``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll.core.errors import DataError
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.algorithms.stats import (
    clip_advantages,
    discounted_returns,
    expand_to_tokens,
    group_index,
    group_mean_std,
    group_normalize,
    masked_whiten,
    outcome_to_token_rewards,
)

__all__ = [
    "AdvantageInputs",
    "Advantages",
    "EstimatorParams",
    "estimate_advantages",
    "layout_group_ids",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """The tensors an estimator may read (see the module docstring); ``None`` where the pipeline has none."""

    rewards_B: torch.Tensor
    mask_BT: torch.Tensor
    group_ids_B: torch.Tensor | None = None
    values_BT: torch.Tensor | None = None
    token_rewards_BT: torch.Tensor | None = None
    kl_BT: torch.Tensor | None = None
    step_returns_B: torch.Tensor | None = None
    anchor_ids_B: torch.Tensor | None = None


@dataclass(frozen=True)
class EstimatorParams:
    """Hyperparameters: ``gamma`` (GAE, REINFORCE++), ``lam`` (GAE), ``whiten`` (GAE advantages over the batch),
    ``kl_coef`` (KL in the reward), ``clip`` (advantages into ``[-clip, clip]``), GiGPO's ``step_weight`` and
    ``norm_by_std``."""

    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = False
    kl_coef: float = 0.0
    clip: float | None = None
    step_weight: float = 1.0
    norm_by_std: bool = True

    @classmethod
    def of(cls, algo: Any, **overrides: Any) -> EstimatorParams:
        """From an :class:`~.presets.AlgorithmConfig` (``gamma``, ``lam``, ``whiten_advantages``,
        ``advantage_clip``), with ``overrides`` (``kl_coef``: the controller's current value; GiGPO's)."""
        base = {
            "gamma": algo.gamma,
            "lam": algo.lam,
            "whiten": algo.whiten_advantages,
            "clip": algo.advantage_clip,
        }
        return cls(**{**base, **overrides})


@dataclass(frozen=True)
class Advantages:
    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor | None = None


def estimate_advantages(name: str, inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """The advantages of estimator ``name`` (a :data:`~.registry.ESTIMATORS` entry), 0 outside ``mask_BT``."""
    entry = ESTIMATORS.entry(name)
    if "critic" in entry.needs and inputs.values_BT is None:
        raise DataError(f"advantage estimator {name!r} needs critic values (values_BT); the batch has none")
    if "groups" in entry.needs and inputs.group_ids_B is None:
        raise DataError(f"advantage estimator {name!r} compares rows of a group; pass group_ids_B")
    out: Advantages = ESTIMATORS.implementation(name)(inputs, params)
    mask_BT = inputs.mask_BT.to(out.advantages_BT.dtype)
    advantages_BT = out.advantages_BT
    if params.clip is not None:
        advantages_BT = clip_advantages(advantages_BT, max_abs=params.clip)
    return Advantages(advantages_BT * mask_BT, out.returns_BT)


# ------------------------------------------------------------------------------------------------ inputs


def layout_group_ids(num_prompts: int, group_size: int) -> torch.Tensor:
    """The group ids of a prompt-major ``[P, G]`` layout (row ``p * G + g`` is in group ``p``)."""
    return torch.arange(num_prompts).repeat_interleave(group_size)


# ------------------------------------------------------------------------------------------------ rewards


def _token_rewards(inputs: AdvantageInputs, params: EstimatorParams) -> torch.Tensor:
    """Outcome reward on each row's last trained token, plus dense rewards, minus ``kl_coef * kl_BT``."""
    rewards_BT = outcome_to_token_rewards(inputs.rewards_B.float(), inputs.mask_BT)
    if inputs.token_rewards_BT is not None:
        rewards_BT = rewards_BT + inputs.token_rewards_BT.float() * inputs.mask_BT
    if inputs.kl_BT is not None and params.kl_coef:
        rewards_BT = rewards_BT - params.kl_coef * inputs.kl_BT.float() * inputs.mask_BT
    return rewards_BT


def _outcome(inputs: AdvantageInputs, params: EstimatorParams) -> torch.Tensor:
    """One reward per row: the outcome, plus the row's dense rewards, minus ``kl_coef`` times its summed KL.

    A row with an empty mask (an overlong-filtered sample) keeps its outcome: it still counts in its group."""
    rewards_B, mask_BT = inputs.rewards_B.float(), inputs.mask_BT.float()
    if inputs.token_rewards_BT is not None:
        rewards_B = rewards_B + (inputs.token_rewards_BT.float() * mask_BT).sum(-1)
    if inputs.kl_BT is not None and params.kl_coef:
        rewards_B = rewards_B - params.kl_coef * (inputs.kl_BT.float() * mask_BT).sum(-1)
    return rewards_B


def _groups(inputs: AdvantageInputs) -> torch.Tensor:
    assert inputs.group_ids_B is not None  # estimate_advantages checked the entry's needs
    return inputs.group_ids_B


# ------------------------------------------------------------------------------------------- estimators


@ESTIMATORS.bind("gae")
def _gae(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """Generalized advantage estimation (Schulman et al. 2016) on the critic's values, over token rewards::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                       (the critic's target)

    where ``t + 1`` is the next *trained* token: masked positions (padding, or environment tokens in multi-turn
    rollouts) are skipped, carrying the next value and advantage through; after the last trained token ``V = 0``.
    ``whiten`` whitens the advantages over the batch's trained tokens (not the returns).
    """
    assert inputs.values_BT is not None  # estimate_advantages checked the entry's needs
    rewards_BT, mask_BT = _token_rewards(inputs, params), inputs.mask_BT
    mask = mask_BT.to(inputs.values_BT.dtype)
    values_BT = inputs.values_BT.detach()
    advantages_BT = torch.zeros_like(values_BT)
    next_value_B = values_BT.new_zeros(values_BT.shape[0])
    next_adv_B = values_BT.new_zeros(values_BT.shape[0])
    for t in reversed(range(values_BT.shape[-1])):
        delta_B = rewards_BT[:, t] + params.gamma * next_value_B - values_BT[:, t]
        adv_B = delta_B + params.gamma * params.lam * next_adv_B
        m_B = mask[:, t]
        next_adv_B = m_B * adv_B + (1 - m_B) * next_adv_B
        next_value_B = m_B * values_BT[:, t] + (1 - m_B) * next_value_B
        advantages_BT[:, t] = next_adv_B
    advantages_BT = advantages_BT * mask
    returns_BT = (advantages_BT + values_BT) * mask
    if params.whiten:
        advantages_BT = masked_whiten(advantages_BT, mask_BT)
    return Advantages(advantages_BT, returns_BT)


@ESTIMATORS.bind("reinforce_pp")
def _reinforce_pp(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """REINFORCE++ (Hu 2025): discounted token returns, whitened over every trained token of the batch::

        R_t = r_t + gamma * R_{t+1}        A_t = (R_t - mean(R)) / sqrt(var(R) + 1e-8)

    The token rewards ``r_t`` are the outcome reward on the last trained token, plus any dense rewards, minus
    ``kl_coef`` times the per-token KL (REINFORCE++ puts the KL in the reward). Returns ``R`` as ``returns_BT``.
    """
    returns_BT = discounted_returns(_token_rewards(inputs, params), inputs.mask_BT, gamma=params.gamma)
    return Advantages(masked_whiten(returns_BT, inputs.mask_BT), returns_BT)


@ESTIMATORS.bind("grpo")
def _grpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean_g(r)) / (std_g(r) + 1e-6)`` within each group,
    Bessel-corrected std, the same value on every trained token of the row."""
    adv_B = group_normalize(_outcome(inputs, params), _groups(inputs))
    return Advantages(expand_to_tokens(adv_B, inputs.mask_BT))


@ESTIMATORS.bind("dr_grpo")
def _dr_grpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``A_i = r_i - mean_g(r)``, no std
    division; its length fix is the loss aggregation ``seq-mean-token-sum-norm`` (:mod:`.aggregate`)."""
    adv_B = group_normalize(_outcome(inputs, params), _groups(inputs), norm_by_std=False)
    return Advantages(expand_to_tokens(adv_B, inputs.mask_BT))


@ESTIMATORS.bind("rloo")
def _rloo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): ``A_i = r_i - (sum_g(r) - r_i) / (n_g - 1)``, the reward
    minus the mean of the other rewards of its group, computed as ``n_g / (n_g - 1) * (r_i - mean_g(r))``.

    A group of one has no other reward and gets 0 (configs reject a group size below 2,
    :meth:`~.presets.AlgorithmConfig.check`; an agentic group can shrink to one when its other envs failed).
    """
    rewards_B, groups_B = _outcome(inputs, params), _groups(inputs)
    index_B, n = group_index(groups_B)
    size_B = torch.zeros(n, dtype=rewards_B.dtype).index_add_(0, index_B, torch.ones_like(rewards_B))[index_B]
    centered_B = group_normalize(rewards_B, groups_B, norm_by_std=False)
    return Advantages(expand_to_tokens(centered_B * size_B / (size_B - 1).clamp(min=1), inputs.mask_BT))


@ESTIMATORS.bind("reinforce_pp_baseline")
def _reinforce_pp_baseline(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """REINFORCE++-baseline (Hu 2025): ``r_i - mean_g(r)`` on every trained token of the row, then whitened over
    every trained token of the batch (Bessel-corrected, ``eps = 1e-8``)."""
    rewards_B = _outcome(inputs, params)
    centered_B = rewards_B - group_mean_std(rewards_B, _groups(inputs))[0]
    return Advantages(masked_whiten(expand_to_tokens(centered_B, inputs.mask_BT), inputs.mask_BT))


@ESTIMATORS.bind("gigpo")
def _gigpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization"), per step row::

        A = A^E + step_weight * A^S

    ``A^E`` normalizes the row's episode outcome within its episode group (``group_ids_B``: the rollouts of one
    task); ``A^S`` normalizes the step's discounted return (``step_returns_B``) within its anchor-state group
    (``anchor_ids_B``: steps, across those rollouts, taken from the same environment state; the env manager hashes
    the states). Both as GRPO, ``(s - mean) / (std + 1e-6)``, or ``s - mean`` when not ``norm_by_std``.
    """
    if inputs.step_returns_B is None or inputs.anchor_ids_B is None:
        raise DataError(
            "GiGPO needs step-level rows: step_returns_B and anchor_ids_B (env_manager.mode: step)"
        )
    norm = params.norm_by_std
    episode_B = group_normalize(_outcome(inputs, params), _groups(inputs), norm_by_std=norm)
    step_B = group_normalize(inputs.step_returns_B.float(), inputs.anchor_ids_B, norm_by_std=norm)
    return Advantages(expand_to_tokens(episode_B + params.step_weight * step_B, inputs.mask_BT))


ESTIMATORS.check_bound()
