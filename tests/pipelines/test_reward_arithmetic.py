"""The arithmetic reward delegates to the built-in task's own ``verify``."""

from __future__ import annotations

from roll.core import plugins
from roll.core.types import RewardSpec
from roll.pipelines.rewards.arithmetic import ArithmeticReward
from roll.pipelines.rewards.config import ArithmeticRewardConfig
from roll.pipelines.rewards.specs import ARITHMETIC
from roll.pipelines.rewards.types import RewardFunction, RewardRequest


def test_exact_match_scores() -> None:
    reward = ArithmeticReward()
    results = reward.score(
        [
            RewardRequest("The answer is 68.", ground_truth="68"),
            RewardRequest("The answer is 67.", ground_truth="68"),
            RewardRequest("I think 12 then 068", ground_truth="68"),  # fallback: the last integer, by value
            RewardRequest("no idea", ground_truth="68"),
        ]
    )
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert results[0].info == {"correct": True, "answer": "68"}


def test_bad_ground_truth_scores_zero_with_error() -> None:
    (result,) = ArithmeticReward().score([RewardRequest("The answer is 3.", ground_truth="three")])
    assert result.score == 0.0 and "three" in result.info["error"]


def test_spec_builds_a_reward_function() -> None:
    """The ``roll.reward`` entry points (roll-pipelines' pyproject) name these specs; each is a RewardSpec."""
    specs = plugins.load_all("roll.reward")
    assert set(specs) == {
        "math",
        "code_sandbox",
        "llm_judge",
        "ifeval",
        "arithmetic",
        "python",
        "exact_match",
        "reasoning_gym",
        "reward_model",
        "llm_judge_local",
    }
    assert all(isinstance(spec, RewardSpec) for spec in specs.values())
    reward = ARITHMETIC.build(ArithmeticRewardConfig())
    assert isinstance(reward, RewardFunction)
    assert reward.score([RewardRequest("The answer is 2.", ground_truth="2")])[0].score == 1.0
