"""KL divergence to a reference policy: per-token estimators, where the penalty goes, and the coefficient.

Estimators of ``KL(pi || pi_ref)`` from tokens sampled from ``pi`` (Schulman 2020, "Approximating KL
Divergence"), with ``log_ratio = ref_logp - logp`` (``log r`` where ``r = pi_ref / pi``):

- ``k1 = -log r``: unbiased, high variance, can be negative;
- ``k2 = 0.5 (log r)^2``: biased, low variance, always >= 0. Its gradient ``(logp - ref_logp) grad logp`` is
  the exact score-function gradient of the KL on-policy;
- ``k3 = (r - 1) - log r``: unbiased, low variance, always >= 0;
- ``low_var_kl``: ``k3`` with ``log r`` clamped to ``[-20, 20]`` and the result to ``[-10, 10]`` (verl's name),
  safe against the exp overflow of far-off tokens;
- ``k1+`` / ``k3+``: the *value* of k1 / k3 with the *gradient* of k2 (straight-through), so a KL loss reports
  the usual estimate while its gradient is the correct one.

Where it goes: in the reward (``r_t - beta * kl_t``, detached; PPO, REINFORCE++: the objective's
:meth:`~roll.pipelines.policy.objective.PolicyObjective.sampled_kl_BT` measures ``kl_t`` with :func:`kl_estimate` and
:func:`~roll.pipelines.algorithms.estimators.estimate_advantages` takes it off the rewards) or in the loss
(:func:`kl_loss`: ``+ beta * agg(kl)``; GRPO). ``beta`` comes from a controller: fixed, or the
adaptive one of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences").
"""

from __future__ import annotations

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_mean
from roll.pipelines.algorithms.choices import KL_ESTIMATORS, KLEstimator
from roll.pipelines.algorithms.kl_control import AdaptiveKLController as AdaptiveKLController
from roll.pipelines.algorithms.kl_control import FixedKLController as FixedKLController
from roll.pipelines.algorithms.kl_control import KLController as KLController
from roll.pipelines.algorithms.kl_control import build_kl_controller as build_kl_controller


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return -log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.pow(2)


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.expm1(log_ratio) - log_ratio


def _low_var(log_ratio: torch.Tensor) -> torch.Tensor:
    return _k3(log_ratio.clamp(-20.0, 20.0)).clamp(-10.0, 10.0)


def kl_estimate(
    logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, *, estimator: KLEstimator = "low_var_kl"
) -> torch.Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` by ``estimator`` (see the module docstring), shape ``[B, T]``."""
    log_ratio = ref_logp_BT - logp_BT
    if estimator == "k1":
        return _k1(log_ratio)
    if estimator == "k2":
        return _k2(log_ratio)
    if estimator == "k3":
        return _k3(log_ratio)
    if estimator == "low_var_kl":
        return _low_var(log_ratio)
    if estimator in ("k1+", "k3+"):
        value = _k1(log_ratio) if estimator == "k1+" else _k3(log_ratio)
        grad_path = _k2(log_ratio)
        return grad_path + (value - grad_path).detach()
    raise ConfigError(f"unknown KL estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")


def kl_loss(
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    coef: float,
    estimator: KLEstimator = "low_var_kl",
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL in the loss: ``coef * agg(kl_BT)``. Returns the loss and ``{"kl": mean kl, "kl_coef": coef}``."""
    kl_BT = kl_estimate(logp_BT, ref_logp_BT.detach(), estimator=estimator)
    metrics = {
        "kl": masked_mean(kl_BT.detach(), mask_BT),
        "kl_coef": torch.tensor(float(coef)),
    }
    return coef * agg(kl_BT, mask_BT), metrics
