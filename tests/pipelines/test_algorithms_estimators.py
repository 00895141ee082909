"""Golden values of every advantage estimator, checked against the code production runs.

The estimators go through :func:`~roll.pipelines.algorithms.estimators.estimate_advantages`, the one entry that
rlvr, agentic and on-policy distillation call; the shared helpers (whitening, group statistics, discounted
returns, reward normalization, clipping) are checked as the functions the estimators and the objective call. Group
statistics in production use ``eps = 1e-6``: where a value is derived with ``eps = 0`` the difference (at most a
few 1e-6) is inside ``assert_close``'s float32 tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.estimators import (
    AdvantageInputs,
    EstimatorParams,
    estimate_advantages,
    layout_group_ids,
)
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.algorithms.stats import (
    RunningMeanStd,
    clip_advantages,
    clip_rewards,
    discounted_returns,
    expand_to_tokens,
    group_normalize,
    masked_whiten,
    normalize_rewards,
    outcome_to_token_rewards,
)
from roll.pipelines.policy.objective import PolicyObjective

R3 = math.sqrt(3.0)
S = 1 / R3  # 0.57735


def _estimate(
    name: str, rewards_B: torch.Tensor, groups_B: torch.Tensor, T: int = 2, **params: float
) -> torch.Tensor:
    """Per-row advantages ``[B, T]`` of an outcome estimator on rows of ``T`` trained tokens."""
    inputs = AdvantageInputs(rewards_B, torch.ones(len(rewards_B), T), group_ids_B=groups_B)
    return estimate_advantages(name, inputs, EstimatorParams(**params)).advantages_BT


def _per_row(name: str, rewards_PG: torch.Tensor) -> torch.Tensor:
    """An outcome estimator on RLVR's prompt-major ``[P, G]`` layout, one value per row, back as ``[P, G]``."""
    P, G = rewards_PG.shape
    return _estimate(name, rewards_PG.reshape(-1), layout_group_ids(P, G))[:, 0].reshape(P, G)


# ---------------------------------------------------------------------------------------- outcome estimators


