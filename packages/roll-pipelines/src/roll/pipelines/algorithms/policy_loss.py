"""Policy-gradient losses: PPO (clip-higher, dual-clip), GSPO, CISPO, TOPR, SAPO, GMPO, and the entropy bonus.

Every loss takes ``logp_BT`` (current policy, with grad), ``old_logp_BT`` (the policy that the advantages were
computed for, recomputed by the trainer), ``advantages_BT`` and ``mask_BT``; hyperparameters are keywords;
``agg`` reduces the per-token loss (:mod:`.aggregate`); ``is_weight_BT`` (optional, detached) multiplies the
per-token loss before aggregation, for the train/infer mismatch corrections of :mod:`.mismatch` (TIS, MIS, IcePop).
Each returns ``(loss, metrics)``; metrics are detached scalar tensors averaged over the local masked tokens:
``clip_frac``, ``approx_kl`` (``k3`` estimate of ``KL(pi_old || pi)``), ``ratio_mean``, ``ratio_max``.

Log-ratios are clamped to ``[-20, 20]`` before ``exp`` so a far-off token cannot overflow.
"""

from __future__ import annotations

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_max, masked_mean, masked_sum
from roll.pipelines.algorithms.choices import RatioLevel

Metrics = dict[str, torch.Tensor]
_MAX_LOG_RATIO = 20.0


