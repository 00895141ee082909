"""On-policy distillation's advantage: the student's negative log-ratio to the teacher, as a pure function.

Agarwal et al. 2024 ("On-Policy Distillation of Language Models"); Lu & Thinking Machines 2025 ("On-Policy
Distillation")::

    r_t = -(log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t))
    D_t = sum_{k >= t} gamma^(k - t) r_k          (gamma = 0: D_t = r_t)
    A_t = distill_coef * baseline(D)_t + rl_coef * A_t^RL

The discounted sum is :func:`~roll.pipelines.algorithms.stats.discounted_returns` (masked positions neither
add nor count as a discount step).
"""

from __future__ import annotations

import torch

from roll.pipelines.algorithms.stats import discounted_returns

__all__ = ["BASELINES", "distill_advantages"]

BASELINES = ("none", "batch_mean", "whiten")


def distill_advantages(
    student_logp_BT: torch.Tensor,
    teacher_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    distill_coef: float = 1.0,
    rl_advantages_BT: torch.Tensor | None = None,
    rl_coef: float = 0.0,
    clip: float | None = None,
    gamma: float = 0.0,
    baseline: str = "none",
) -> torch.Tensor:
    """``distill_coef * D_t + rl_coef * A_rl`` per token, 0 where ``mask_BT`` is 0, where ``D_t`` is built from the
    negative log-ratio ``r_t = -(logp_s - logp_t)``:

    1. ``clip`` bounds ``r_t`` to ``[-clip, clip]``;
    2. ``gamma > 0`` sums the future ones, ``D_t = sum_{k >= t} gamma^(k-t) r_k`` (``gamma = 1``: the REINFORCE
       gradient of the reverse KL of whole sequences; ``gamma = 0``: the per-token reverse KL, ``D_t = r_t``);
    3. ``baseline`` ``batch_mean`` subtracts the mean of ``D`` over the batch's response tokens (a constant
       baseline: the expected gradient is unchanged, its variance lower); ``whiten`` also divides by their std.

    ``rl_advantages_BT`` is required when ``rl_coef > 0``.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    m_BT = mask_BT.float()
    neg_log_ratio_BT = -(student_logp_BT.float() - teacher_logp_BT.float())
    if clip is not None:
        neg_log_ratio_BT = neg_log_ratio_BT.clamp(-clip, clip)
    d_BT = discounted_returns(neg_log_ratio_BT, m_BT, gamma=gamma) if gamma else neg_log_ratio_BT * m_BT
    if baseline != "none":
        n = m_BT.sum().clamp(min=1)
        mean = (d_BT * m_BT).sum() / n
        d_BT = d_BT - mean
        if baseline == "whiten":
            std = ((d_BT * m_BT).pow(2).sum() / n).sqrt()
            d_BT = d_BT / (std + 1e-6)
    adv_BT = distill_coef * d_BT
    if rl_coef:
        if rl_advantages_BT is None:
            raise ValueError("rl_coef > 0 adds the RL advantage: pass rl_advantages_BT")
        adv_BT = adv_BT + rl_coef * rl_advantages_BT.float()
    return adv_BT * m_BT