def test_grpo_bessel_and_population() -> None:
    """rewards [1, 0, 1, 1], G = 4: mean 0.75, deviations [.25, -.75, .25, .25], sum of squares 0.75.

    Bessel (GRPO): var 0.75 / 3 = 0.25, std 0.5 -> [0.5, -1.5, 0.5, 0.5].
    Population (``reward_norm: group``): var 0.75 / 4 = 0.1875, std sqrt(3)/4 -> [1/sqrt3, -sqrt3, 1/sqrt3, 1/sqrt3].
    A second group [2, 2, 2, 2] is all equal -> all 0 (no NaN even with eps = 0).
    """
    rewards_PG = torch.tensor([[1.0, 0.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    assert_close(_per_row("grpo", rewards_PG), torch.tensor([[0.5, -1.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    population = normalize_rewards(
        rewards_PG.reshape(-1), mode="group", group_ids_B=layout_group_ids(2, 4), eps=0.0
    )
    assert_close(population, torch.tensor([1 / R3, -R3, 1 / R3, 1 / R3, 0.0, 0.0, 0.0, 0.0]))


def test_grpo_on_rlvr_layout_ids_golden() -> None:
    """Rewards [1, 0, 0 | 2, 2, 5], groups of 3. Group 0: mean 1/3, deviations 2/3, -1/3, -1/3, Bessel std
    sqrt((4/9 + 1/9 + 1/9) / 2) = 1/sqrt(3), so A = 2/sqrt(3), -1/sqrt(3), -1/sqrt(3). Group 1: mean 3,
    deviations -1, -1, 2, std sqrt(6 / 2) = sqrt(3), so A = -1/sqrt(3), -1/sqrt(3), 2/sqrt(3)."""
    rewards_B = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    groups_B = layout_group_ids(2, 3)
    assert groups_B.tolist() == [0, 0, 0, 1, 1, 1]
    want_B = torch.tensor([2 * S, -S, -S, -S, -S, 2 * S])
    assert_close(_estimate("grpo", rewards_B, groups_B)[:, 0], want_B, atol=1e-5, rtol=0)


def test_grpo_on_groups_given_by_ids() -> None:
    """ids [7, 7, 7, 7, 2, 2, 9]: group 7 is the GRPO example -> [.5, -1.5, .5, .5]; group 2 = [5, 3]:
    mean 4, Bessel std sqrt(2) -> [1/sqrt2, -1/sqrt2]; the singleton group 9 -> 0. Every trained token of a row
    carries the row's value."""
    scores_B = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0, 3.0, 4.0])
    s2 = 1 / math.sqrt(2)
    got_BT = _estimate("grpo", scores_B, torch.tensor([7, 7, 7, 7, 2, 2, 9]), T=3)
    assert_close(got_BT, torch.tensor([0.5, -1.5, 0.5, 0.5, s2, -s2, 0.0]).unsqueeze(1).expand(7, 3))


def test_dr_grpo_and_rloo() -> None:
    """rewards [1, 0, 1, 1]: Dr. GRPO r - 0.75 = [.25, -.75, .25, .25].
    RLOO baselines (others' mean): [2/3, 1, 2/3, 2/3] -> [1/3, -1, 1/3, 1/3] (= 4/3 of Dr. GRPO's).
    A group of one has no other sample to compare with: RLOO gives it 0, and a config whose group size is 1 is
    rejected before it runs."""
    rewards_PG = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    assert_close(_per_row("dr_grpo", rewards_PG), torch.tensor([[0.25, -0.75, 0.25, 0.25]]))
    assert_close(_per_row("rloo", rewards_PG), torch.tensor([[1 / 3, -1.0, 1 / 3, 1 / 3]]))
    assert_close(_per_row("rloo", torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))
    (issue,) = preset_config("rloo").check(1)
    assert "adv_estimator='rloo' compares samples of a prompt" in issue.message


def test_rloo_group_one_member_short() -> None:
    """An agentic group that lost an env: ids [0, 0, 0, 1, 1] with rewards [1, 0, 0, 4, 2]. Group 0: baselines
    [0, 0.5, 0.5] -> [1, -0.5, -0.5]; group 1 alone: 4 - 2 = 2 and 2 - 4 = -2."""
    out = _estimate("rloo", torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0]), torch.tensor([0, 0, 0, 1, 1]))[:, 0]
    assert_close(out, torch.tensor([1.0, -0.5, -0.5, 2.0, -2.0]))


def test_reinforce_pp_baseline_golden() -> None:
    """rewards_PG [[1, 0], [1, 1]] -> minus group mean [0.5, -0.5, 0, 0]; response lengths 2, 1, 2, 1 give
    token values [.5, .5, -.5, 0, 0, 0]: mean 1/12, deviations [5, 5, -7, -1, -1, -1]/12,
    sum of squares 102/144, Bessel var 102/720."""
    mask_BT = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 1.0, 1.0]), mask_BT, group_ids_B=layout_group_ids(2, 2))
    got = estimate_advantages("reinforce_pp_baseline", inputs, EstimatorParams()).advantages_BT
    std = math.sqrt(102 / 720)
    expected = torch.tensor([[5.0, 5.0], [-7.0, 0.0], [-1.0, -1.0], [-1.0, 0.0]]) / 12 / std
    assert_close(got, expected * mask_BT)


def test_gigpo() -> None:
    """Episode returns [1, 0, 1, 1] in one group -> [.5, -1.5, .5, .5]. Step returns [2, 0, 1, 1] with anchor
    groups [a, a, b, c] -> [1/sqrt2, -1/sqrt2, 0, 0]. With omega 0.5 the sum is
    [.5 + .5/sqrt2, -1.5 - .5/sqrt2, .5, .5]. Without step rows GiGPO says what it needs."""
    mask_BT = torch.ones(4, 2)
    inputs = AdvantageInputs(
        torch.tensor([1.0, 0.0, 1.0, 1.0]), mask_BT, group_ids_B=torch.zeros(4, dtype=torch.long),
        step_returns_B=torch.tensor([2.0, 0.0, 1.0, 1.0]), anchor_ids_B=torch.tensor([0, 0, 1, 2]),
    )  # fmt: skip
    got = estimate_advantages("gigpo", inputs, EstimatorParams(step_weight=0.5)).advantages_BT
    h = 0.5 / math.sqrt(2)
    assert_close(got, expand_to_tokens(torch.tensor([0.5 + h, -1.5 - h, 0.5, 0.5]), mask_BT))
    with pytest.raises(ValueError, match="step_returns_B and anchor_ids_B"):
        estimate_advantages(
            "gigpo", AdvantageInputs(torch.ones(4), mask_BT, torch.zeros(4)), EstimatorParams()
        )


