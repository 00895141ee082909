"""Entropy control by covariance: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models", arXiv:2505.22617).

The paper shows that policy entropy falls in proportion to the covariance between a token's log-probability and
its advantage: confident tokens with high advantage drive the collapse. Both losses score each trained token by

    cov_t = (A_t - mean(A)) * (logp_t - mean(logp))

(means over the trained tokens of the micro-batch, as verl computes it) and act on a small fraction of the
highest-covariance tokens only:

- :func:`clip_cov_policy_loss`: PPO's clipped loss, where ``max(1, int(ratio * N))`` tokens drawn at random among
  those with ``lb < cov < ub`` (and not already clipped by PPO) lose their loss and gradient;
- :func:`kl_cov_policy_loss`: the *unclipped* surrogate ``-A rho``, plus ``coef * |log rho|`` on the
  ``max(1, int(ratio * N))`` tokens of largest covariance.

The selection looks across rows, so these losses couple the rows of a micro-batch: which tokens are picked depends
on the micro-batch's composition (the registry marks them ``batch_coupled``: no row is left out as inert).
Clip-Cov's draw uses ``generator`` (default: torch's global RNG, which roll seeds per worker and checkpoints).
Signatures and metrics as in :mod:`.policy_loss`; ``cov_frac`` is the fraction of trained tokens acted on.
"""

from __future__ import annotations

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_mean
from roll.pipelines.algorithms.policy_loss import Metrics, _check_clip, _log_ratio, _ratio_metrics, _weighted


def token_covariance(
    logp_BT: torch.Tensor, advantages_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """``(A - mean A) * (logp - mean logp)`` per token, means over the masked tokens; detached, ``[B, T]``."""
    logp = logp_BT.detach()
    return (advantages_BT - masked_mean(advantages_BT, mask_BT)) * (logp - masked_mean(logp, mask_BT))


def _count(ratio: float, mask_BT: torch.Tensor) -> int:
    if not 0 < ratio <= 1:
        raise ConfigError(f"the covariance token ratio must be in (0, 1], got {ratio}")
    return max(int(ratio * float(mask_BT.sum())), 1)


def clip_cov_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO's clipped loss, with ``max(1, int(ratio * N))`` random tokens among those with
    ``cov_lb < cov_t < cov_ub`` (not PPO-clipped already) zeroed, value and gradient (verl's convention).
    Defaults are verl's (``ratio`` 2e-4, bounds 1 and 5)."""
    _check_clip(clip_low, clip_high)
    trained = mask_BT.bool()
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    rho = log_ratio.exp()
    unclipped = -advantages_BT * rho
    clipped = -advantages_BT * rho.clamp(1 - clip_low, 1 + clip_high)
    ppo_clipped = (clipped > unclipped) & trained
    cov_BT = token_covariance(logp_BT, advantages_BT, mask_BT)
    candidates = trained & ~ppo_clipped & (cov_BT > cov_lb) & (cov_BT < cov_ub)
    flat = candidates.flatten().nonzero().squeeze(-1)
    order = torch.randperm(flat.numel(), generator=generator, device="cpu").to(flat.device)
    keep = torch.ones(candidates.numel(), dtype=rho.dtype, device=rho.device)
    keep[flat[order[: _count(ratio, mask_BT)]]] = 0
    keep_BT = keep.view_as(rho)
    loss_BT = torch.maximum(unclipped, clipped) * keep_BT
    metrics = {
        "clip_frac": masked_mean(ppo_clipped.float(), mask_BT),
        "cov_frac": masked_mean(1 - keep_BT, mask_BT),
        **_ratio_metrics(log_ratio, mask_BT),
    }
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def kl_cov_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    ratio: float = 2e-4,
    coef: float = 0.1,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: ``L_t = -A_t rho_t`` (no clipping), plus ``coef * |log rho_t|`` on the ``max(1, int(ratio * N))``
    tokens of largest covariance. Defaults are verl's config (``ratio`` 2e-4, ``coef`` 0.1)."""
    if coef < 0:
        raise ConfigError(f"kl-cov coefficient must be >= 0, got {coef}")
    trained = mask_BT.bool()
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    loss_BT = -advantages_BT * log_ratio.exp()
    selected = torch.zeros(trained.numel(), dtype=loss_BT.dtype, device=loss_BT.device)
    valid = trained.flatten().nonzero().squeeze(-1)
    if valid.numel():
        cov = token_covariance(logp_BT, advantages_BT, mask_BT).flatten()[valid]
        top = torch.topk(cov, min(_count(ratio, mask_BT), valid.numel())).indices
        selected[valid[top]] = 1
    selected_BT = selected.view_as(loss_BT)
    loss_BT = loss_BT + coef * log_ratio.abs() * selected_BT
    metrics = {"cov_frac": masked_mean(selected_BT, mask_BT), **_ratio_metrics(log_ratio, mask_BT)}
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics
