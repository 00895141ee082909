"""Distillation divergences on the teacher's top-k tokens.

Inputs per position: the teacher's top-k logits ``teacher_topk_logits_BTK`` and their vocabulary indices
``teacher_topk_idx_BTK``, and the student's logits, either over the full vocabulary (``[B, T, V]``; gathered
here at the teacher's indices) or already gathered at them (``[B, T, K]``, ``student_gathered=True``).

**Top-k renormalization rule** (one rule, used by every divergence here): both distributions live on the
teacher's ``K`` tokens. Teacher: ``p = softmax(teacher_topk_logits / tau_t)`` over its ``K`` values. Student:
``q = softmax(student_logits[idx] / tau_s)`` over the same ``K`` gathered logits, i.e. the full-vocabulary
distribution renormalized over the top-k set. Renormalizing both makes every divergence a proper one (>= 0, 0
iff ``q = p`` on the set) and gives the same result whether the student's logits arrive full or gathered,
so the logits-transfer path can ship only ``K`` values. The student's mass outside the set is not penalized
by the divergence; mixing in the token cross-entropy (``kd_weight < 1``) trains the full distribution.

Divergences (per position, summed over the ``K`` tokens; ``p`` teacher, ``q`` student):

- forward KL ``KL(p || q)`` (mode covering); reverse KL ``KL(q || p)`` (mode seeking);
- skewed forward KL ``KL(p || a p + (1 - a) q)`` and skewed reverse KL ``KL(q || (1 - a) p + a q)``, skew
  ``a = alpha`` in ``[0, 1)`` (Ko et al. 2024, "DistiLLM"): the mixture keeps the log-ratio bounded by
  ``-log a``; ``alpha = 0`` recovers the plain KLs;
- Jensen-Shannon, beta-weighted (the generalized JSD of Agarwal et al. 2024, GKD):
  ``beta KL(p || m) + (1 - beta) KL(q || m)``, ``m = beta p + (1 - beta) q``; ``beta = 0.5`` is the usual JSD;
- adaptive KL (Wu et al. 2024, "Rethinking Kullback-Leibler Divergence in Knowledge Distillation for Large
  Language Models", arXiv:2404.02657): sort the teacher's tokens by probability; the *head* is the smallest
  prefix whose cumulative teacher probability reaches ``mu`` (the first token always belongs to it: tokens
  after it are head while the cumulative sum, including them, is ``<= mu``), the *tail* the rest. With gaps
  ``g_head = sum_head |p - q|`` and ``g_tail = sum_tail |p - q|`` (``q`` detached)::

      AKL = g_head / (g_head + g_tail) * KL(p || q) + g_tail / (g_head + g_tail) * KL(q || p)

  so forward KL (which fits the head) weighs more where the head is off, reverse KL (tail) where the tail is.

No ``tau^2`` gradient rescaling is applied; multiply the loss by it when you want Hinton's convention.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from roll.core.columns import IGNORE_INDEX
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import TOKEN_MEAN, Aggregation, masked_mean
from roll.pipelines.algorithms.choices import DIVERGENCES, DivergenceName
from roll.pipelines.algorithms.preference import sft_cross_entropy


def topk_log_probs(
    student_logits: torch.Tensor,
    teacher_topk_logits_BTK: torch.Tensor,
    teacher_topk_idx_BTK: torch.Tensor | None = None,
    *,
    student_gathered: bool = False,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(teacher_logp_BTK, student_logq_BTK)``: both log-softmaxed over the K tokens (the rule above)."""
    if student_temperature <= 0 or teacher_temperature <= 0:
        raise ConfigError(
            f"temperatures must be > 0, got student={student_temperature}, teacher={teacher_temperature}"
        )
    if student_gathered:
        student_BTK = student_logits
    elif teacher_topk_idx_BTK is None:
        raise ConfigError("full-vocabulary student logits need teacher_topk_idx_BTK to gather at")
    else:
        student_BTK = student_logits.gather(-1, teacher_topk_idx_BTK)
    teacher_logp = torch.log_softmax(teacher_topk_logits_BTK.float() / teacher_temperature, dim=-1)
    student_logq = torch.log_softmax(student_BTK.float() / student_temperature, dim=-1)
    return teacher_logp.detach(), student_logq


