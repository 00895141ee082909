"""KL estimators, KL in the loss, KL controllers; the critic's clipped value loss.

KL in the reward is checked where production applies it, ``test_reinforce_pp_kl_in_the_reward`` in
``test_algorithms_estimators.py``."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
    kl_estimate,
    kl_loss,
)
from roll.pipelines.algorithms.value_loss import clipped_value_loss

LN2 = math.log(2)
LOGP_BT = torch.zeros(1, 3)
REF_BT = torch.tensor([[0.0, LN2, -LN2]])


def test_estimators_golden() -> None:
    """logp 0, ref [0, ln2, -ln2], so log r = ref - logp = [0, ln2, -ln2], r = [1, 2, 1/2]:

    k1 = -log r          = [0, -ln2, ln2]
    k2 = (log r)^2 / 2   = [0, ln2^2/2, ln2^2/2]
    k3 = r - 1 - log r   = [0, 1 - ln2, ln2 - 1/2]
    """
    assert_close(kl_estimate(LOGP_BT, REF_BT, estimator="k1"), torch.tensor([[0.0, -LN2, LN2]]))
    assert_close(kl_estimate(LOGP_BT, REF_BT, estimator="k2"), torch.tensor([[0.0, LN2**2 / 2, LN2**2 / 2]]))
    k3 = torch.tensor([[0.0, 1 - LN2, LN2 - 0.5]])
    assert_close(kl_estimate(LOGP_BT, REF_BT, estimator="k3"), k3)
    assert_close(kl_estimate(LOGP_BT, REF_BT, estimator="low_var_kl"), k3)
    with pytest.raises(ConfigError, match="k3"):
        kl_estimate(LOGP_BT, REF_BT, estimator="k9")  # type: ignore[arg-type]


def test_low_var_clamps() -> None:
    """log r = 30 is clamped to 20, and e^20 - 21 to 10."""
    got = kl_estimate(torch.zeros(1, 1), torch.full((1, 1), 30.0), estimator="low_var_kl")
    assert_close(got, torch.full((1, 1), 10.0))


@pytest.mark.parametrize("estimator", ["k1+", "k3+"])
def test_straight_through_value_and_gradient(estimator: str) -> None:
    """Value of k1 / k3; gradient of k2: d/dlogp (ref - logp)^2 / 2 = logp - ref = [0, -ln2, ln2]."""
    logp_BT = LOGP_BT.clone().requires_grad_(True)
    got = kl_estimate(logp_BT, REF_BT, estimator=estimator)  # type: ignore[arg-type]
    plain = kl_estimate(LOGP_BT, REF_BT, estimator=estimator[:2])  # type: ignore[arg-type]
    assert_close(got, plain)
    torch.autograd.backward(got.sum())
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[0.0, -LN2, LN2]]))


def test_kl_loss() -> None:
    """k3 sums to (1 - ln2) + (ln2 - 1/2) = 1/2 over 3 tokens: coef 0.5 * (1/2) / 3 = 1/12."""
    loss, metrics = kl_loss(LOGP_BT, REF_BT, torch.ones(1, 3), coef=0.5, estimator="k3")
    assert_close(loss, torch.tensor(1 / 12))
    assert_close(metrics["kl"], torch.tensor(1 / 6))


def test_adaptive_controller() -> None:
    """Ziegler et al.: init 0.1, target 6, horizon 10000. KL 9: error clip(9/6 - 1) = +0.2, times
    256/10000 -> beta 0.1 * 1.00512. Then KL 3: error -0.2 -> beta * 0.99488."""
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=256)
    assert ctl.value == pytest.approx(0.1 * 1.00512)
    ctl.update(3.0, n_steps=256)
    assert ctl.value == pytest.approx(0.1 * 1.00512 * 0.99488)
    restored = AdaptiveKLController(1.0, target=1.0, horizon=1)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value and restored.target == 6.0 and restored.horizon == 10000


def test_fixed_controller_and_builder() -> None:
    fixed = FixedKLController(0.05)
    fixed.update(100.0, n_steps=1000)
    assert fixed.value == 0.05
    assert isinstance(build_kl_controller(0.05), FixedKLController)
    assert isinstance(build_kl_controller(0.05, target=3.0), AdaptiveKLController)
    with pytest.raises(ConfigError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


def test_clipped_value_loss_golden() -> None:
    """values [1.5, 0.5], old [1, 1], returns [2, 2], clip 0.2 -> clipped values [1.2, 0.8].
    Squared errors: unclipped [0.25, 2.25], clipped [0.64, 1.44]; max [0.64, 2.25]; half: [0.32, 1.125];
    mean 0.7225. Token 0 uses the clipped error (constant in V): grad 0. Token 1: (V - R) / 2 = -0.75.
    Without clipping: 0.5 * [0.25, 2.25] -> mean 0.625."""
    values_BT = torch.tensor([[1.5, 0.5]], requires_grad=True)
    old_BT, returns_BT, mask_BT = torch.ones(1, 2), torch.full((1, 2), 2.0), torch.ones(1, 2)
    loss, metrics = clipped_value_loss(values_BT, old_BT, returns_BT, mask_BT, clip_range=0.2)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(0.7225))
    assert values_BT.grad is not None
    assert_close(values_BT.grad, torch.tensor([[0.0, -0.75]]))
    assert_close(metrics["vf_clip_frac"], torch.tensor(0.5))
    loss, _ = clipped_value_loss(values_BT, old_BT, returns_BT, mask_BT, clip_range=None)
    assert_close(loss, torch.tensor(0.625))
