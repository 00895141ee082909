"""Losses and advantages of reward-feedback learning, as pure tensor functions.

- DRaFT (Clark et al. 2023): ``loss = -mean(r(x0))`` where ``x0`` is sampled with gradients kept through the
  last K denoising steps; ReFL (Xu et al. 2023) is K=1 at a random late step scoring the one-step ``x0_hat``;
  AlignProp (Prabhudesai et al. 2023) is K = all steps with gradient checkpointing.
- ``eps_regularizer``: between two Gaussian transitions of equal variance, ``KL = |mu - mu_base|^2 / (2 sigma^2)``,
  and ``mu - mu_base`` is proportional to ``eps - eps_base``; the mean squared noise-prediction difference is
  that KL up to a positive constant per step (and stays defined at eta 0, where sigma is 0).
- DDPO (Black et al. 2023): per-prompt normalized advantages and the PPO clipped surrogate on the per-step
  log-probability ratio of the stochastic sampler.
"""

from __future__ import annotations

import torch


def draft_loss(rewards_B: torch.Tensor) -> torch.Tensor:
    """``-mean(rewards)``: gradient ascent on the differentiable reward."""
    return -rewards_B.mean()


def eps_regularizer(eps: torch.Tensor, eps_base: torch.Tensor) -> torch.Tensor:
    """``mean((eps - eps_base)^2)``, the base model's prediction held fixed."""
    return (eps - eps_base.detach()).pow(2).mean()


def group_advantages_PG(rewards_PG: torch.Tensor, *, eps: float = 1e-4, clip: float = 5.0) -> torch.Tensor:
    """``(r - mean_g r) / (std_g r + eps)`` per prompt (the G samples of one prompt), clipped to ``±clip``."""
    mean_P1 = rewards_PG.mean(dim=1, keepdim=True)
    std_P1 = rewards_PG.std(dim=1, keepdim=True, unbiased=False)
    return ((rewards_PG - mean_P1) / (std_P1 + eps)).clamp(-clip, clip)


def ddpo_loss(
    logp_B: torch.Tensor, old_logp_B: torch.Tensor, advantages_B: torch.Tensor, *, clip_range: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate on one denoising step: ``mean(max(-A ratio, -A clip(ratio, 1 ± c)))``."""
    ratio_B = torch.exp(logp_B - old_logp_B)
    unclipped = -advantages_B * ratio_B
    clipped = -advantages_B * ratio_B.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    clipfrac = ((ratio_B - 1.0).abs() > clip_range).float().mean()
    return loss, {
        "clipfrac": float(clipfrac),
        "approx_kl": float(0.5 * (logp_B - old_logp_B).detach().pow(2).mean()),
    }