@pytest.mark.parametrize("G", [3, 6, 7, 8, 12])
@pytest.mark.parametrize("value", [0.1, 0.3, 0.9, -0.2])
def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(G: int, value: float) -> None:
    """The float32 mean of G rewards of 0.3 is not 0.3 (for G = 8 it is 3e-8 off), and ``/ (std + 1e-6)`` made
    that rounding an advantage of +-0.03; a group that carries no signal must give 0, exactly. A mixed group
    beside it keeps its usual values."""
    rewards_PG = torch.tensor([[value] * G, [0.0] * (G - 1) + [1.0]])
    for name in ("grpo", "dr_grpo", "rloo"):
        adv_PG = _per_row(name, rewards_PG)
        assert torch.equal(adv_PG[0], torch.zeros(G)), name
        assert adv_PG[1, -1] > 0 > adv_PG[1, 0], name


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_a_group_is_its_ids_not_its_rows_position(name: str) -> None:
    """Rows shuffled, ids shuffled with them: each row gets the advantage it had in RLVR's prompt-major layout."""
    g = torch.Generator().manual_seed(0)
    rewards_B = torch.randint(0, 3, (12,), generator=g).float()
    layout = _estimate(name, rewards_B, layout_group_ids(4, 3))
    perm = torch.randperm(12, generator=g)
    shuffled = _estimate(name, rewards_B[perm], layout_group_ids(4, 3)[perm])
    assert_close(shuffled, layout[perm], atol=1e-6, rtol=0)


def test_agentic_and_rlvr_give_the_same_numbers_golden() -> None:
    """Group-normalized rewards then RLOO, for rewards [1, 0, 0] of one group. Normalization (population std):
    mean 1/3, std sqrt(2/9) = 0.4714, so r' = [sqrt(2), -1/sqrt(2), -1/sqrt(2)]. RLOO: sqrt(2) - mean(-0.7071,
    -0.7071) = 2.1213; -0.7071 - mean(1.4142, -0.7071) = -1.0607 (twice). RLVR's rows (its ``[P, G]`` layout as
    ids) and agentic's rows (env-seed ids, last row first) give these numbers through the same normalization and
    estimator."""
    want_B = torch.tensor([2.1213, -1.0607, -1.0607])
    rewards_B = torch.tensor([1.0, 0.0, 0.0])
    rlvr_ids = layout_group_ids(1, 3)
    rlvr_norm_B = normalize_rewards(rewards_B, mode="group", group_ids_B=rlvr_ids)
    rlvr_B = _estimate("rloo", rlvr_norm_B, rlvr_ids)[:, 0]
    agentic_ids, order = torch.tensor([7, 7, 7]), torch.tensor([2, 0, 1])  # agentic ids: any integers
    agentic_norm_B = normalize_rewards(rewards_B[order], mode="group", group_ids_B=agentic_ids)
    agentic_B = _estimate("rloo", agentic_norm_B, agentic_ids)[:, 0]
    assert_close(rlvr_B, want_B, atol=1e-4, rtol=0)
    assert_close(agentic_B, want_B[order], atol=1e-4, rtol=0)


def test_kl_in_the_reward_and_clip() -> None:
    """Outcome estimators take ``kl_coef * sum_t kl_t`` off the reward: rewards [1, 1], KL sums [0, 2], coef 0.5
    -> [1, 0]; Dr. GRPO: [0.5, -0.5]; clip 0.25 -> [0.25, -0.25] on the two masked-in tokens, 0 elsewhere."""
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    kl_BT = torch.tensor([[0.0, 0.0, 9.0], [1.0, 1.0, 9.0]])  # the 9s sit off the mask and are ignored
    inputs = AdvantageInputs(torch.ones(2), mask_BT, group_ids_B=torch.zeros(2), kl_BT=kl_BT)
    out = estimate_advantages("dr_grpo", inputs, EstimatorParams(kl_coef=0.5, clip=0.25)).advantages_BT
    assert_close(out, torch.tensor([[0.25, 0.25, 0.0], [-0.25, -0.25, 0.0]]))


# ---------------------------------------------------------------------------------------- token estimators


