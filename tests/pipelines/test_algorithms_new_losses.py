"""SAPO, GMPO, Clip-Cov and KL-Cov: golden values derived by hand on 2x3 batches, and the config contracts
(required aggregation, loss defaults) of the registry.

Every batch below has the mask ``[[1, 1, 1], [1, 1, 0]]`` (N = 5 trained tokens; row 1's last position is padding
with an absurd value that must not matter) and advantages constant per row, +A on row 0 and -A on row 1.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch.testing import assert_close

from roll.core import columns as C
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.covariance import clip_cov_policy_loss, kl_cov_policy_loss, token_covariance
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.policy_loss import gmpo_policy_loss, sapo_policy_loss
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.workers.types import ForwardOutput

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
SEQ_MEAN = Aggregation("seq-mean-token-mean")


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _adv(a: float) -> torch.Tensor:
    return torch.tensor([[a, a, a], [-a, -a, -a]])


def _logp(log_ratios: list[list[float]]) -> torch.Tensor:
    """Current log-probs over an old log-prob of 0, i.e. the log-ratios themselves, with grad."""
    return torch.tensor(log_ratios, requires_grad=True)


def test_sapo_golden() -> None:
    """Ratios row 0 [1, 2, 0.5] (A = +1, tau_pos = 1), row 1 [1, 1.5] (A = -1, tau_neg = 2).
    Gate f(r) = sigmoid(tau (r - 1)) * 4 / tau, L = -f(r) A:
      row 0: -[2, 4 sig(1), 4 sig(-0.5)], token mean -(2 + 4 sig(1) + 4 sig(-0.5)) / 3
      row 1: +[2 sig(0), 2 sig(1)] = [1, 2 sig(1)], token mean (1 + 2 sig(1)) / 2
    seq-mean-token-mean: the mean of both rows. dL/dlogp = -A * 4 r sig (1 - sig) / (n_tokens_b * 2 rows):
    at r = 1 the weight 4 * 1/4 = 1 (plain policy gradient): row 0 token 0 -1/6, row 1 token 0 +1/4; row 0 token 1
    (r = 2): -8 sig(1) sig(-1) / 6."""
    logp_BT = _logp([[0.0, math.log(2.0), math.log(0.5)], [0.0, math.log(1.5), 30.0]])
    loss, metrics = sapo_policy_loss(
        logp_BT, torch.zeros(2, 3), _adv(1.0), MASK, tau_pos=1.0, tau_neg=2.0, agg=SEQ_MEAN
    )
    torch.autograd.backward(loss)
    row0 = -(2 + 4 * _sigmoid(1.0) + 4 * _sigmoid(-0.5)) / 3
    row1 = (1 + 2 * _sigmoid(1.0)) / 2
    assert_close(loss, torch.tensor((row0 + row1) / 2))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad[0, 0], torch.tensor(-1 / 6))
    assert_close(logp_BT.grad[1, 0], torch.tensor(1 / 4))
    assert_close(logp_BT.grad[0, 1], torch.tensor(-8 * _sigmoid(1.0) * _sigmoid(-1.0) / 6))
    assert logp_BT.grad[1, 2] == 0
    # gradient weight 4 r sig(1 - sig) per token: [1, 8 sig(1) sig(-1), 2 sig(-.5) sig(.5)], [1, 6 sig(1) sig(-1)]
    weights = [1, 8 * _sigmoid(1) * _sigmoid(-1), 2 * _sigmoid(-0.5) * _sigmoid(0.5), 1]
    weights.append(6 * _sigmoid(1) * _sigmoid(-1))
    assert_close(metrics["gate_grad_mean"], torch.tensor(sum(weights) / 5))
    with pytest.raises(ConfigError, match="temperatures"):
        sapo_policy_loss(logp_BT, torch.zeros(2, 3), _adv(1.0), MASK, tau_neg=0.0)


def test_gmpo_golden() -> None:
    """Log-space clip 0.4 / 0.4. Row 0 (A = +1) log-ratios [0.1, 0.6, -0.8]: for A > 0 the pessimistic side is the
    min with the clamp, [0.1, 0.4, -0.8] (only the high side clips), mean -0.1, L_0 = -e^-0.1. Row 1 (A = -1)
    [0.6, -0.8]: the max with the clamp, [0.6, -0.4], mean 0.1, L_1 = +e^0.1. Mean over rows:
    (e^0.1 - e^-0.1) / 2 = sinh(0.1). Gradients: only unclipped tokens, dL/dl_t = (1/2) (-A_b) e^{mean_b} / n_b:
    row 0 tokens 0 and 2: -e^-0.1 / 6; row 1 token 0: e^0.1 / 4; the clipped ones 0. clip_frac 2/5."""
    logp_BT = _logp([[0.1, 0.6, -0.8], [0.6, -0.8, 9.0]])
    loss, metrics = gmpo_policy_loss(logp_BT, torch.zeros(2, 3), _adv(1.0), MASK, agg=SEQ_MEAN)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(math.sinh(0.1)))
    g0, g1 = -math.exp(-0.1) / 6, math.exp(0.1) / 4
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[g0, 0.0, g0], [g1, 0.0, 0.0]]))
    assert_close(metrics["clip_frac"], torch.tensor(0.4))
    assert_close(metrics["seq_ratio_mean"], torch.tensor(math.cosh(0.1)))


def test_gmpo_geometric_mean_damps_an_outlier() -> None:
    """Unclipped (clip 1), one row of ratios [1, 1, e^0.9]: the geometric mean is e^0.3 = 1.35, the arithmetic mean
    (what a token-level ratio averages to) (2 + e^0.9) / 3 = 1.487: GMPO's sequence ratio is the smaller."""
    logp_BT = torch.tensor([[0.0, 0.0, 0.9]])
    loss, _ = gmpo_policy_loss(
        logp_BT,
        torch.zeros(1, 3),
        torch.ones(1, 3),
        torch.ones(1, 3),
        clip_low=1.0,
        clip_high=1.0,
        agg=SEQ_MEAN,
    )
    assert_close(loss, torch.tensor(-math.exp(0.3)))