def _log_ratio(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor) -> torch.Tensor:
    return (logp_BT - old_logp_BT.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _ratio_metrics(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> Metrics:
    log_ratio = log_ratio_BT.detach()
    ratio = log_ratio.exp()
    return {
        "approx_kl": masked_mean(ratio - 1 - log_ratio, mask_BT),
        "ratio_mean": masked_mean(ratio, mask_BT),
        "ratio_max": masked_max(ratio, mask_BT),
    }


def _weighted(loss_BT: torch.Tensor, is_weight_BT: torch.Tensor | None) -> torch.Tensor:
    return loss_BT if is_weight_BT is None else loss_BT * is_weight_BT.detach()


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not (0 <= clip_low <= 1) or clip_high < 0:
        raise ConfigError(
            f"clip ranges need 0 <= clip_low <= 1 and clip_high >= 0; got {clip_low}, {clip_high}"
        )


def ppo_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017), with decoupled bounds and optional dual-clip.

    Per token, ``rho = exp(logp - old_logp)``::

        L = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))

    ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al. 2025). Dual-clip (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games") bounds the loss of negative-advantage tokens by ``-A * c`` (``c > 1``),
    so a huge ratio on a bad token cannot blow up: for ``A < 0``, ``L = min(L, -A * c)``.
    Outside the trust region the active term is constant in ``logp``, so those tokens get zero gradient.
    """
    _check_clip(clip_low, clip_high)
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    ratio = log_ratio.exp()
    unclipped = -advantages_BT * ratio
    clipped = -advantages_BT * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(unclipped, clipped)
    metrics = {
        "clip_frac": masked_mean((clipped > unclipped).float(), mask_BT),
        **_ratio_metrics(log_ratio, mask_BT),
    }
    if dual_clip_c is not None:
        if dual_clip_c <= 1:
            raise ConfigError(
                f"dual_clip_c must be > 1 (a bound on the ratio for negative advantages), got {dual_clip_c}"
            )
        bound = -advantages_BT * dual_clip_c
        dual_active = (advantages_BT < 0) & (loss_BT > bound)
        loss_BT = torch.where(advantages_BT < 0, torch.minimum(loss_BT, bound), loss_BT)
        metrics["dual_clip_frac"] = masked_mean(dual_active.float(), mask_BT)
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def sequence_log_ratio(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean token log-ratio of each sequence, shape ``[B]``: GSPO's length-normalized ``log s_i``."""
    return masked_mean(log_ratio_BT, mask_BT, dim=-1)


def gspo_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), in its GSPO-token form.

    The importance ratio is per sequence: ``s_i = exp(mean_t (logp - old_logp))`` over the trained tokens, and
    is clipped at sequence level with the (tiny) ranges of the paper. The GSPO-token form gives every token
    ``s_i,t = sg[s_i] * exp(logp_t - sg[logp_t])``, equal to ``s_i`` in value, so its loss
    ``max(-A_t s_i,t, -A_t clip(s_i,t, 1 - clip_low, 1 + clip_high))`` equals GSPO's when the advantage is
    constant over a sequence; aggregate with ``seq-mean-token-mean`` for the paper's objective.
    ``clip_frac`` is the fraction of *sequences* that are clipped.
    """
    _check_clip(clip_low, clip_high)
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    seq_log_ratio_B = sequence_log_ratio(log_ratio, mask_BT)
    token_log_ratio = seq_log_ratio_B.detach().unsqueeze(-1) + logp_BT - logp_BT.detach()
    ratio = token_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    unclipped = -advantages_BT * ratio
    clipped = -advantages_BT * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(unclipped, clipped)
    seq_ratio_B = seq_log_ratio_B.detach().exp()
    has_tokens_B = mask_BT.bool().any(dim=-1)
    out_of_range_B = (seq_ratio_B < 1 - clip_low) | (seq_ratio_B > 1 + clip_high)
    metrics = {
        **_ratio_metrics(log_ratio, mask_BT),
        "clip_frac": masked_mean(out_of_range_B.float(), has_tokens_B),
        "seq_ratio_mean": masked_mean(seq_ratio_B, has_tokens_B),
    }
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def cispo_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, 2025): clip the importance-sampling *weight*, not the update.

    ``L_t = -sg(clip(rho_t, 1 - clip_low, 1 + clip_high)) * A_t * logp_t``. Every token keeps a gradient
    (``-w A grad logp``); only its weight is bounded. ``clip_low = 1`` means no lower bound (the paper tunes
    only the upper one); the defaults are a starting point, not values from the paper.
    """
    _check_clip(clip_low, clip_high)
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    ratio = log_ratio.detach().exp()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss_BT = -weight * advantages_BT * logp_BT
    clipped = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    metrics = {"clip_frac": masked_mean(clipped.float(), mask_BT), **_ratio_metrics(log_ratio, mask_BT)}
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def topr_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    level: RatioLevel = "sequence",
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """TOPR, Tapered Off-Policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286).

    The gradient the paper gives is::

        sum_{A >= 0} mu(y) A grad log pi(y)  +  sum_{A < 0} mu(y) [pi(y) / mu(y)]_0^1 A grad log pi(y)

    Positive-advantage samples are trained as in SFT (weight 1, no importance ratio); negative ones carry the
    importance ratio truncated to ``[0, 1]``, so pushing down an already unlikely sample fades out. Here
    ``L_t = -w * A_t * logp_t`` with ``w = 1`` for ``A_t >= 0`` and ``w = sg(min(rho, 1))`` for ``A_t < 0``;
    ``rho`` is the sequence ratio ``exp(sum_t (logp - old_logp))`` (``level="sequence"``, the paper's
    trajectory ratio) or the token ratio (``level="token"``). ``clip_frac`` is the fraction of negative tokens
    whose ratio was truncated.
    """
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    if level == "sequence":
        seq_B = masked_sum(log_ratio.detach(), mask_BT, dim=-1).clamp(max=_MAX_LOG_RATIO)
        rho = seq_B.exp().unsqueeze(-1).expand_as(logp_BT)
    elif level == "token":
        rho = log_ratio.detach().exp()
    else:
        raise ConfigError(f"TOPR ratio level must be 'token' or 'sequence', got {level!r}")
    negative = advantages_BT < 0
    weight = torch.where(negative, rho.clamp(max=1.0), torch.ones_like(rho))
    loss_BT = -weight * advantages_BT * logp_BT
    metrics = {
        "clip_frac": masked_mean((negative & (rho > 1)).float(), mask_BT),
        **_ratio_metrics(log_ratio, mask_BT),
    }
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def sapo_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347): a smooth gate on the
    token ratio instead of PPO's hard clip.

    Per token, with ``tau = tau_pos`` for ``A_t > 0`` and ``tau_neg`` otherwise::

        f(rho) = sigmoid(tau * (rho - 1)) * 4 / tau,      L_t = -f(rho_t) * A_t

    ``d f / d log rho = 4 rho sigma (1 - sigma)`` is 1 on-policy (the plain policy gradient) and fades smoothly as
    ``rho`` leaves 1, instead of dropping to 0 at a clip boundary; ``tau_neg > tau_pos`` fades negative-advantage
    tokens faster (the paper: their updates spread mass over many tokens and destabilize more). The paper
    aggregates with ``seq-mean-token-mean``, the registry's default for ``sapo``. Metric ``gate_grad_mean``: the
    mean of that gradient weight (1 on-policy).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ConfigError(f"SAPO temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    ratio = log_ratio.exp()
    tau_BT = torch.where(advantages_BT > 0, tau_pos, tau_neg).to(ratio.dtype)
    sigma_BT = torch.sigmoid(tau_BT * (ratio - 1))
    loss_BT = -sigma_BT * (4 / tau_BT) * advantages_BT
    grad_weight_BT = (4 * ratio * sigma_BT * (1 - sigma_BT)).detach()
    metrics = {"gate_grad_mean": masked_mean(grad_weight_BT, mask_BT), **_ratio_metrics(log_ratio, mask_BT)}
    return agg(_weighted(loss_BT, is_weight_BT), mask_BT), metrics


def gmpo_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    is_weight_BT: torch.Tensor | None = None,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673): the sequence's ratio is the
    geometric mean of its clipped token ratios, so one outlier token moves it far less than an arithmetic mean.

    Clipping is per token and in log space (``clip_low``/``clip_high`` bound ``log rho``, the paper's
    ``(e^-0.4, e^0.4)``), on the side the advantage's sign makes pessimistic; with ``s = sign(A)``::

        l_t = s * min(s * log rho_t, s * clip(log rho_t, -clip_low, clip_high))
        L_i = -mean_t(A_t) * exp(mean_t l_t)

    The loss is one number per sequence. It is placed on every token of its row, so ``seq-mean-token-mean`` (the
    aggregation the registry requires for ``gmpo``) gives ``mean_i L_i``. ``is_weight_BT`` enters as its per-row
    geometric mean, as in verl. ``clip_frac``: tokens where the clipped term was the active one.
    """
    _check_clip(clip_low, clip_high)
    log_ratio = _log_ratio(logp_BT, old_logp_BT)
    sign_BT = advantages_BT.sign()
    clamped = log_ratio.clamp(-clip_low, clip_high)
    pessimistic_BT = sign_BT * torch.minimum(sign_BT * log_ratio, sign_BT * clamped)
    seq_ratio_B = masked_mean(pessimistic_BT, mask_BT, dim=-1).exp()
    loss_B = -masked_mean(advantages_BT, mask_BT, dim=-1) * seq_ratio_B
    if is_weight_BT is not None:
        log_w_BT = is_weight_BT.detach().clamp(min=1e-10).log()
        loss_B = loss_B * masked_mean(log_w_BT, mask_BT, dim=-1).exp()
    active = sign_BT * clamped < sign_BT * log_ratio
    metrics = {
        "clip_frac": masked_mean(active.float(), mask_BT),
        "seq_ratio_mean": masked_mean(seq_ratio_B.detach(), mask_BT.bool().any(dim=-1)),
        **_ratio_metrics(log_ratio, mask_BT),
    }
    return agg(loss_B.unsqueeze(-1).expand_as(logp_BT), mask_BT), metrics


def entropy_bonus(
    entropy_BT: torch.Tensor, mask_BT: torch.Tensor, *, coef: float, agg: Aggregation = TOKEN_MEAN
) -> tuple[torch.Tensor, Metrics]:
    """The entropy term to *add* to the loss: ``-coef * agg(entropy)`` (maximizes entropy for ``coef > 0``)."""
    return -coef * agg(entropy_BT, mask_BT), {"entropy": masked_mean(entropy_BT.detach(), mask_BT)}
