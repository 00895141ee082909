"""Policy losses: golden values, clipping behaviour of gradients, metrics, TIS, entropy."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.mismatch import truncated_is_weight
from roll.pipelines.algorithms.policy_loss import (
    cispo_policy_loss,
    entropy_bonus,
    gspo_policy_loss,
    ppo_policy_loss,
    topr_policy_loss,
)
from roll.workers.logprobs import logprobs_from_logits


def _logp(ratios: list[float]) -> torch.Tensor:
    """Current log-probs whose ratios to an old log-prob of 0 are ``ratios``, with grad."""
    return torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)


def test_ppo_golden_and_gradients() -> None:
    """old_logp 0, ratios [0.5, 1.0, 1.5, 1.1], advantages [1, 1, 1, -1], clip 0.2/0.2:

    token 0: max(-0.5, -0.8) = -0.5 (unclipped)      grad d/dlogp = -A*rho = -0.5
    token 1: max(-1.0, -1.0) = -1.0                  grad -1.0
    token 2: max(-1.5, -1.2) = -1.2 (clipped)        grad 0 (outside the trust region)
    token 3: max(1.1, 1.1)   = 1.1                   grad +1.1
    token-mean: (-0.5 - 1 - 1.2 + 1.1) / 4 = -0.4; gradients / 4. clip_frac 1/4, ratio mean 4.1/4, max 1.5.
    """
    logp_BT = _logp([0.5, 1.0, 1.5, 1.1])
    adv_BT = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    mask_BT = torch.ones(1, 4)
    loss, metrics = ppo_policy_loss(logp_BT, torch.zeros(1, 4), adv_BT, mask_BT)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(-0.4))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[-0.5, -1.0, 0.0, 1.1]]) / 4)
    assert_close(metrics["clip_frac"], torch.tensor(0.25))
    assert_close(metrics["ratio_mean"], torch.tensor(1.025))
    assert_close(metrics["ratio_max"], torch.tensor(1.5))
    k3 = sum(r - 1 - math.log(r) for r in (0.5, 1.0, 1.5, 1.1)) / 4
    assert_close(metrics["approx_kl"], torch.tensor(k3))


def test_ppo_clip_higher_and_is_weight() -> None:
    """clip_high 0.6 lets token 2 (ratio 1.5) through: (-0.5 - 1 - 1.5 + 1.1) / 4 = -0.475.
    With clip 0.2 and an IS weight 2 on token 0: (-1.0 - 1 - 1.2 + 1.1) / 4 = -0.525."""
    adv_BT = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    args = (_logp([0.5, 1.0, 1.5, 1.1]), torch.zeros(1, 4), adv_BT, torch.ones(1, 4))
    loss, _ = ppo_policy_loss(*args, clip_high=0.6)
    assert_close(loss, torch.tensor(-0.475))
    loss, _ = ppo_policy_loss(*args, is_weight_BT=torch.tensor([[2.0, 1.0, 1.0, 1.0]]))
    assert_close(loss, torch.tensor(-0.525))


def test_ppo_dual_clip() -> None:
    """A = -1, ratio 5: clipped PPO gives max(5, 1.2) = 5; dual-clip c = 3 bounds it at 3, with zero grad.
    A padded token with huge values is ignored."""
    logp_BT = _logp([5.0, 100.0])
    adv_BT = torch.tensor([[-1.0, -50.0]])
    mask_BT = torch.tensor([[1, 0]])
    loss, _ = ppo_policy_loss(logp_BT, torch.zeros(1, 2), adv_BT, mask_BT)
    assert_close(loss, torch.tensor(5.0))
    loss, metrics = ppo_policy_loss(logp_BT, torch.zeros(1, 2), adv_BT, mask_BT, dual_clip_c=3.0)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(3.0))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.zeros(1, 2))
    assert_close(metrics["dual_clip_frac"], torch.tensor(1.0))
    with pytest.raises(ConfigError, match="dual_clip_c"):
        ppo_policy_loss(logp_BT, torch.zeros(1, 2), adv_BT, mask_BT, dual_clip_c=1.0)


def test_gspo_golden() -> None:
    """Row 0: token log-ratios [0.1, 0.3], mean 0.2, s = e^0.2 = 1.2214 > 1.2, A = 1 -> each token
    max(-1.2214, -1.2) = -1.2, clipped (zero grad). Row 1: one token (one pad), s = 1, A = -1 -> loss 1,
    grad d(-A s)/dlogp = 1. seq-mean-token-mean: (-1.2 + 1) / 2 = -0.1; row 1's grad 1 / 1 token / 2 seqs.
    clip_frac counts sequences: 1/2. (Clip ranges 0.2 for readable numbers.)"""
    old_BT = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    logp_BT = torch.tensor([[-0.9, -0.7], [-1.0, 5.0]], requires_grad=True)
    adv_BT = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask_BT = torch.tensor([[1, 1], [1, 0]])
    agg = Aggregation("seq-mean-token-mean")
    loss, metrics = gspo_policy_loss(logp_BT, old_BT, adv_BT, mask_BT, clip_low=0.2, clip_high=0.2, agg=agg)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(-0.1))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[0.0, 0.0], [0.5, 0.0]]))
    assert_close(metrics["clip_frac"], torch.tensor(0.5))


def test_gspo_token_form_matches_sequence_form() -> None:
    """Inside the clip range, the GSPO-token loss (seq-mean-token-mean) equals the sequence objective
    -mean_i A_i exp(mean_t log-ratio) in value and gradient."""
    torch.manual_seed(0)
    old_BT = torch.randn(3, 4)
    logp_BT = (old_BT + 0.01 * torch.randn(3, 4)).requires_grad_(True)
    adv_B = torch.tensor([1.0, -0.5, 2.0])
    mask_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    agg = Aggregation("seq-mean-token-mean")
    loss, _ = gspo_policy_loss(
        logp_BT, old_BT, adv_B[:, None].expand(3, 4), mask_BT, clip_low=1.0, clip_high=1.0, agg=agg
    )
    (grad,) = torch.autograd.grad(loss, logp_BT)
    seq_ratio_B = (((logp_BT - old_BT) * mask_BT).sum(-1) / mask_BT.sum(-1)).exp()
    reference = -(adv_B * seq_ratio_B).mean()
    (ref_grad,) = torch.autograd.grad(reference, logp_BT)
    assert_close(loss, reference)
    assert_close(grad, ref_grad)


def test_cispo_golden() -> None:
    """ratios [0.5, 1.5], A = 1, clip_low 1 (no lower bound), clip_high 0.2: weights sg(clip) = [0.5, 1.2];
    loss = mean(-w * A * logp) = (-0.5 ln 0.5 - 1.2 ln 1.5) / 2; grad = -w * A / 2 = [-0.25, -0.6]: the
    clipped token still has a gradient (unlike PPO). clip_frac 1/2."""
    logp_BT = _logp([0.5, 1.5])
    loss, metrics = cispo_policy_loss(
        logp_BT, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), clip_low=1.0, clip_high=0.2
    )
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor((-0.5 * math.log(0.5) - 1.2 * math.log(1.5)) / 2))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[-0.25, -0.6]]))
    assert_close(metrics["clip_frac"], torch.tensor(0.5))


def test_topr_token_level() -> None:
    """ratios [2, 0.5, 2, 0.5], A [1, 1, -1, -1]: weights 1, 1 (positive: SFT-like), min(2, 1) = 1,
    min(0.5, 1) = 0.5. loss = mean(-w A logp) = (-ln2 + ln2 + ln2 + 0.5 ln 0.5) / 4 = 0.5 ln2 / 4;
    grad = -w A / 4 = [-0.25, -0.25, 0.25, 0.125]. clip_frac: negative tokens with ratio > 1: 1/4."""
    logp_BT = _logp([2.0, 0.5, 2.0, 0.5])
    adv_BT = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = topr_policy_loss(logp_BT, torch.zeros(1, 4), adv_BT, torch.ones(1, 4), level="token")
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(0.5 * math.log(2) / 4))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[-0.25, -0.25, 0.25, 0.125]]))
    assert_close(metrics["clip_frac"], torch.tensor(0.25))


def test_topr_sequence_level() -> None:
    """Both rows A = -1, old logp -1. Row 0 log-ratios [.5, .5] -> rho = e^1 -> w = 1, logp -0.5 -> each
    token -w A logp = -0.5. Row 1 log-ratios [-.5, -.5] -> w = e^-1, logp -1.5 -> -1.5 e^-1 each.
    token-mean: (2 * -0.5 + 2 * -1.5 e^-1) / 4."""
    old_BT = torch.full((2, 2), -1.0)
    logp_BT = torch.tensor([[-0.5, -0.5], [-1.5, -1.5]])
    loss, _ = topr_policy_loss(logp_BT, old_BT, torch.full((2, 2), -1.0), torch.ones(2, 2))
    assert_close(loss, torch.tensor((-1.0 - 3.0 * math.exp(-1)) / 4))


def test_truncated_is_weight() -> None:
    """old - infer = [1, -0.5, 0]: token weights min(e^1, 2) = 2, e^-0.5, 1; one of three capped.
    Sequence level: sum 0.5 -> e^0.5 = 1.6487 < 2 on every trained token; a masked token gets 0."""
    old_BT = torch.tensor([[-1.0, -1.0, -1.0, 0.0]])
    infer_BT = torch.tensor([[-2.0, -0.5, -1.0, -9.0]])
    mask_BT = torch.tensor([[1, 1, 1, 0]])
    w_BT, metrics = truncated_is_weight(old_BT, infer_BT, mask_BT, cap=2.0)
    assert_close(w_BT, torch.tensor([[2.0, math.exp(-0.5), 1.0, 0.0]]))
    assert_close(metrics["tis_clip_frac"], torch.tensor(1 / 3))
    w_BT, _ = truncated_is_weight(old_BT, infer_BT, mask_BT, cap=2.0, level="sequence")
    e = math.exp(0.5)
    assert_close(w_BT, torch.tensor([[e, e, e, 0.0]]))


def test_entropy() -> None:
    """logits [0, 0] -> ln 2; logits [0, ln 3] (probs 1/4, 3/4) -> -(1/4 ln 1/4 + 3/4 ln 3/4), as the trainer's
    forward computes it (:func:`~roll.workers.logprobs.logprobs_from_logits`, ``with_entropy``).
    Bonus with coef 0.01 = -0.01 * token-mean."""
    logits_NV = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    _, h_N = logprobs_from_logits(logits_NV, torch.zeros(2, dtype=torch.long), with_entropy=True)
    assert h_N is not None
    h_BT = h_N.reshape(1, 2)
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert_close(h_BT, torch.tensor([[math.log(2), h1]]))
    loss, metrics = entropy_bonus(h_BT, torch.ones(1, 2), coef=0.01)
    assert_close(loss, torch.tensor(-0.01 * (math.log(2) + h1) / 2))
    assert_close(metrics["entropy"], torch.tensor((math.log(2) + h1) / 2))


@pytest.mark.parametrize("loss_fn", [ppo_policy_loss, gspo_policy_loss, cispo_policy_loss, topr_policy_loss])
def test_finite_gradients_on_random_inputs(loss_fn) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    old_BT = -torch.rand(4, 6) * 3
    logp_BT = (old_BT + 0.5 * torch.randn(4, 6)).requires_grad_(True)
    mask_BT = (torch.rand(4, 6) > 0.2).long()
    loss, metrics = loss_fn(logp_BT, old_BT, torch.randn(4, 6), mask_BT)
    torch.autograd.backward(loss)
    assert torch.isfinite(loss)
    assert logp_BT.grad is not None and torch.isfinite(logp_BT.grad).all()
    assert (logp_BT.grad[mask_BT == 0] == 0).all()
    assert all(torch.isfinite(v) for v in metrics.values())
