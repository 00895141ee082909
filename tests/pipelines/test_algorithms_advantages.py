"""Advantage estimators, group helpers, whitening, reward normalization and clipping: golden values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.advantages import (
    RunningMeanStd,
    clip_advantages,
    clip_rewards,
    discounted_returns,
    dr_grpo_advantages,
    expand_to_tokens,
    gae_advantages,
    gigpo_advantages,
    group_normalize,
    grpo_advantages,
    masked_whiten,
    normalize_rewards,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

R3 = math.sqrt(3.0)


def test_grpo_bessel_and_population() -> None:
    """rewards [1, 0, 1, 1], G = 4: mean 0.75, deviations [.25, -.75, .25, .25], sum of squares 0.75.

    Bessel (default): var 0.75 / 3 = 0.25, std 0.5 -> [0.5, -1.5, 0.5, 0.5].
    Population: var 0.75 / 4 = 0.1875, std sqrt(3)/4 -> [1/sqrt3, -sqrt3, 1/sqrt3, 1/sqrt3].
    A second group [2, 2, 2, 2] is all equal -> all 0 (no NaN even with eps = 0).
    """
    rewards_PG = torch.tensor([[1.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    assert_close(
        grpo_advantages(rewards_PG, eps=0.0),
        torch.tensor([[0.5, -1.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]),
    )
    assert_close(
        grpo_advantages(rewards_PG[:1], eps=0.0, unbiased=False),
        torch.tensor([[1 / R3, -R3, 1 / R3, 1 / R3]]),
    )


def test_dr_grpo_and_rloo() -> None:
    """rewards [1, 0, 1, 1]: Dr. GRPO r - 0.75 = [.25, -.75, .25, .25].
    RLOO baselines (others' mean): [2/3, 1, 2/3, 2/3] -> [1/3, -1, 1/3, 1/3] (= 4/3 of Dr. GRPO's)."""
    rewards_PG = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    assert_close(dr_grpo_advantages(rewards_PG), torch.tensor([[0.25, -0.75, 0.25, 0.25]]))
    assert_close(rloo_advantages(rewards_PG), torch.tensor([[1 / 3, -1.0, 1 / 3, 1 / 3]]))
    with pytest.raises(ConfigError, match="RLOO"):
        rloo_advantages(torch.tensor([[1.0], [0.0]]))


def test_gae_golden() -> None:
    """gamma 0.9, lambda 0.8 (gamma*lambda 0.72), rewards [0, 0, 1], values [0.2, 0.4, 0.6]:

    t=2: delta = 1 + 0.9*0 - 0.6 = 0.4;          A2 = 0.4
    t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14;       A1 = 0.14 + 0.72*0.4 = 0.428
    t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16;       A0 = 0.16 + 0.72*0.428 = 0.46816
    returns = A + V = [0.66816, 0.828, 1.0]. A padded 4th token (reward 5, value 9) changes nothing, gets 0.
    """
    rewards_BT = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values_BT = torch.tensor([[0.2, 0.4, 0.6, 9.0]])
    mask_BT = torch.tensor([[1, 1, 1, 0]])
    adv_BT, ret_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=0.9, lam=0.8)
    assert_close(adv_BT, torch.tensor([[0.46816, 0.428, 0.4, 0.0]]))
    assert_close(ret_BT, torch.tensor([[0.66816, 0.828, 1.0, 0.0]]))


def test_gae_skips_masked_middle_tokens() -> None:
    """mask [1, 0, 1] (an env token in the middle, reward 7, value 99, both ignored):
    t=2: A2 = 1 - 0.6 = 0.4; t=0 sees the next *trained* token: delta = 0.9*0.6 - 0.2 = 0.34,
    A0 = 0.34 + 0.72*0.4 = 0.628."""
    adv_BT, _ = gae_advantages(
        torch.tensor([[0.0, 7.0, 1.0]]),
        torch.tensor([[0.2, 99.0, 0.6]]),
        torch.tensor([[1, 0, 1]]),
        gamma=0.9,
        lam=0.8,
    )
    assert_close(adv_BT, torch.tensor([[0.628, 0.0, 0.4]]))


def test_gae_lambda_one_is_return_minus_value() -> None:
    """gamma = lambda = 1: A_t = (sum of future rewards) - V_t = 1 - 0.5 for every token."""
    adv_BT, ret_BT = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.full((1, 3), 0.5), torch.ones(1, 3), gamma=1.0, lam=1.0
    )
    assert_close(adv_BT, torch.full((1, 3), 0.5))
    assert_close(ret_BT, torch.ones(1, 3))


def test_discounted_returns_golden() -> None:
    """token rewards [0, -0.1, 1], gamma 0.5: R2 = 1, R1 = -0.1 + 0.5 = 0.4, R0 = 0 + 0.2 = 0.2."""
    got = discounted_returns(torch.tensor([[0.0, -0.1, 1.0]]), torch.ones(1, 3), gamma=0.5)
    assert_close(got, torch.tensor([[0.2, 0.4, 1.0]]))


def test_reinforce_pp_golden() -> None:
    """rows [0, -0.1, 1] and [0.5, 0, pad], gamma 1: returns [0.9, 0.9, 1.0] and [0.5, 0.0, 0].

    Whitening over the 5 trained tokens [0.9, 0.9, 1.0, 0.5, 0.0]: mean 0.66, deviations
    [0.24, 0.24, 0.34, -0.16, -0.66], sum of squares 0.692, Bessel var 0.173.
    """
    token_rewards_BT = torch.tensor([[0.0, -0.1, 1.0], [0.5, 0.0, 3.0]])
    mask_BT = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv_BT, ret_BT = reinforce_pp_advantages(token_rewards_BT, mask_BT, gamma=1.0)
    assert_close(ret_BT, torch.tensor([[0.9, 0.9, 1.0], [0.5, 0.0, 0.0]]))
    expected = torch.tensor([[0.24, 0.24, 0.34], [-0.16, -0.66, 0.0]]) / math.sqrt(0.173)
    assert_close(adv_BT, expected)


def test_reinforce_pp_baseline_golden() -> None:
    """rewards_PG [[1, 0], [1, 1]] -> minus group mean [0.5, -0.5, 0, 0]; response lengths 2, 1, 2, 1 give
    token values [.5, .5, -.5, 0, 0, 0]: mean 1/12, deviations [5, 5, -7, -1, -1, -1]/12,
    sum of squares 102/144, Bessel var 102/720."""
    mask_BT = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    got = reinforce_pp_baseline_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), mask_BT)
    std = math.sqrt(102 / 720)
    expected = torch.tensor([[5.0, 5.0], [-7.0, 0.0], [-1.0, -1.0], [-1.0, 0.0]]) / 12 / std
    assert_close(got, expected * mask_BT)


def test_whiten_and_token_helpers() -> None:
    """[1, 2, 3, pad 50]: mean 2, Bessel std 1 -> [-1, 0, 1, 0]; without shift the mean is added back.
    Outcome scores [1, 2] land on the last trained token; an empty row stays 0."""
    x_BT = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask_BT = torch.tensor([[1, 1, 1, 0]])
    assert_close(masked_whiten(x_BT, mask_BT, eps=0.0), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    assert_close(
        masked_whiten(x_BT, mask_BT, eps=0.0, shift_mean=False), torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    )
    mask3_BT = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    got = outcome_to_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask3_BT)
    assert_close(got, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]))
    assert_close(
        expand_to_tokens(torch.tensor([2.0, -1.0]), mask3_BT[:2]), torch.tensor([[2.0, 2.0, 0.0], [-1.0] * 3])
    )


def test_group_normalize_by_ids() -> None:
    """ids [7, 7, 7, 7, 2, 2, 9]: group 7 is the GRPO example -> [.5, -1.5, .5, .5]; group 2 = [5, 3]:
    mean 4, Bessel std sqrt(2) -> [1/sqrt2, -1/sqrt2]; the singleton group 9 -> 0."""
    scores_B = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0, 3.0, 4.0])
    ids_B = torch.tensor([7, 7, 7, 7, 2, 2, 9])
    s2 = 1 / math.sqrt(2)
    assert_close(group_normalize(scores_B, ids_B, eps=0.0), torch.tensor([0.5, -1.5, 0.5, 0.5, s2, -s2, 0.0]))


def test_gigpo() -> None:
    """Episode returns [1, 0, 1, 1] in one group -> [.5, -1.5, .5, .5]. Step returns [2, 0, 1, 1] with anchor
    groups [a, a, b, c] -> [1/sqrt2, -1/sqrt2, 0, 0]. With omega 0.5 the sum is
    [.5 + .5/sqrt2, -1.5 - .5/sqrt2, .5, .5]."""
    got = gigpo_advantages(
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.zeros(4, dtype=torch.long),
        torch.tensor([2.0, 0.0, 1.0, 1.0]),
        torch.tensor([0, 0, 1, 2]),
        step_weight=0.5,
        eps=0.0,
    )
    h = 0.5 / math.sqrt(2)
    assert_close(got, torch.tensor([0.5 + h, -1.5 - h, 0.5, 0.5]))


def test_running_mean_std() -> None:
    """Updates [1, 2, 3] then [4, 5] equal one pass over 1..5: mean 3, population var 2.
    normalize(5) = 2 / sqrt(2 + eps); the state survives a state_dict round trip."""
    rms = RunningMeanStd(eps=0.0)
    rms.update(torch.tensor([1.0, 2.0, 3.0]))
    rms.update(torch.tensor([4.0, 5.0]))
    assert rms.state_dict() == pytest.approx({"mean": 3.0, "var": 2.0, "count": 5.0})
    assert_close(rms.normalize(torch.tensor([3.0, 5.0])), torch.tensor([0.0, math.sqrt(2.0)]))
    other = RunningMeanStd(eps=0.0)
    other.load_state_dict(rms.state_dict())
    assert other.state_dict() == rms.state_dict()


def test_normalize_rewards_modes() -> None:
    """batch [1, 0, 1, 1]: mean .75, population std sqrt(3)/4 -> [1/sqrt3, -sqrt3, 1/sqrt3, 1/sqrt3].
    group [1, 0 | 3, 5] (ids 0, 0, 1, 1): means .5 and 4, population stds .5 and 1 -> [1, -1, -1, 1]."""
    batch = normalize_rewards(torch.tensor([1.0, 0.0, 1.0, 1.0]), mode="batch", eps=0.0)
    assert_close(batch, torch.tensor([1 / R3, -R3, 1 / R3, 1 / R3]))
    ids_B = torch.tensor([0, 0, 1, 1])
    group = normalize_rewards(torch.tensor([1.0, 0.0, 3.0, 5.0]), mode="group", group_ids_B=ids_B, eps=0.0)
    assert_close(group, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="group ids"):
        normalize_rewards(torch.tensor([1.0, 0.0]), mode="group")
    same = torch.tensor([[1.0, 2.0]])
    assert normalize_rewards(same, mode="none") is same
    rms = RunningMeanStd(eps=0.0)
    assert_close(
        normalize_rewards(torch.tensor([[1.0, 3.0]]), mode="running", running=rms),
        torch.tensor([[-1.0, 1.0]]),
    )
    with pytest.raises(ConfigError, match="RunningMeanStd"):
        normalize_rewards(same, mode="running")


def test_clipping() -> None:
    x = torch.tensor([-3.0, 0.5, 2.0])
    assert_close(clip_rewards(x, max_abs=1.0), torch.tensor([-1.0, 0.5, 1.0]))
    assert_close(clip_advantages(x, max_abs=2.5), torch.tensor([-2.5, 0.5, 2.0]))
    with pytest.raises(ConfigError):
        clip_rewards(x, max_abs=0.0)


@pytest.mark.parametrize("G", [3, 6, 7, 8, 12])
@pytest.mark.parametrize("value", [0.1, 0.3, 0.9, -0.2])
def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(G: int, value: float) -> None:
    """The float32 mean of G rewards of 0.3 is not 0.3 (for G = 8 it is 3e-8 off), and ``/ (std + 1e-6)`` made
    that rounding an advantage of +-0.03; a group that carries no signal must give 0, exactly. A mixed group
    beside it keeps its usual values."""
    rewards_PG = torch.tensor([[value] * G, [0.0] * (G - 1) + [1.0]])
    ids_B = torch.arange(2).repeat_interleave(G)
    for adv_PG in (
        grpo_advantages(rewards_PG),
        rloo_advantages(rewards_PG),
        group_normalize(rewards_PG.reshape(-1), ids_B).reshape(2, G),
        group_normalize(rewards_PG.reshape(-1), ids_B, norm_by_std=False).reshape(2, G),
    ):
        assert torch.equal(adv_PG[0], torch.zeros(G))
        assert adv_PG[1, -1] > 0 > adv_PG[1, 0]
