"""The train/infer mismatch toolkit: always-on metrics, and the TIS / MIS / IcePop corrections of the registry.

Every golden value is derived by hand on one 2x3 batch (``GOLDEN``), whose log-ratios ``delta = old - infer``
are chosen so that ``rho = exp(delta)`` is a small power of two::

    old    = [[-1, -1, -1], [-2, -2, -2]]
    delta  = [[0, ln 2, -ln 2], [ln 4, 0, (masked)]]          mask = [[1, 1, 1], [1, 1, 0]]
    rho    = [[1, 2, 1/2], [4, 1, -]]

The five masked-in tokens have rho {1, 2, 1/2, 4, 1}, sorted [1/2, 1, 1, 2, 4].
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core import columns as C
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.mismatch import icepop_mask, masked_is_weight, mismatch_metrics, quantiles
from roll.pipelines.algorithms.presets import AlgorithmConfig, MismatchCorrection, preset_config
from roll.pipelines.algorithms.registry import MISMATCH_CORRECTIONS, POLICY_LOSSES
from roll.workers.metrics import UnitWeightedMeans
from roll.workers.types import ForwardOutput

LN2 = math.log(2.0)
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
DELTA = torch.tensor([[0.0, LN2, -LN2], [2 * LN2, 0.0, 3.0]])  # the masked token's 3.0 must not count
INFER = OLD - DELTA
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_mismatch_metrics_golden() -> None:
    """|delta| = {0, ln2, ln2, 2 ln2, 0}: mean 4 ln2 / 5, max 2 ln2 (the masked 3.0 is left out).
    k3 = rho - 1 - ln rho per token: 0, 1 - ln2, ln2 - 1/2, 3 - 2 ln2, 0; mean (3.5 - 2 ln2) / 5.
    Quantiles of [1/2, 1, 1, 2, 4] at positions q * 4: p05 at 0.2 -> 1/2 + 0.2 * (1 - 1/2) = 0.6;
    p50 at 2 -> 1; p95 at 3.8 -> 2 + 0.8 * (4 - 2) = 3.6."""
    m = mismatch_metrics(OLD, INFER, MASK)
    expected = {
        "mismatch/logp_abs_diff_mean": 4 * LN2 / 5,
        "mismatch/logp_abs_diff_max": 2 * LN2,
        "mismatch/kl_k3": (3.5 - 2 * LN2) / 5,
        "mismatch/ratio_p05": 0.6,
        "mismatch/ratio_p50": 1.0,
        "mismatch/ratio_p95": 3.6,
    }
    assert sorted(m) == sorted(expected)
    for name, value in expected.items():
        assert float(m[name]) == pytest.approx(value, abs=1e-6), name
    assert mismatch_metrics(OLD, INFER, torch.zeros_like(MASK)) == {}


def test_quantiles_match_torch() -> None:
    """The sort-based quantiles equal ``torch.quantile`` (linear) on random data."""
    x = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    ours = torch.stack(quantiles(x, (0.05, 0.5, 0.95)))
    assert_close(ours, torch.quantile(x, torch.tensor([0.05, 0.5, 0.95])))


def test_masked_is_weight_token_and_sequence_golden() -> None:
    """MIS in [1/2, 2], token level: rho 4 is outside, every other rho (1, 2, 1/2, 1; bounds inclusive) keeps
    its value: weights [[1, 2, 1/2], [0, 1, 0]]; 1 of 5 tokens masked; weight mean (1 + 2 + 0.5 + 0 + 1) / 5.
    Sequence level: row 0 sums 0 + ln2 - ln2 = 0 -> rho 1, kept (weight 1 on each token); row 1 sums ln 4 ->
    rho 4, dropped whole: [[1, 1, 1], [0, 0, 0]], 2 of 5 tokens masked."""
    w, m = masked_is_weight(OLD, INFER, MASK, low=0.5, high=2.0)
    assert_close(w, torch.tensor([[1.0, 2.0, 0.5], [0.0, 1.0, 0.0]]))
    assert float(m["mis_masked_frac"]) == pytest.approx(1 / 5) and float(
        m["mis_weight_mean"]
    ) == pytest.approx(0.9)
    w, m = masked_is_weight(OLD, INFER, MASK, low=0.5, high=2.0, level="sequence")
    assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert float(m["mis_masked_frac"]) == pytest.approx(2 / 5)


def test_icepop_mask_golden() -> None:
    """IcePop with k = 2 (bounds [1/2, 2]): only rho 4 is outside, and accepted tokens get 1, not rho:
    [[1, 1, 1], [0, 1, 0]], 1 of 5 masked. With k = 5 ([0.2, 5]) every masked-in token passes."""
    w, m = icepop_mask(OLD, INFER, MASK, low=0.5, high=2.0)
    assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]))
    assert float(m["icepop_masked_frac"]) == pytest.approx(1 / 5)
    w, _ = icepop_mask(OLD, INFER, MASK, low=0.2, high=5.0)
    assert_close(w, MASK.float())


def _algo(**overrides: object) -> AlgorithmConfig:
    """token-mean, except for a loss whose registry entry requires its own aggregation (gspo, gmpo)."""
    loss = str(overrides.get("loss_type", "ppo"))
    agg = POLICY_LOSSES.entry(loss).aggregation or "token-mean"
    return preset_config("grpo", kl_mode="none", kl_coef=0.0, loss_agg_mode=agg, **overrides)


def _loss(algo: AlgorithmConfig, *, with_infer: bool = True) -> tuple[float, dict[str, float]]:
    """PolicyLoss at ratio 1 (one optimizer step: old = this forward's logp = OLD) with advantages 1: each token's
    loss is -A * w = -w, token-mean turned into a sum (the strategy divides by the units), so loss = -sum(w)."""
    loss_fn = PolicyLoss(algo, norm_len=3, use_old_logp=False)
    mb = {C.RESPONSE_MASK: MASK, C.ADVANTAGES: MASK.float()}
    if with_infer:
        mb[C.INFER_LOGP] = INFER
    loss, metrics = loss_fn(ForwardOutput(OLD.clone().requires_grad_(True)), mb)
    return float(loss.detach()), {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("loss_type", POLICY_LOSSES.names)
def test_policy_loss_logs_mismatch_without_a_correction(loss_type: str) -> None:
    """Whatever the loss and with no correction, a batch with the sampler's log-probs gets the mismatch metrics
    (kl_k3 as derived above); the loss is that of no correction; a batch without them gets none."""
    algo = _algo(loss_type=loss_type)
    _, metrics = _loss(algo)
    assert metrics["mismatch/kl_k3"] == pytest.approx((3.5 - 2 * LN2) / 5, abs=1e-6)
    _, plain = _loss(algo, with_infer=False)
    assert not any(k.startswith("mismatch/") for k in plain)


@pytest.mark.parametrize(
    ("correction", "weights_sum"),
    [
        ({"type": "tis", "high": 2.0}, 1 + 2 + 0.5 + 2 + 1),  # min(rho, 2): rho 4 -> 2
        ({"type": "mis", "low": 0.5, "high": 2.0}, 1 + 2 + 0.5 + 0 + 1),
        ({"type": "mis", "high": 2.0, "level": "sequence"}, 3.0),  # low = 1/2 by default; row 1 dropped
        ({"type": "icepop", "high": 2.0}, 4.0),
        (None, 5.0),
    ],
)
def test_policy_loss_applies_each_correction(correction: dict | None, weights_sum: float) -> None:
    """PPO at ratio 1 with A = 1: loss = -sum of the correction's weights over the 5 tokens (hand sums beside
    each case; no correction weighs each token 1)."""
    algo = _algo(mismatch_correction=correction)
    loss, _ = _loss(algo)
    assert loss == pytest.approx(-weights_sum, abs=1e-6)


def test_tis_cap_is_short_for_a_tis_correction() -> None:
    algo = preset_config("grpo", tis_cap=2.0, tis_level="sequence")
    assert algo.correction() == MismatchCorrection(type="tis", high=2.0, level="sequence")
    assert _loss(_algo(tis_cap=2.0))[0] == pytest.approx(-6.5)


def test_correction_config_rejects_contradictions() -> None:
    """Both spellings at once, a lower bound for TIS, a sequence-level IcePop and an upper bound under 1 for a
    mask are config errors naming the key; an unknown type lists the known ones."""
    with pytest.raises(ValueError, match="tis_cap and mismatch_correction"):
        preset_config("grpo", tis_cap=2.0, mismatch_correction={"type": "mis"})
    with pytest.raises(ValueError, match="low applies to mis and icepop"):
        MismatchCorrection(type="tis", low=0.5)
    with pytest.raises(ValueError, match="icepop is a token mask"):
        MismatchCorrection(type="icepop", level="sequence")
    with pytest.raises(ValueError, match=r"must hold rho = 1; high is 0\.8"):
        MismatchCorrection(type="mis", high=0.8)
    with pytest.raises(ValueError, match="'tis', 'mis' or 'icepop'"):
        MismatchCorrection(type="clip")  # type: ignore[arg-type]
    assert MismatchCorrection(type="icepop", high=4.0).lower == 0.25
    assert set(MISMATCH_CORRECTIONS.names) == {"tis", "mis", "icepop"}


def test_unit_weighted_means_keep_the_max_of_max_metrics() -> None:
    """Two micro-batches of 1 and 3 units: a mean metric is (1 * 2 + 3 * 4) / 4 = 3.5; a ``_max`` metric is the
    larger of the two, 5 (not a weighted 3.5)."""
    acc = UnitWeightedMeans()
    acc.add({"a": 2.0, "mismatch/logp_abs_diff_max": 5.0}, 1.0)
    acc.add({"a": 4.0, "mismatch/logp_abs_diff_max": 2.0}, 3.0)
    assert acc.means() == {"a": 3.5, "mismatch/logp_abs_diff_max": 5.0}