def test_gae_golden() -> None:
    """gamma 0.9, lambda 0.8 (gamma*lambda 0.72), rewards [0, 0, 1] (the outcome 1 on the last trained token),
    values [0.2, 0.4, 0.6]:

    t=2: delta = 1 + 0.9*0 - 0.6 = 0.4;          A2 = 0.4
    t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14;       A1 = 0.14 + 0.72*0.4 = 0.428
    t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16;       A0 = 0.16 + 0.72*0.428 = 0.46816
    returns = A + V = [0.66816, 0.828, 1.0]. A padded 4th token (reward 5, value 9) changes nothing, gets 0.
    """
    inputs = AdvantageInputs(
        torch.zeros(1), torch.tensor([[1, 1, 1, 0]]), values_BT=torch.tensor([[0.2, 0.4, 0.6, 9.0]]),
        token_rewards_BT=torch.tensor([[0.0, 0.0, 1.0, 5.0]]),
    )  # fmt: skip
    out = estimate_advantages("gae", inputs, EstimatorParams(gamma=0.9, lam=0.8))
    assert_close(out.advantages_BT, torch.tensor([[0.46816, 0.428, 0.4, 0.0]]))
    assert out.returns_BT is not None
    assert_close(out.returns_BT, torch.tensor([[0.66816, 0.828, 1.0, 0.0]]))


def test_gae_skips_masked_middle_tokens() -> None:
    """mask [1, 0, 1] (an env token in the middle, reward 7, value 99, both ignored):
    t=2: A2 = 1 - 0.6 = 0.4; t=0 sees the next *trained* token: delta = 0.9*0.6 - 0.2 = 0.34,
    A0 = 0.34 + 0.72*0.4 = 0.628."""
    inputs = AdvantageInputs(
        torch.zeros(1), torch.tensor([[1, 0, 1]]), values_BT=torch.tensor([[0.2, 99.0, 0.6]]),
        token_rewards_BT=torch.tensor([[0.0, 7.0, 1.0]]),
    )  # fmt: skip
    out = estimate_advantages("gae", inputs, EstimatorParams(gamma=0.9, lam=0.8))
    assert_close(out.advantages_BT, torch.tensor([[0.628, 0.0, 0.4]]))


def test_gae_lambda_one_is_return_minus_value() -> None:
    """gamma = lambda = 1: A_t = (sum of future rewards) - V_t = 1 - 0.5 for every token; the outcome reward 1
    lands on the last token. ``whiten`` whitens the advantages (all equal: 0) but not the returns."""
    inputs = AdvantageInputs(torch.ones(1), torch.ones(1, 3), values_BT=torch.full((1, 3), 0.5))
    out = estimate_advantages("gae", inputs, EstimatorParams(gamma=1.0, lam=1.0))
    assert_close(out.advantages_BT, torch.full((1, 3), 0.5))
    assert out.returns_BT is not None
    assert_close(out.returns_BT, torch.ones(1, 3))
    whitened = estimate_advantages("gae", inputs, EstimatorParams(gamma=1.0, lam=1.0, whiten=True))
    assert_close(whitened.advantages_BT, torch.zeros(1, 3))
    assert whitened.returns_BT is not None
    assert_close(whitened.returns_BT, torch.ones(1, 3))


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="critic values"):
        estimate_advantages("gae", AdvantageInputs(torch.ones(1), torch.ones(1, 2)), EstimatorParams())