def _kl(logp_BTK: torch.Tensor, logq_BTK: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum p (log p - log q)``, with ``0 log 0 = 0``."""
    p = logp_BTK.exp()
    return torch.where(p > 0, p * (logp_BTK - logq_BTK), torch.zeros_like(p)).sum(dim=-1)


def _log_mix(logp_BTK: torch.Tensor, logq_BTK: torch.Tensor, weight_p: float) -> torch.Tensor:
    """``log(w p + (1 - w) q)``, stable."""
    stacked = torch.stack([logp_BTK + math.log(weight_p), logq_BTK + math.log1p(-weight_p)])
    return torch.logsumexp(stacked, dim=0)


def forward_kl(teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per position, ``[B, T]``."""
    return _kl(teacher_logp_BTK, student_logq_BTK)


def reverse_kl(teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor) -> torch.Tensor:
    """``KL(q || p)`` per position, ``[B, T]``."""
    return _kl(student_logq_BTK, teacher_logp_BTK)


def _check_skew(alpha: float) -> None:
    if not 0 <= alpha < 1:
        raise ConfigError(f"skew alpha must be in [0, 1), got {alpha}")


def skew_forward_kl(
    teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor, *, alpha: float = 0.1
) -> torch.Tensor:
    """``KL(p || alpha p + (1 - alpha) q)`` per position (DistiLLM's SKL)."""
    _check_skew(alpha)
    if alpha == 0:
        return forward_kl(teacher_logp_BTK, student_logq_BTK)
    return _kl(teacher_logp_BTK, _log_mix(teacher_logp_BTK, student_logq_BTK, alpha))


def skew_reverse_kl(
    teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor, *, alpha: float = 0.1
) -> torch.Tensor:
    """``KL(q || (1 - alpha) p + alpha q)`` per position (DistiLLM's SRKL)."""
    _check_skew(alpha)
    if alpha == 0:
        return reverse_kl(teacher_logp_BTK, student_logq_BTK)
    return _kl(student_logq_BTK, _log_mix(teacher_logp_BTK, student_logq_BTK, 1 - alpha))


def js_divergence(
    teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor, *, beta: float = 0.5
) -> torch.Tensor:
    """``beta KL(p || m) + (1 - beta) KL(q || m)`` with ``m = beta p + (1 - beta) q``, per position."""
    if not 0 < beta < 1:
        raise ConfigError(f"JS beta must be in (0, 1), got {beta}")
    log_m = _log_mix(teacher_logp_BTK, student_logq_BTK, beta)
    return beta * _kl(teacher_logp_BTK, log_m) + (1 - beta) * _kl(student_logq_BTK, log_m)


def adaptive_kl_weights(
    teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor, *, mu: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """AKL's ``(head_weight_BT, tail_weight_BT)``, detached, summing to 1 (0.5 each when both gaps are 0)."""
    if not 0 < mu <= 1:
        raise ConfigError(f"adaptive KL mu must be in (0, 1], got {mu}")
    p_sorted, order = teacher_logp_BTK.detach().exp().sort(dim=-1, descending=True)
    q_sorted = student_logq_BTK.detach().exp().gather(-1, order)
    gap = (p_sorted - q_sorted).abs()
    tail = p_sorted.cumsum(dim=-1) > mu
    tail[..., 0] = False
    g_head = gap.masked_fill(tail, 0.0).sum(dim=-1)
    g_tail = gap.masked_fill(~tail, 0.0).sum(dim=-1)
    total = g_head + g_tail
    safe = total > 0
    head_w = torch.where(safe, g_head / total.clamp(min=1e-12), torch.full_like(total, 0.5))
    return head_w, 1 - head_w


def adaptive_kl(
    teacher_logp_BTK: torch.Tensor, student_logq_BTK: torch.Tensor, *, mu: float = 0.5
) -> torch.Tensor:
    """AKL per position: head-gap-weighted forward KL plus tail-gap-weighted reverse KL (module docstring)."""
    head_w, tail_w = adaptive_kl_weights(teacher_logp_BTK, student_logq_BTK, mu=mu)
    fkl = forward_kl(teacher_logp_BTK, student_logq_BTK)
    rkl = reverse_kl(teacher_logp_BTK, student_logq_BTK)
    return head_w * fkl + tail_w * rkl


def divergence_fn(
    name: DivergenceName, *, alpha: float = 0.1, beta: float = 0.5, mu: float = 0.5
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-position divergence ``f(teacher_logp_BTK, student_logq_BTK) -> [B, T]`` named ``name``."""
    table: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "forward_kl": forward_kl,
        "reverse_kl": reverse_kl,
        "skew_forward_kl": lambda p, q: skew_forward_kl(p, q, alpha=alpha),
        "skew_reverse_kl": lambda p, q: skew_reverse_kl(p, q, alpha=alpha),
        "js": lambda p, q: js_divergence(p, q, beta=beta),
        "adaptive_kl": lambda p, q: adaptive_kl(p, q, mu=mu),
    }
    if name not in table:
        raise ConfigError(f"unknown divergence {name!r}; known: {', '.join(DIVERGENCES)}")
    return table[name]


def distill_loss(
    student_logits: torch.Tensor,
    teacher_topk_logits_BTK: torch.Tensor,
    teacher_topk_idx_BTK: torch.Tensor | None,
    mask_BT: torch.Tensor,
    *,
    divergence: DivergenceName = "forward_kl",
    student_gathered: bool = False,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
    alpha: float = 0.1,
    beta: float = 0.5,
    mu: float = 0.5,
    kd_weight: float = 1.0,
    labels_BT: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``kd_weight * agg(divergence) + (1 - kd_weight) * CE(student, labels)``.

    The divergence follows the top-k rule of the module docstring with the temperatures; the cross-entropy
    uses the raw full-vocabulary student logits (so ``kd_weight < 1`` needs ``labels_BT`` and
    ``student_gathered=False``). Metrics: ``kd_loss`` and, when mixed, ``ce_loss``.
    """
    if not 0 <= kd_weight <= 1:
        raise ConfigError(f"kd_weight must be in [0, 1], got {kd_weight}")
    teacher_logp, student_logq = topk_log_probs(
        student_logits,
        teacher_topk_logits_BTK,
        teacher_topk_idx_BTK,
        student_gathered=student_gathered,
        student_temperature=student_temperature,
        teacher_temperature=teacher_temperature,
    )
    div_BT = divergence_fn(divergence, alpha=alpha, beta=beta, mu=mu)(teacher_logp, student_logq)
    kd = agg(div_BT, mask_BT)
    metrics = {"kd_loss": kd.detach(), "kd_mean": masked_mean(div_BT.detach(), mask_BT)}
    if kd_weight == 1:
        return kd, metrics
    if labels_BT is None or student_gathered:
        raise ConfigError(
            "kd_weight < 1 mixes in cross-entropy: pass labels_BT and full-vocabulary student logits"
        )
    ce = sft_cross_entropy(student_logits, labels_BT, ignore_index=ignore_index, agg=agg)
    metrics["ce_loss"] = ce.detach()
    return kd_weight * kd + (1 - kd_weight) * ce, metrics
