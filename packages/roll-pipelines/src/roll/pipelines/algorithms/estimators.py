"""``estimate_advantages``: every advantage estimator of :data:`~.registry.ESTIMATORS`, on rows grouped by id.

One function serves rlvr, agentic and on-policy distillation. Rows carry a group id (``group_id_B``: the samples
of one prompt, the envs of one seed); RLVR's prompt-major ``[P, G]`` layout is just the ids
``arange(P).repeat_interleave(G)``, and a group one member short (an env that timed out) needs nothing special.
Statistics are those of :mod:`.advantages` (Bessel-corrected group std, ``eps = 1e-6``), so the ``[P, G]``
functions there and the id-based ones here give the same numbers.

Inputs (:class:`AdvantageInputs`): outcome rewards ``rewards_B`` (already normalized, :func:`~.advantages.normalize_rewards`),
the loss mask ``mask_BT``, and as the estimator needs them ``group_ids_B``, critic ``values_BT`` (GAE), dense
``token_rewards_BT`` added to the outcome, the per-token ``kl_BT`` to the reference (KL in the reward: ``kl_coef *
kl_BT`` comes off the token rewards, or its row sum off the outcome reward of an outcome estimator), and GiGPO's
``step_returns_B`` and ``anchor_ids_B``. Returns the masked ``advantages_BT`` (clipped when ``clip`` is set) and,
for GAE and REINFORCE++, ``returns_BT``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll.core.errors import DataError
from roll.pipelines.algorithms import advantages as adv
from roll.pipelines.algorithms.advantages import normalize_rewards
from roll.pipelines.algorithms.registry import ESTIMATORS

__all__ = [
    "AdvantageInputs",
    "Advantages",
    "EstimatorParams",
    "estimate_advantages",
    "layout_group_ids",
    "normalize_rewards",
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
        advantages_BT = adv.clip_advantages(advantages_BT, max_abs=params.clip)
    return Advantages(advantages_BT * mask_BT, out.returns_BT)


# ------------------------------------------------------------------------------------------------ inputs


def layout_group_ids(num_prompts: int, group_size: int) -> torch.Tensor:
    """The group ids of a prompt-major ``[P, G]`` layout (row ``p * G + g`` is in group ``p``)."""
    return torch.arange(num_prompts).repeat_interleave(group_size)


# ------------------------------------------------------------------------------------------- estimators


def _token_rewards(inputs: AdvantageInputs, params: EstimatorParams) -> torch.Tensor:
    """Outcome reward on each row's last trained token, plus dense rewards, minus ``kl_coef * kl_BT``."""
    rewards_BT = adv.outcome_to_token_rewards(inputs.rewards_B.float(), inputs.mask_BT)
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


@ESTIMATORS.bind("gae")
def _gae(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    assert inputs.values_BT is not None
    advantages_BT, returns_BT = adv.gae_advantages(
        _token_rewards(inputs, params), inputs.values_BT, inputs.mask_BT, gamma=params.gamma, lam=params.lam
    )
    if params.whiten:
        advantages_BT = adv.masked_whiten(advantages_BT, inputs.mask_BT)
    return Advantages(advantages_BT, returns_BT)


@ESTIMATORS.bind("reinforce_pp")
def _reinforce_pp(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    advantages_BT, returns_BT = adv.reinforce_pp_advantages(
        _token_rewards(inputs, params), inputs.mask_BT, gamma=params.gamma
    )
    return Advantages(advantages_BT, returns_BT)


@ESTIMATORS.bind("grpo")
def _grpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    adv_B = adv.group_normalize(_outcome(inputs, params), _groups(inputs))
    return Advantages(adv.expand_to_tokens(adv_B, inputs.mask_BT))


@ESTIMATORS.bind("dr_grpo")
def _dr_grpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    adv_B = adv.group_normalize(_outcome(inputs, params), _groups(inputs), norm_by_std=False)
    return Advantages(adv.expand_to_tokens(adv_B, inputs.mask_BT))


@ESTIMATORS.bind("rloo")
def _rloo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    """``r_i - (sum_g - r_i) / (n - 1)`` written as ``n / (n - 1) * (r_i - mean_g)``; a group of one gets 0."""
    rewards_B, groups_B = _outcome(inputs, params), _groups(inputs)
    index_B, n = adv.group_index(groups_B)
    size_B = torch.zeros(n, dtype=rewards_B.dtype).index_add_(0, index_B, torch.ones_like(rewards_B))[index_B]
    centered_B = adv.group_normalize(rewards_B, groups_B, norm_by_std=False)
    return Advantages(adv.expand_to_tokens(centered_B * size_B / (size_B - 1).clamp(min=1), inputs.mask_BT))


@ESTIMATORS.bind("reinforce_pp_baseline")
def _reinforce_pp_baseline(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    rewards_B = _outcome(inputs, params)
    centered_B = rewards_B - adv.group_mean_std(rewards_B, _groups(inputs))[0]
    return Advantages(adv.masked_whiten(adv.expand_to_tokens(centered_B, inputs.mask_BT), inputs.mask_BT))


@ESTIMATORS.bind("gigpo")
def _gigpo(inputs: AdvantageInputs, params: EstimatorParams) -> Advantages:
    if inputs.step_returns_B is None or inputs.anchor_ids_B is None:
        raise DataError(
            "GiGPO needs step-level rows: step_returns_B and anchor_ids_B (env_manager.mode: step)"
        )
    adv_B = adv.gigpo_advantages(
        _outcome(inputs, params), _groups(inputs), inputs.step_returns_B.float(), inputs.anchor_ids_B,
        step_weight=params.step_weight, norm_by_std=params.norm_by_std,
    )  # fmt: skip
    return Advantages(adv.expand_to_tokens(adv_B, inputs.mask_BT))


ESTIMATORS.check_bound()
