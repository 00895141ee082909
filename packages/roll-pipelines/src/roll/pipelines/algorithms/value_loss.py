"""The critic's loss: squared error to the returns, with PPO-style value clipping."""

from __future__ import annotations

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_mean


def clipped_value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_range: float | None = 0.2,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 baselines; Schulman et al. 2017).

    ``V_clip = V_old + clip(V - V_old, -eps, eps)`` and ``L_t = 0.5 * max((V - R)^2, (V_clip - R)^2)``: the new
    value may not move more than ``eps`` from the value used to compute the advantages, unless that lowers the
    error. ``clip_range=None`` gives the plain ``0.5 * (V - R)^2``. Returns the loss and metrics
    ``vf_clip_frac`` (tokens where the clipped error is the larger) and ``value_mean``.
    """
    returns = returns_BT.detach()
    unclipped_BT = (values_BT - returns) ** 2
    if clip_range is None:
        loss_BT, clipped_active = 0.5 * unclipped_BT, torch.zeros_like(unclipped_BT, dtype=torch.bool)
    else:
        if clip_range <= 0:
            raise ConfigError(f"value clip_range must be positive or None, got {clip_range}")
        old = old_values_BT.detach()
        values_clipped_BT = old + (values_BT - old).clamp(-clip_range, clip_range)
        clipped_BT = (values_clipped_BT - returns) ** 2
        loss_BT = 0.5 * torch.maximum(unclipped_BT, clipped_BT)
        clipped_active = clipped_BT > unclipped_BT
    metrics = {
        "vf_clip_frac": masked_mean(clipped_active.float(), mask_BT),
        "value_mean": masked_mean(values_BT.detach(), mask_BT),
    }
    return agg(loss_BT, mask_BT), metrics


def action_values(values_BT: torch.Tensor) -> torch.Tensor:
    """The critic's value of the state *before* each token: ``V_BT[:, t] = head_BT[:, t - 1]``, 0 at ``t = 0``.

    The value head at position ``t`` has read tokens ``0..t``, the token of step ``t`` included; the state in
    which the policy chose token ``t`` is tokens ``0..t-1``, so its value is the head's output one position to the
    left (as ``logp_BT[:, t]`` scores token ``t`` from the logits at ``t - 1``). A response never starts at
    ``t = 0`` (the prompt comes first), so the zero there is never trained on.
    """
    return torch.nn.functional.pad(values_BT[:, :-1], (1, 0))