# Covariance batch: A = +2 / -2, current log-probs row 0 [-0.5, -1, -4], row 1 [-3, -0.5].
# mean A = (6 - 4) / 5 = 0.4, so A - mean = 1.6 (row 0), -2.4 (row 1); mean logp = -9 / 5 = -1.8, so
# logp - mean = [1.3, 0.8, -2.2], [-1.2, 1.3]; cov = [2.08, 1.28, -3.52], [2.88, -3.12].
COV_LOGP = [[-0.5, -1.0, -4.0], [-3.0, -0.5, -50.0]]
COV = torch.tensor([[2.08, 1.28, -3.52], [2.88, -3.12, 0.0]])


def test_token_covariance() -> None:
    cov_BT = token_covariance(torch.tensor(COV_LOGP), _adv(2.0), MASK)
    assert_close(cov_BT * MASK, COV * MASK)


def test_clip_cov_golden() -> None:
    """Ratios 1 except row 0 token 1 at 1.5 (A = +2: PPO clips it, loss max(-3, -2.4) = -2.4, no gradient), so it is
    no candidate although its cov 1.28 is in (1, 5). Candidates: row 0 token 0 (2.08) and row 1 token 0 (2.88).
    ratio 1: max(1, int(5)) = 5 >= 2, both are zeroed. Left: row 0 token 2 (-2) and row 1 token 1 (+2):
    token-mean (-2.4 - 2 + 2) / 5 = -0.48; gradients -A rho / 5 on the live unclipped tokens: -0.4 and +0.4.
    clip_frac 1/5, cov_frac 2/5."""
    logp_BT = torch.tensor(COV_LOGP, requires_grad=True)
    old_BT = torch.tensor(COV_LOGP)
    old_BT[0, 1] -= math.log(1.5)
    loss, metrics = clip_cov_policy_loss(logp_BT, old_BT, _adv(2.0), MASK, ratio=1.0)
    torch.autograd.backward(loss)
    assert_close(loss, torch.tensor(-0.48))
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor([[0.0, 0.0, -0.4], [0.0, 0.4, 0.0]]))
    assert_close(metrics["clip_frac"], torch.tensor(0.2))
    assert_close(metrics["cov_frac"], torch.tensor(0.4))


