"""The train/infer mismatch: what to measure every step, and the corrections of :data:`~.registry.
MISMATCH_CORRECTIONS` (TIS, MIS, the IcePop token mask).

The rollout engine samples from ``pi_infer`` (vLLM kernels, bf16, a KV cache, possibly stale weights); the
trainer recomputes ``pi_old`` for the same tokens. Both are per-token log-probs of the *sampled* token, under the
same temperature, before top-k/top-p truncation (see :mod:`roll.workers.hf_infer`). Per response token::

    delta_t = old_logp_t - infer_logp_t            rho_t = exp(delta_t) = pi_old(y_t) / pi_infer(y_t)

:func:`mismatch_metrics` reports, over the response tokens of a micro-batch (whatever the loss):

- ``mismatch/logp_abs_diff_mean`` and ``mismatch/logp_abs_diff_max``: mean and max of ``|delta_t|``;
- ``mismatch/kl_k3``: the k3 estimate ``mean(rho - 1 - log rho)`` of ``KL(pi_infer || pi_old)`` (tokens are
  sampled from ``pi_infer``, so ``E[rho] = 1`` and the estimate is unbiased, always >= 0; Schulman 2020);
- ``mismatch/ratio_p05``, ``mismatch/ratio_p50``, ``mismatch/ratio_p95``: quantiles of ``rho`` (linear
  interpolation between order statistics, as ``torch.quantile``).

A correction turns ``(old_logp, infer_logp, mask)`` into a detached per-token weight that multiplies the policy
loss (0 off the mask):

- ``tis`` (Yao et al. 2025): ``min(rho, high)``, per token or per sequence (``rho_seq = exp(sum_t delta_t)``);
- ``mis``, masked importance sampling: ``rho`` where ``low <= rho <= high``, else 0 (per token, or per sequence:
  a whole sequence outside the bounds is dropped); the weight is kept, not truncated, where it is accepted;
- ``icepop`` (Ling team 2025, IcePop): a two-sided token mask, 1 where ``low <= rho_t <= high``, else 0; no
  reweighting of the accepted tokens.

Dropped tokens stay in the loss's normalizer (the strategy counts units before the forward), so a step whose
correction drops a fraction ``f`` of the tokens has its loss scaled by about ``1 - f``; the direction of the
update is that of the accepted tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import masked_max, masked_mean, masked_sum
from roll.pipelines.algorithms.choices import RatioLevel
from roll.pipelines.algorithms.registry import MISMATCH_CORRECTIONS

Metrics = dict[str, torch.Tensor]
_MAX_LOG_RATIO = 20.0
QUANTILES = (("p05", 0.05), ("p50", 0.5), ("p95", 0.95))


def _delta(old_logp_BT: torch.Tensor, infer_logp_BT: torch.Tensor) -> torch.Tensor:
    return (old_logp_BT - infer_logp_BT).detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def quantiles(values_N: torch.Tensor, qs: tuple[float, ...]) -> list[torch.Tensor]:
    """Quantiles of a 1-D tensor by linear interpolation between order statistics (``torch.quantile``'s default),
    by sorting, so any size works (``torch.quantile`` refuses more than 2**24 elements)."""
    sorted_N = values_N.float().sort().values
    last = sorted_N.numel() - 1
    out = []
    for q in qs:
        pos = q * last
        lo = int(pos)
        hi = min(lo + 1, last)
        out.append(sorted_N[lo] + (sorted_N[hi] - sorted_N[lo]) * (pos - lo))
    return out


def mismatch_metrics(
    old_logp_BT: torch.Tensor, infer_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> Metrics:
    """The rollout-vs-trainer metrics of the module docstring over the masked tokens; ``{}`` when none is."""
    keep_BT = mask_BT.bool()
    if not bool(keep_BT.any()):
        return {}
    delta_BT = _delta(old_logp_BT, infer_logp_BT)
    rho_BT = delta_BT.exp()
    out = {
        "mismatch/logp_abs_diff_mean": masked_mean(delta_BT.abs(), keep_BT),
        "mismatch/logp_abs_diff_max": masked_max(delta_BT.abs(), keep_BT),
        "mismatch/kl_k3": masked_mean(rho_BT - 1 - delta_BT, keep_BT),
    }
    values = quantiles(rho_BT[keep_BT], tuple(q for _, q in QUANTILES))
    out.update({f"mismatch/ratio_{name}": v for (name, _), v in zip(QUANTILES, values)})
    return out


def _ratio(delta_BT: torch.Tensor, mask_BT: torch.Tensor, level: str) -> torch.Tensor:
    """``rho`` per token, or the sequence ratio ``exp(sum_t delta_t)`` broadcast over the row's tokens."""
    if level == "token":
        return delta_BT.exp()
    if level == "sequence":
        seq_B = masked_sum(delta_BT, mask_BT, dim=-1).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return seq_B.exp().unsqueeze(-1).expand_as(delta_BT)
    raise ConfigError(f"mismatch correction level must be 'token' or 'sequence', got {level!r}")


def _check_bounds(low: float, high: float) -> None:
    if not 0 < low <= 1 <= high:
        raise ConfigError(f"mismatch bounds need 0 < low <= 1 <= high, got low={low}, high={high}")


def truncated_is_weight(
    old_logp_BT: torch.Tensor,
    infer_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    cap: float = 2.0,
    level: RatioLevel = "token",
) -> tuple[torch.Tensor, Metrics]:
    """Truncated importance sampling for the train/infer mismatch (Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training").

    The rollout engine (vLLM) samples from ``pi_infer``, which differs numerically from the trainer's
    ``pi_old``. The correction weight is ``min(rho, cap)`` per token, or per sequence with the summed log-ratio
    (``level="sequence"``). Detached; pass it as ``is_weight_BT`` to a policy loss.
    Returns ``(weight_BT, {"tis_mean", "tis_clip_frac"})``; the weight is 0 on masked positions.
    """
    if cap <= 0:
        raise ConfigError(f"tis cap must be positive, got {cap}")
    rho_BT = _ratio(_delta(old_logp_BT, infer_logp_BT), mask_BT, level)
    weight_BT = rho_BT.clamp(max=cap) * mask_BT.to(rho_BT.dtype)
    return weight_BT, {
        "tis_mean": masked_mean(weight_BT, mask_BT),
        "tis_clip_frac": masked_mean((rho_BT > cap).float(), mask_BT),
    }


def masked_is_weight(
    old_logp_BT: torch.Tensor,
    infer_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, Metrics]:
    """Masked importance sampling: weight ``rho`` where ``low <= rho <= high``, 0 elsewhere and off the mask.

    ``level="sequence"`` uses the sequence ratio, so a sequence outside the bounds is dropped whole. Returns
    ``(weight_BT, {"mis_weight_mean", "mis_masked_frac"})`` (means over the masked tokens).
    """
    _check_bounds(low, high)
    rho_BT = _ratio(_delta(old_logp_BT, infer_logp_BT), mask_BT, level)
    accept_BT = (rho_BT >= low) & (rho_BT <= high) & mask_BT.bool()
    weight_BT = torch.where(accept_BT, rho_BT, torch.zeros_like(rho_BT))
    return weight_BT, {
        "mis_weight_mean": masked_mean(weight_BT, mask_BT),
        "mis_masked_frac": masked_mean((~accept_BT).float(), mask_BT),
    }


def icepop_mask(
    old_logp_BT: torch.Tensor,
    infer_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[torch.Tensor, Metrics]:
    """IcePop's two-sided token mask: weight 1 where ``low <= rho_t <= high``, 0 elsewhere and off the mask.

    Returns ``(weight_BT, {"icepop_masked_frac"})``.
    """
    _check_bounds(low, high)
    rho_BT = _delta(old_logp_BT, infer_logp_BT).exp()
    accept_BT = (rho_BT >= low) & (rho_BT <= high) & mask_BT.bool()
    return accept_BT.to(rho_BT.dtype), {"icepop_masked_frac": masked_mean((~accept_BT).float(), mask_BT)}


# The corrections of MISMATCH_CORRECTIONS, as (old, infer, mask, *, cfg) -> (weight_BT, metrics); ``cfg`` is a
# presets.MismatchCorrection (type, level, low, high).


@MISMATCH_CORRECTIONS.bind("tis")
def _tis(old_BT: torch.Tensor, infer_BT: torch.Tensor, mask_BT: torch.Tensor, *, cfg: Any) -> Any:
    return truncated_is_weight(old_BT, infer_BT, mask_BT, cap=cfg.high, level=cfg.level)


@MISMATCH_CORRECTIONS.bind("mis")
def _mis(old_BT: torch.Tensor, infer_BT: torch.Tensor, mask_BT: torch.Tensor, *, cfg: Any) -> Any:
    return masked_is_weight(old_BT, infer_BT, mask_BT, low=cfg.lower, high=cfg.high, level=cfg.level)


@MISMATCH_CORRECTIONS.bind("icepop")
def _icepop(old_BT: torch.Tensor, infer_BT: torch.Tensor, mask_BT: torch.Tensor, *, cfg: Any) -> Any:
    return icepop_mask(old_BT, infer_BT, mask_BT, low=cfg.lower, high=cfg.high)


MISMATCH_CORRECTIONS.check_bound()