def test_reinforce_pp_golden() -> None:
    """Outcomes [1, 0] on the last trained token, dense rewards [0, -0.1, 0] and [0.5, 0, pad 3]: token rewards
    [0, -0.1, 1] and [0.5, 0, pad]; gamma 1: returns [0.9, 0.9, 1.0] and [0.5, 0.0, 0].

    Whitening over the 5 trained tokens [0.9, 0.9, 1.0, 0.5, 0.0]: mean 0.66, deviations
    [0.24, 0.24, 0.34, -0.16, -0.66], sum of squares 0.692, Bessel var 0.173.
    """
    mask_BT = torch.tensor([[1, 1, 1], [1, 1, 0]])
    dense_BT = torch.tensor([[0.0, -0.1, 0.0], [0.5, 0.0, 3.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), mask_BT, token_rewards_BT=dense_BT)
    out = estimate_advantages("reinforce_pp", inputs, EstimatorParams(gamma=1.0))
    assert out.returns_BT is not None
    assert_close(out.returns_BT, torch.tensor([[0.9, 0.9, 1.0], [0.5, 0.0, 0.0]]))
    expected = torch.tensor([[0.24, 0.24, 0.34], [-0.16, -0.66, 0.0]]) / math.sqrt(0.173)
    assert_close(out.advantages_BT, expected)


def test_reinforce_pp_kl_in_the_reward() -> None:
    """KL in the reward, the path ``kl_mode: reward`` runs: the objective's per-token k1 of the sampler to the
    reference, ``logp - ref_logp`` = [0, -ln2, ln2], comes off the token rewards times ``kl_coef`` 0.1. Outcome
    1 on the last token: token rewards [0, 0.1 ln2, 1 - 0.1 ln2]; gamma 1: returns [1, 1, 1 - 0.1 ln2]. A
    masked last token keeps neither reward nor KL: mask [1, 1, 0] moves the outcome to token 1 -> returns
    [1 + 0.1 ln2, 1 + 0.1 ln2, 0]."""
    ln2 = math.log(2.0)
    logp_BT, ref_BT = torch.tensor([[-1.0, -1.0 - ln2, -1.0 + ln2]]), torch.full((1, 3), -1.0)
    objective = PolicyObjective(preset_config("reinforce_pp", kl_coef=0.1, kl_estimator="k1"))
    for mask, want in (([1, 1, 1], [1.0, 1.0, 1 - 0.1 * ln2]), ([1, 1, 0], [1 + 0.1 * ln2] * 2 + [0.0])):
        batch = Batch({C.OLD_LOGP: logp_BT, C.REF_LOGP: ref_BT, C.RESPONSE_MASK: torch.tensor([mask])})
        kl_BT = objective.sampled_kl_BT(batch)
        inputs = AdvantageInputs(torch.ones(1), batch.tensors[C.RESPONSE_MASK], kl_BT=kl_BT)
        out = estimate_advantages("reinforce_pp", inputs, EstimatorParams(kl_coef=0.1))
        assert out.returns_BT is not None
        assert_close(out.returns_BT, torch.tensor([want]))


# ---------------------------------------------------------------------------------------- shared helpers


def test_discounted_returns_golden() -> None:
    """token rewards [0, -0.1, 1], gamma 0.5: R2 = 1, R1 = -0.1 + 0.5 = 0.4, R0 = 0 + 0.2 = 0.2."""
    got = discounted_returns(torch.tensor([[0.0, -0.1, 1.0]]), torch.ones(1, 3), gamma=0.5)
    assert_close(got, torch.tensor([[0.2, 0.4, 1.0]]))


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


def test_an_empty_mask_row_counts_in_its_group_and_gets_nothing() -> None:
    """An overlong-filtered sample (mask all 0) keeps its reward in its group's statistics: rewards [1, 0, 1, 1]
    as in the GRPO example give [.5, -1.5, .5, .5]; the filtered row 1 gets no advantage on any token."""
    mask_BT = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 1.0, 1.0]), mask_BT, group_ids_B=torch.zeros(4))
    got = estimate_advantages("grpo", inputs, EstimatorParams()).advantages_BT
    assert_close(got, torch.tensor([[0.5, 0.5], [0.0, 0.0], [0.5, 0.0], [0.5, 0.5]]))


def test_group_normalize_population_and_singleton() -> None:
    """``reward_norm: group`` uses the population std: ids [7, 7, 2, 2, 9] with scores [1, 0, 5, 3, 4] ->
    [1, -1, 1, -1] and the singleton 9 -> 0 (std 0, no NaN with eps = 0)."""
    got = group_normalize(
        torch.tensor([1.0, 0.0, 5.0, 3.0, 4.0]), torch.tensor([7, 7, 2, 2, 9]), eps=0.0, unbiased=False
    )
    assert_close(got, torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0]))


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
    group [1, 0 | 3, 5] (ids 0, 0, 1, 1): means .5 and 4, population stds .5 and 1 -> [1, -1, -1, 1].
    tag pools rows by tag: tags a, a, b, b, b hold [1, 0] -> [1, -1] and [0, 4, 2] -> mean 2, population std
    sqrt(8/3), so [-1.2247, 1.2247, 0]."""
    batch = normalize_rewards(torch.tensor([1.0, 0.0, 1.0, 1.0]), mode="batch", eps=0.0)
    assert_close(batch, torch.tensor([1 / R3, -R3, 1 / R3, 1 / R3]))
    ids_B = torch.tensor([0, 0, 1, 1])
    group = normalize_rewards(torch.tensor([1.0, 0.0, 3.0, 5.0]), mode="group", group_ids_B=ids_B, eps=0.0)
    assert_close(group, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="group ids"):
        normalize_rewards(torch.tensor([1.0, 0.0]), mode="group")
    tagged = normalize_rewards(
        torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0]), mode="tag", tags=["a", "a", "b", "b", "b"]
    )
    assert_close(tagged, torch.tensor([1.0, -1.0, -1.2247, 1.2247, 0.0]), atol=1e-4, rtol=0)
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