def test_clip_cov_draws_its_count_among_the_candidates_only() -> None:
    """All ratios 1: candidates are the three tokens with cov in (1, 5): (0,0), (0,1), (1,0). ratio 0.5 zeroes
    int(2.5) = 2 of them, drawn by the generator; the other tokens keep -A each. Whatever the draw, the loss is
    (sum of the live tokens' -A) / 5 and the two zeroed tokens are candidates; a fixed seed repeats the draw."""
    candidates = {(0, 0), (0, 1), (1, 0)}
    picks = []
    for seed in (0, 1, 0):
        logp_BT = torch.tensor(COV_LOGP, requires_grad=True)
        generator = torch.Generator().manual_seed(seed)
        loss, metrics = clip_cov_policy_loss(
            logp_BT, torch.tensor(COV_LOGP), _adv(2.0), MASK, ratio=0.5, generator=generator
        )
        torch.autograd.backward(loss)
        assert logp_BT.grad is not None
        zeroed = {(b, t) for b in range(2) for t in range(3) if MASK[b, t] and logp_BT.grad[b, t] == 0}
        assert len(zeroed) == 2 and zeroed <= candidates
        live = [(b, t) for b in range(2) for t in range(3) if MASK[b, t] and (b, t) not in zeroed]
        assert_close(loss, torch.tensor(sum(-2.0 if b == 0 else 2.0 for b, _ in live) / 5))
        assert_close(metrics["cov_frac"], torch.tensor(0.4))
        picks.append(zeroed)
    assert picks[0] == picks[2]


def test_kl_cov_golden() -> None:
    """Log-ratios row 0 [0.1, -0.2, 0.3], row 1 [0.2, -0.1]; covariances as above (of the current log-probs).
    ratio 0.4: max(1, int(2)) = 2 tokens of largest cov: row 1 token 0 (2.88) and row 0 token 0 (2.08), which get
    + coef |log rho| (coef 0.5). L_t = -A e^{lr} elsewhere, no clipping:
      row 0: -2e^0.1 + 0.05, -2e^-0.2, -2e^0.3;  row 1: 2e^0.2 + 0.1, 2e^-0.1;  token-mean over 5.
    Gradients / 5: row 0 token 0 (-2e^0.1 + 0.5), row 1 token 0 (2e^0.2 + 0.5), the rest -A e^{lr}."""
    lr = torch.tensor([[0.1, -0.2, 0.3], [0.2, -0.1, 0.0]])
    logp_BT = torch.tensor(COV_LOGP, requires_grad=True)
    loss, metrics = kl_cov_policy_loss(
        logp_BT, torch.tensor(COV_LOGP) - lr, _adv(2.0), MASK, ratio=0.4, coef=0.5
    )
    torch.autograd.backward(loss)
    e = math.exp
    total = (-2 * e(0.1) + 0.05) - 2 * e(-0.2) - 2 * e(0.3) + (2 * e(0.2) + 0.1) + 2 * e(-0.1)
    assert_close(loss, torch.tensor(total / 5))
    grad = [[-2 * e(0.1) + 0.5, -2 * e(-0.2), -2 * e(0.3)], [2 * e(0.2) + 0.5, 2 * e(-0.1), 0.0]]
    assert logp_BT.grad is not None
    assert_close(logp_BT.grad, torch.tensor(grad) / 5)
    assert_close(metrics["cov_frac"], torch.tensor(0.4))


