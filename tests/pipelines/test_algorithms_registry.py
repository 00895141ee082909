"""The algorithm registries and the one ``estimate_advantages`` that rlvr, agentic and on-policy distill share."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from roll.core import columns as C
from roll.core.errors import ConfigError
from roll.pipelines.algorithms import advantages as adv
from roll.pipelines.algorithms.estimators import (
    AdvantageInputs,
    EstimatorParams,
    estimate_advantages,
    layout_group_ids,
    normalize_rewards,
)
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.algorithms.registry import ESTIMATORS, POLICY_LOSSES
from roll.workers.types import ForwardOutput

EXAMPLES = Path(__file__).parents[2] / "examples"
S = 1 / math.sqrt(3)  # 0.57735


def _estimate(name: str, rewards_B: torch.Tensor, groups_B: torch.Tensor, T: int = 2) -> torch.Tensor:
    inputs = AdvantageInputs(rewards_B, torch.ones(len(rewards_B), T), group_ids_B=groups_B)
    return estimate_advantages(name, inputs, EstimatorParams()).advantages_BT


def test_grpo_on_rlvr_layout_ids_golden() -> None:
    """Rewards [1, 0, 0 | 2, 2, 5], groups of 3. Group 0: mean 1/3, deviations 2/3, -1/3, -1/3, Bessel std
    sqrt((4/9 + 1/9 + 1/9) / 2) = 1/sqrt(3), so A = 2/sqrt(3), -1/sqrt(3), -1/sqrt(3). Group 1: mean 3,
    deviations -1, -1, 2, std sqrt(6 / 2) = sqrt(3), so A = -1/sqrt(3), -1/sqrt(3), 2/sqrt(3)."""
    rewards_B = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    groups_B = layout_group_ids(2, 3)
    assert groups_B.tolist() == [0, 0, 0, 1, 1, 1]
    want_B = torch.tensor([2 * S, -S, -S, -S, -S, 2 * S])
    torch.testing.assert_close(_estimate("grpo", rewards_B, groups_B)[:, 0], want_B, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_rlvr_layout_and_id_groups_give_identical_advantages(name: str) -> None:
    """RLVR's ``[P, G]`` functions and the id path agree, and so do the ids in any row order (rows shuffled,
    ids shuffled with them): a group is its ids, not its position."""
    g = torch.Generator().manual_seed(0)
    rewards_PG = torch.randint(0, 3, (4, 3), generator=g).float()
    mask_BT = torch.ones(12, 2)
    layout = {
        "grpo": lambda r: adv.expand_to_tokens(adv.grpo_advantages(r).reshape(-1), mask_BT),
        "dr_grpo": lambda r: adv.expand_to_tokens(adv.dr_grpo_advantages(r).reshape(-1), mask_BT),
        "rloo": lambda r: adv.expand_to_tokens(adv.rloo_advantages(r).reshape(-1), mask_BT),
        "reinforce_pp_baseline": lambda r: adv.reinforce_pp_baseline_advantages(r, mask_BT),
    }[name](rewards_PG)
    ids = _estimate(name, rewards_PG.reshape(-1), layout_group_ids(4, 3))
    torch.testing.assert_close(ids, layout, atol=1e-6, rtol=0)
    perm = torch.randperm(12, generator=g)
    shuffled = _estimate(name, rewards_PG.reshape(-1)[perm], layout_group_ids(4, 3)[perm])
    torch.testing.assert_close(shuffled, layout[perm], atol=1e-6, rtol=0)


def test_agentic_and_rlvr_give_the_same_numbers_golden() -> None:
    """Group-normalized rewards then RLOO, for rewards [1, 0, 0] of one group. Normalization (population std):
    mean 1/3, std sqrt(2/9) = 0.4714, so r' = [sqrt(2), -1/sqrt(2), -1/sqrt(2)]. RLOO: sqrt(2) - mean(-0.7071,
    -0.7071) = 2.1213; -0.7071 - mean(1.4142, -0.7071) = -1.0607 (twice). RLVR's rows (its ``[P, G]`` layout as
    ids; also the ``[P, G]`` RLOO of the normalized rewards) and agentic's rows (env-seed ids, last row first)
    give these numbers through the same normalization and estimator."""
    want_B = torch.tensor([2.1213, -1.0607, -1.0607])
    rewards_B = torch.tensor([1.0, 0.0, 0.0])
    rlvr_ids = layout_group_ids(1, 3)
    rlvr_norm_B = normalize_rewards(rewards_B, mode="group", group_ids_B=rlvr_ids)
    rlvr_B = _estimate("rloo", rlvr_norm_B, rlvr_ids)[:, 0]
    layout_B = adv.rloo_advantages(rlvr_norm_B.reshape(1, 3)).reshape(-1)
    agentic_ids, order = torch.tensor([7, 7, 7]), torch.tensor([2, 0, 1])  # agentic ids: any integers
    agentic_norm_B = normalize_rewards(rewards_B[order], mode="group", group_ids_B=agentic_ids)
    agentic_B = _estimate("rloo", agentic_norm_B, agentic_ids)[:, 0]
    torch.testing.assert_close(rlvr_B, want_B, atol=1e-4, rtol=0)
    torch.testing.assert_close(layout_B, want_B, atol=1e-4, rtol=0)
    torch.testing.assert_close(agentic_B, want_B[order], atol=1e-4, rtol=0)


def test_a_group_one_member_short_and_tag_normalization() -> None:
    """An agentic group that lost an env: ids [0, 0, 0, 1, 1] with rewards [1, 0, 0, 4, 2]. Group 1 alone:
    RLOO gives 4 - 2 = 2 and 2 - 4 = -2. Tag normalization pools rows by tag: tags a, a, b, b, b hold [1, 0] ->
    [1, -1] and [0, 4, 2] -> mean 2, population std sqrt(8/3), so [-1.2247, 1.2247, 0]."""
    rewards_B = torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0])
    out = _estimate("rloo", rewards_B, torch.tensor([0, 0, 0, 1, 1]))[:, 0]
    torch.testing.assert_close(out[3:], torch.tensor([2.0, -2.0]))
    tagged = normalize_rewards(rewards_B, mode="tag", tags=["a", "a", "b", "b", "b"])
    torch.testing.assert_close(tagged, torch.tensor([1.0, -1.0, -1.2247, 1.2247, 0.0]), atol=1e-4, rtol=0)


def test_kl_in_the_reward_and_clip() -> None:
    """Outcome estimators take ``kl_coef * sum_t kl_t`` off the reward: rewards [1, 1], KL sums [0, 2], coef 0.5
    -> [1, 0]; Dr. GRPO: [0.5, -0.5]; clip 0.25 -> [0.25, -0.25] on the two masked-in tokens, 0 elsewhere."""
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    kl_BT = torch.tensor([[0.0, 0.0, 9.0], [1.0, 1.0, 9.0]])  # the 9s sit off the mask and are ignored
    inputs = AdvantageInputs(torch.ones(2), mask_BT, group_ids_B=torch.zeros(2), kl_BT=kl_BT)
    out = estimate_advantages("dr_grpo", inputs, EstimatorParams(kl_coef=0.5, clip=0.25)).advantages_BT
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.25, 0.0], [-0.25, -0.25, 0.0]]))


def test_gae_needs_values_and_returns_them() -> None:
    with pytest.raises(ValueError, match="critic values"):
        estimate_advantages("gae", AdvantageInputs(torch.ones(1), torch.ones(1, 2)), EstimatorParams())
    inputs = AdvantageInputs(torch.ones(1), torch.ones(1, 2), values_BT=torch.zeros(1, 2))
    out = estimate_advantages("gae", inputs, EstimatorParams(lam=1.0))
    # zero values, gamma = lam = 1: the advantage of each token is the outcome 1 on the last token
    torch.testing.assert_close(out.advantages_BT, torch.ones(1, 2))
    assert out.returns_BT is not None


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown advantage estimator 'ppo2'[\s\S]*gae: [\s\S]*gigpo: "):
        estimate_advantages("ppo2", AdvantageInputs(torch.ones(1), torch.ones(1, 1)), EstimatorParams())
    with pytest.raises(ConfigError, match=r"unknown policy loss 'a2c'[\s\S]*ppo: [\s\S]*topr: "):
        POLICY_LOSSES.entry("a2c")
    assert ESTIMATORS.entry("gae").needs == {"critic"} and "groups" in ESTIMATORS.entry("rloo").needs


def test_pipelines_reject_an_unsupported_estimator_with_the_generated_message() -> None:
    from roll.core.config.loader import load_config
    from roll.pipelines.rlvr import RLVRConfig

    with pytest.raises(ConfigError) as rlvr:
        load_config(EXAMPLES / "quickstart.yaml", ["algorithm.adv_estimator=gigpo"], model=RLVRConfig)
    text = str(rlvr.value)
    assert "advantage estimator 'gigpo' is not supported by the rlvr pipeline (it needs groups)" in text
    assert ESTIMATORS.entry("rloo").line() in text  # the supported ones, with their descriptions


@pytest.mark.parametrize("loss_type", POLICY_LOSSES.names)
def test_policy_loss_applies_tis_for_every_loss_type(loss_type: str) -> None:
    """The shared PolicyLoss (rlvr and agentic) reads ``infer_logp_BT`` when ``tis_cap`` is set: trainer and
    sampler log-probs differ by log 4 per token, so the weight exp(log 4) = 4 is capped at 2 everywhere
    (``tis_mean`` 2, ``tis_clip_frac`` 1). Without the column no TIS metric appears."""
    algo = preset_config("grpo", kl_mode="none", kl_coef=0.0, loss_type=loss_type, tis_cap=2.0)
    loss_fn = PolicyLoss(algo, norm_len=2, use_old_logp=False)
    logp_BT = torch.full((2, 2), -1.0, requires_grad=True)
    mb = {C.RESPONSE_MASK: torch.ones(2, 2), C.ADVANTAGES: torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
          C.INFER_LOGP: torch.full((2, 2), -1.0 - math.log(4.0))}  # fmt: skip
    _, metrics = loss_fn(ForwardOutput(logp_BT), mb)
    assert float(metrics["tis_mean"]) == pytest.approx(2.0) and float(metrics["tis_clip_frac"]) == 1.0
    _, plain = loss_fn(ForwardOutput(logp_BT), {k: v for k, v in mb.items() if k != C.INFER_LOGP})
    assert "tis_mean" not in plain
