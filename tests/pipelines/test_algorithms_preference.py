"""DPO, cDPO, IPO, SimPO, KTO, Bradley-Terry and SFT cross-entropy against the published formulas evaluated by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.preference import (
    bradley_terry_loss,
    dpo_loss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    sequence_logp,
    sft_cross_entropy,
    simpo_loss,
)


def _softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# Pair 0: policy (chosen -1, rejected -2), reference (-1.5, -1.5): h = 0.5 - (-0.5) = 1.
# Pair 1: policy (-3, -1), reference (-2, -2): h = -1 - 1 = -2.
POLICY_C = torch.tensor([-1.0, -3.0])
POLICY_R = torch.tensor([-2.0, -1.0])
REF_C = torch.tensor([-1.5, -2.0])
REF_R = torch.tensor([-1.5, -2.0])


def test_dpo_golden() -> None:
    """beta 0.5: logits beta*h = [0.5, -1]; L = -log sigmoid(x) = log(1 + e^-x):
    pair 0: log(1 + e^-0.5) = 0.474077; pair 1: log(1 + e) = 1.313262; mean 0.893670.
    Implicit rewards beta*(logp - ref): chosen [0.25, -0.5], rejected [-0.25, 0.5]; accuracy 1/2;
    margins [0.5, -1] -> mean -0.25. dL/d(policy chosen) = -beta sigmoid(-beta h) / 2 per pair."""
    policy_c = POLICY_C.clone().requires_grad_(True)
    out = dpo_loss(policy_c, POLICY_R, REF_C, REF_R, beta=0.5)
    torch.autograd.backward(out.loss)
    assert_close(out.loss, torch.tensor((_softplus(-0.5) + _softplus(1.0)) / 2))
    assert_close(out.chosen_rewards_B, torch.tensor([0.25, -0.5]))
    assert_close(out.rejected_rewards_B, torch.tensor([-0.25, 0.5]))
    assert_close(out.metrics["reward_accuracy"], torch.tensor(0.5))
    assert_close(out.metrics["reward_margin"], torch.tensor(-0.25))
    assert policy_c.grad is not None
    assert_close(policy_c.grad, torch.tensor([-0.5 * _sigmoid(-0.5) / 2, -0.5 * _sigmoid(1.0) / 2]))


def test_cdpo_label_smoothing() -> None:
    """eps 0.1 on pair 0: 0.9 * log(1 + e^-0.5) + 0.1 * log(1 + e^0.5); since log(1 + e^x) = x + log(1 + e^-x),
    that is log(1 + e^-0.5) + 0.1 * 0.5 = 0.524077."""
    out = dpo_loss(POLICY_C[:1], POLICY_R[:1], REF_C[:1], REF_R[:1], beta=0.5, label_smoothing=0.1)
    assert_close(out.loss, torch.tensor(_softplus(-0.5) + 0.05))
    with pytest.raises(ConfigError):
        dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, label_smoothing=0.5)


def test_ipo_golden() -> None:
    """beta (tau) 0.5 -> target 1/(2 tau) = 1; h = [1, -2] -> (h - 1)^2 = [0, 9]; mean 4.5."""
    out = ipo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.5)
    assert_close(out.loss, torch.tensor(4.5))


def test_bradley_terry_golden() -> None:
    """rewards chosen [2, 0], rejected [1, 1]: gaps [1, -1]; -log sigmoid: [log(1+e^-1), log(1+e)] -> mean.
    Margin [1, 0]: gaps minus margin [0, -1] -> [ln 2, log(1+e)]. Accuracy 1/2."""
    chosen_B, rejected_B = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    loss, metrics = bradley_terry_loss(chosen_B, rejected_B)
    assert_close(loss, torch.tensor((_softplus(-1.0) + _softplus(1.0)) / 2))
    assert_close(metrics["accuracy"], torch.tensor(0.5))
    loss, _ = bradley_terry_loss(chosen_B, rejected_B, margin_B=torch.tensor([1.0, 0.0]))
    assert_close(loss, torch.tensor((math.log(2) + _softplus(1.0)) / 2))


def test_sequence_logp() -> None:
    """[-1, -2, pad -3] -> sum -3, mean -1.5."""
    logp_BT, mask_BT = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[1, 1, 0]])
    assert_close(sequence_logp(logp_BT, mask_BT), torch.tensor([-3.0]))
    assert_close(sequence_logp(logp_BT, mask_BT, average=True), torch.tensor([-1.5]))


def test_sft_cross_entropy() -> None:
    """logits [0, 0] with label 0 -> ln 2; logits [0, ln 3] with label 1 -> -ln(3/4). Mean of both; with the
    first label ignored, only -ln(3/4). Two micro-batches with num_global_tokens sum to the full mean."""
    logits_BTV = torch.tensor([[[0.0, 0.0], [0.0, math.log(3)]]])
    both = sft_cross_entropy(logits_BTV, torch.tensor([[0, 1]]))
    assert_close(both, torch.tensor((math.log(2) - math.log(0.75)) / 2))
    one = sft_cross_entropy(logits_BTV, torch.tensor([[-100, 1]]))
    assert_close(one, torch.tensor(-math.log(0.75)))
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 5)
    labels = torch.randint(0, 5, (4, 3))
    labels[0, :2] = -100
    n = int((labels != -100).sum())
    agg = Aggregation("token-mean", num_global_tokens=n)
    parts = sft_cross_entropy(logits[:2], labels[:2], agg=agg) + sft_cross_entropy(
        logits[2:], labels[2:], agg=agg
    )
    assert_close(parts, sft_cross_entropy(logits, labels))


def test_simpo_golden() -> None:
    """Average log-probs chosen [-1, -2], rejected [-1.5, -1]; beta 2, gamma 1: logits beta (c - r) - gamma =
    [2 * 0.5 - 1, 2 * (-1) - 1] = [0, -3]; -log sigmoid: [ln 2, log(1 + e^3)], mean. No reference anywhere.
    Implicit rewards beta * c = [-2, -4], beta * r = [-3, -2]. dL/dc = -beta sigmoid(-logit) / 2 = [-0.5, -sig(3)]."""
    chosen = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = simpo_loss(chosen, torch.tensor([-1.5, -1.0]), beta=2.0, gamma=1.0)
    torch.autograd.backward(out.loss)
    assert_close(out.loss, torch.tensor((math.log(2) + _softplus(3.0)) / 2))
    assert_close(out.chosen_rewards_B, torch.tensor([-2.0, -4.0]))
    assert_close(out.rejected_rewards_B, torch.tensor([-3.0, -2.0]))
    assert chosen.grad is not None
    assert_close(chosen.grad, torch.tensor([-0.5, -_sigmoid(3.0)]))
    smoothed = simpo_loss(chosen[:1], torch.tensor([-1.5]), beta=2.0, gamma=1.0, label_smoothing=0.1)
    assert_close(smoothed.loss, torch.tensor(math.log(2)))  # logit 0: both terms ln 2, whatever eps


def test_kto_golden() -> None:
    """policy [-1, -2, -3], reference [-2, -2, -2]: h = [1, 0, -1]; labels desirable, desirable, undesirable.
    Mismatched pairs: policy [-1, -2.5] vs reference [-2, -2]: mean(1, -0.5) = 0.25 = z0. beta 2:
      row 0: 1 - sig(2 (1 - 0.25)) = sig(-1.5);  row 1: 1 - sig(2 (0 - 0.25)) = sig(0.5);
      row 2: 1 - sig(2 (0.25 + 1)) = sig(-2.5);  mean of the three.
    dL/dlogp_0 = -beta sig(1.5) sig(-1.5) / 3. Undesirable weight 2 doubles row 2's term. A negative KL estimate
    clamps to 0: mismatched policy [-3, -3] -> z0 = 0."""
    policy = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    ref, label = torch.full((3,), -2.0), torch.tensor([True, True, False])
    z0 = kto_reference_point(torch.tensor([-1.0, -2.5]), torch.tensor([-2.0, -2.0]))
    assert_close(z0, torch.tensor(0.25))
    out = kto_loss(policy, ref, label, kl=z0, beta=2.0)
    torch.autograd.backward(out.loss)
    assert_close(out.loss, torch.tensor((_sigmoid(-1.5) + _sigmoid(0.5) + _sigmoid(-2.5)) / 3))
    assert policy.grad is not None
    assert_close(policy.grad[0], torch.tensor(-2 * _sigmoid(1.5) * _sigmoid(-1.5) / 3))
    assert_close(out.metrics["chosen_reward"], torch.tensor(1.0))  # beta * mean(1, 0)
    assert_close(out.metrics["rejected_reward"], torch.tensor(-2.0))
    weighted = kto_loss(policy, ref, label, kl=z0, beta=2.0, undesirable_weight=2.0)
    assert_close(weighted.loss, torch.tensor((_sigmoid(-1.5) + _sigmoid(0.5) + 2 * _sigmoid(-2.5)) / 3))
    assert float(kto_reference_point(torch.tensor([-3.0, -3.0]), torch.tensor([-2.0, -2.0]))) == 0.0
    with pytest.raises(ConfigError, match="KTO needs"):
        kto_loss(policy, ref, label, kl=0.0, beta=0.0)