def test_loss_states_its_aggregation_and_defaults() -> None:
    """Issue 30 item 4: ``loss_type: gspo`` alone gets GSPO's clip ranges and seq-mean-token-mean (GMPO its log-space
    0.4 and the same mode, SAPO the paper's mode as a default); a config that contradicts the required aggregation
    is rejected with a message naming it; a user's explicit keys still win where the loss allows them."""
    gspo = AlgorithmConfig.model_validate({"loss_type": "gspo"})
    assert (gspo.clip_low, gspo.clip_high, gspo.loss_agg_mode) == (3e-4, 4e-4, "seq-mean-token-mean")
    gmpo = AlgorithmConfig.model_validate({"loss_type": "gmpo"})
    assert (gmpo.clip_low, gmpo.clip_high, gmpo.loss_agg_mode) == (0.4, 0.4, "seq-mean-token-mean")
    assert AlgorithmConfig.model_validate({"loss_type": "sapo"}).loss_agg_mode == "seq-mean-token-mean"
    assert AlgorithmConfig.model_validate(
        {"loss_type": "sapo", "loss_agg_mode": "token-mean"}
    ).loss_agg_mode == ("token-mean")
    assert AlgorithmConfig.model_validate({"loss_type": "gspo", "clip_low": 0.1}).clip_low == 0.1
    for loss in ("gspo", "gmpo"):
        with pytest.raises(ValidationError, match=r"loss_agg_mode.*seq-mean-token-mean"):
            AlgorithmConfig.model_validate({"loss_type": loss, "loss_agg_mode": "token-mean"})
    with pytest.raises(ValidationError, match="sapo_tau_pos applies to loss_type 'sapo'"):
        AlgorithmConfig.model_validate({"loss_type": "ppo", "sapo_tau_pos": 2.0})
    with pytest.raises(ValidationError, match="clip_cov_lb"):
        AlgorithmConfig.model_validate({"loss_type": "clip_cov", "clip_cov_lb": 5.0})


def test_gspo_alone_is_sequence_weighted_as_the_issue_asks() -> None:
    """Issue 30 item 4's example, through the run's own PolicyLoss: on-policy (ratio 1), lengths [1, 3], advantages
    [+1, -1]. GSPO's objective -mean_i A_i s_i = -(1 - 1) / 2 = 0. Token-mean would give (-1 + 3) / 4 = 0.5, the
    length weighting GSPO removes; ``loss_type: gspo`` without the preset now gets seq-mean-token-mean, and the
    LossFn's sum over its units (2 rows) divided by them is 0. Also: the loss is the same through ``preset: gspo``."""
    mask_BT = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mb = {C.RESPONSE_MASK: mask_BT, C.ADVANTAGES: torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])}
    for algo in (AlgorithmConfig(loss_type="gspo"), AlgorithmConfig(preset="gspo")):
        loss_fn = PolicyLoss(algo, norm_len=3, use_old_logp=False)
        total, _ = loss_fn(ForwardOutput(torch.full((2, 3), -1.0, requires_grad=True)), mb)
        assert loss_fn.count_units(mb) == 2.0
        assert_close(total / 2, torch.tensor(0.0))
    token_mean = AlgorithmConfig(loss_type="ppo")
    total, _ = PolicyLoss(token_mean, norm_len=3, use_old_logp=False)(
        ForwardOutput(torch.full((2, 3), -1.0)), mb
    )
    assert_close(total / 4, torch.tensor(0.5))


@pytest.mark.parametrize("loss_type", ["clip_cov", "kl_cov"])
def test_covariance_losses_leave_no_row_inert(loss_type: str) -> None:
    """Their token selection reads the whole micro-batch, so a zero-advantage row is not left out of it."""
    mb = {C.RESPONSE_MASK: MASK, C.ADVANTAGES: torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])}
    assert (
        PolicyLoss(AlgorithmConfig(loss_type=loss_type), norm_len=3, use_old_logp=False).inert_rows(mb)
        is None
    )
    inert = PolicyLoss(AlgorithmConfig(loss_type="sapo"), norm_len=3, use_old_logp=False).inert_rows(mb)
    assert inert is not None and inert.tolist() == [True, False]
