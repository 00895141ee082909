"""Distillation divergences on explicit small distributions, the top-k rule, and CE mixing."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.choices import DivergenceName
from roll.pipelines.algorithms.divergence import (
    adaptive_kl,
    distill_loss,
    forward_kl,
    js_divergence,
    reverse_kl,
    skew_forward_kl,
    skew_reverse_kl,
    topk_log_probs,
)

ln = math.log


def _logp(*probs: float) -> torch.Tensor:
    return torch.tensor([[[ln(p) for p in probs]]])  # [B=1, T=1, K]


# Two-token vocabulary: teacher p = [3/4, 1/4], student q = [1/2, 1/2].
P = _logp(0.75, 0.25)
Q = _logp(0.5, 0.5)


def test_kls_golden() -> None:
    """KL(p||q) = .75 ln(.75/.5) + .25 ln(.25/.5) = 0.130812.
    KL(q||p) = .5 ln(.5/.75) + .5 ln(.5/.25) = 0.143841."""
    assert_close(forward_kl(P, Q), torch.tensor([[0.75 * ln(1.5) + 0.25 * ln(0.5)]]))
    assert_close(reverse_kl(P, Q), torch.tensor([[0.5 * ln(0.5 / 0.75) + 0.5 * ln(2.0)]]))


def test_skewed_kls_golden() -> None:
    """alpha 0.1. SKL: m = .1p + .9q = [.525, .475]; KL(p||m) = .75 ln(.75/.525) + .25 ln(.25/.475) = 0.107043.
    SRKL: m' = .9p + .1q = [.725, .275]; KL(q||m') = .5 ln(.5/.725) + .5 ln(.5/.275) = 0.113137.
    alpha 0 gives the plain KLs."""
    assert_close(
        skew_forward_kl(P, Q, alpha=0.1), torch.tensor([[0.75 * ln(0.75 / 0.525) + 0.25 * ln(0.25 / 0.475)]])
    )
    assert_close(
        skew_reverse_kl(P, Q, alpha=0.1), torch.tensor([[0.5 * ln(0.5 / 0.725) + 0.5 * ln(0.5 / 0.275)]])
    )
    assert_close(skew_forward_kl(P, Q, alpha=0.0), forward_kl(P, Q))
    assert_close(skew_reverse_kl(P, Q, alpha=0.0), reverse_kl(P, Q))
    with pytest.raises(ConfigError):
        skew_forward_kl(P, Q, alpha=1.0)


def test_js_golden() -> None:
    """beta 0.5: m = [.625, .375]; KL(p||m) = .75 ln 1.2 + .25 ln(2/3) = 0.035375;
    KL(q||m) = .5 ln .8 + .5 ln(4/3) = 0.032269; JS = (0.035375 + 0.032269) / 2 = 0.033822.
    beta 0.25: m = .25p + .75q = [9/16, 7/16]; .25 KL(p||m) + .75 KL(q||m)."""
    kl_pm = 0.75 * ln(1.2) + 0.25 * ln(2 / 3)
    kl_qm = 0.5 * ln(0.8) + 0.5 * ln(4 / 3)
    assert_close(js_divergence(P, Q, beta=0.5), torch.tensor([[0.5 * kl_pm + 0.5 * kl_qm]]))
    m = (9 / 16, 7 / 16)
    kl_pm = 0.75 * ln(0.75 / m[0]) + 0.25 * ln(0.25 / m[1])
    kl_qm = 0.5 * ln(0.5 / m[0]) + 0.5 * ln(0.5 / m[1])
    assert_close(js_divergence(P, Q, beta=0.25), torch.tensor([[0.25 * kl_pm + 0.75 * kl_qm]]))


def test_adaptive_kl_golden() -> None:
    """p = [.5, .3, .2], q = [.2, .1, .7], mu 0.5: cumulative teacher mass [.5, .8, 1]; head = {0} (.5 <= mu),
    tail = {1, 2}. Gaps: head |.5 - .2| = .3; tail |.3 - .1| + |.2 - .7| = .7 -> weights .3 and .7.
    FKL = .5 ln 2.5 + .3 ln 3 + .2 ln(2/7) = 0.537176; RKL = .2 ln .4 + .1 ln(1/3) + .7 ln 3.5 = 0.583815;
    AKL = .3 * FKL + .7 * RKL = 0.569824. Permuting the vocabulary changes nothing (the head is by sort)."""
    p, q = _logp(0.5, 0.3, 0.2), _logp(0.2, 0.1, 0.7)
    fkl = 0.5 * ln(2.5) + 0.3 * ln(3) + 0.2 * ln(2 / 7)
    rkl = 0.2 * ln(0.4) + 0.1 * ln(1 / 3) + 0.7 * ln(3.5)
    expected = torch.tensor([[0.3 * fkl + 0.7 * rkl]])
    assert_close(adaptive_kl(p, q, mu=0.5), expected)
    perm = torch.tensor([2, 0, 1])
    assert_close(adaptive_kl(p[..., perm], q[..., perm], mu=0.5), expected)


@pytest.mark.parametrize("name", get_args(DivergenceName))
def test_zero_when_equal_and_finite_grads(name: DivergenceName) -> None:
    torch.manual_seed(0)
    teacher_BTK = torch.randn(2, 3, 4)
    zero, _ = distill_loss(
        teacher_BTK.clone(), teacher_BTK, None, torch.ones(2, 3), divergence=name, student_gathered=True
    )
    assert_close(zero, torch.tensor(0.0), atol=1e-6, rtol=0)
    student = torch.randn(2, 3, 10, requires_grad=True)
    idx = torch.randint(0, 10, (2, 3, 4))
    loss, _ = distill_loss(student, teacher_BTK, idx, torch.ones(2, 3), divergence=name)
    torch.autograd.backward(loss)
    assert loss > 0 and student.grad is not None and torch.isfinite(student.grad).all()


def test_topk_rule_full_vs_gathered_and_temperature() -> None:
    """Full-vocab student logits [a, b, c, d] at teacher indices [2, 0] renormalize to softmax([c, a]), the
    same as passing [c, a] already gathered. Teacher logits [ln 9, 0] at temperature 2 -> softmax([ln 3, 0])
    = [3/4, 1/4]."""
    student_BTV = torch.tensor([[[0.3, -1.0, 1.2, 5.0]]])
    idx_BTK = torch.tensor([[[2, 0]]])
    teacher_BTK = torch.tensor([[[ln(9), 0.0]]])
    p_full, q_full = topk_log_probs(student_BTV, teacher_BTK, idx_BTK, teacher_temperature=2.0)
    _, q_g = topk_log_probs(
        torch.tensor([[[1.2, 0.3]]]), teacher_BTK, student_gathered=True, teacher_temperature=2.0
    )
    assert_close(p_full.exp(), torch.tensor([[[0.75, 0.25]]]))
    assert_close(q_full, q_g)
    assert_close(q_full.exp(), torch.softmax(torch.tensor([[[1.2, 0.3]]]), dim=-1))
    with pytest.raises(ConfigError, match="gather"):
        topk_log_probs(student_BTV, teacher_BTK, None)


def test_forward_kl_gradient_is_q_minus_p() -> None:
    """d KL(p || softmax(z)) / dz = softmax(z) - p = [.5 - .75, .5 - .25] = [-.25, .25] (one token)."""
    student = torch.zeros(1, 1, 2, requires_grad=True)
    loss, _ = distill_loss(student, P, torch.tensor([[[0, 1]]]), torch.ones(1, 1))
    torch.autograd.backward(loss)
    assert student.grad is not None
    assert_close(student.grad, torch.tensor([[[-0.25, 0.25]]]))


def test_mask_and_ce_mixing() -> None:
    """Token 0: student [0, 0] vs teacher [3/4, 1/4] -> FKL 0.130812; label 0 -> CE ln 2. Token 1 is padding
    with garbage. kd_weight 0.5 -> 0.5 * FKL + 0.5 * ln 2."""
    student = torch.tensor([[[0.0, 0.0], [50.0, -50.0]]])
    teacher = torch.tensor([[[ln(0.75), ln(0.25)], [-50.0, 50.0]]])
    idx = torch.tensor([[[0, 1], [0, 1]]])
    mask = torch.tensor([[1, 0]])
    fkl = 0.75 * ln(1.5) + 0.25 * ln(0.5)
    loss, metrics = distill_loss(student, teacher, idx, mask)
    assert_close(loss, torch.tensor(fkl))
    loss, metrics = distill_loss(
        student, teacher, idx, mask, kd_weight=0.5, labels_BT=torch.tensor([[0, -100]])
    )
    assert_close(loss, torch.tensor(0.5 * fkl + 0.5 * ln(2)))
    assert_close(metrics["ce_loss"], torch.tensor(ln(2)))
    with pytest.raises(ConfigError, match="labels"):
        distill_loss(student, teacher, idx, mask, kd_weight=0.5)
