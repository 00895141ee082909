"""reasoning-gym tasks as RLVR data (``path: "reasoning_gym:<task>"``) scored by the suite's own checker.

In ``tests/extras`` (the per-package CI installs roll-data and roll-pipelines without the extra). Unit-speed after
reasoning-gym's import (several seconds, cold).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import reasoning_gym
import yaml

from roll.core.cli import load_run_config
from roll.core.errors import DataError
from roll.data.config import DatasetSourceConfig
from roll.data.loading import load_source
from roll.pipelines.rewards.reasoning_gym import ReasoningGymReward
from roll.pipelines.rewards.types import RewardRequest

ROOT = Path(__file__).resolve().parents[2]
ONE_DIGIT_PAIRS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def rows(**kw: object) -> list[dict]:
    src = DatasetSourceConfig(
        path="reasoning_gym:chain_sum", builtin_kind=kw.pop("kind", "rl"), max_samples=kw.pop("n", 12), **kw
    )
    return [dict(r) for r in load_source(src, seed=5)]


def test_rows_carry_the_entry_and_match_the_arithmetic() -> None:
    """Each ground truth is the suite's entry; its answer is the value of the expression it shows."""
    got = rows(builtin_options=ONE_DIGIT_PAIRS)
    assert len(got) == 12 and {r["tag"] for r in got} == {"reasoning_gym"}
    for row in got:
        entry = json.loads(row["ground_truth"])
        assert entry["task"] == "chain_sum" and row["prompt"] == row["messages"][0]["content"]
        expression = entry["metadata"]["expression"]
        assert len(expression.split()) == 3 and int(entry["answer"]) == eval(expression)  # a op b, one digit
    assert got == rows(builtin_options=ONE_DIGIT_PAIRS)  # same seed, same rows
    held = rows(builtin_options=ONE_DIGIT_PAIRS, split="eval")
    assert {r["prompt"] for r in held} != {r["prompt"] for r in got}


def test_difficulty_is_the_curriculum_level() -> None:
    """chain_sum's curriculum: level 0 is 2 terms of 1 digit; level 3 allows up to 5 terms of up to 4 digits."""
    easy = [json.loads(r["ground_truth"])["metadata"] for r in rows(difficulty=0, n=20)]
    hard = [json.loads(r["ground_truth"])["metadata"] for r in rows(difficulty=3, n=20)]
    assert {(m["num_terms"], m["num_digits"]) for m in easy} == {(2, 1)}
    assert max(m["num_terms"] for m in hard) > 2 and max(m["num_digits"] for m in hard) > 1
    with pytest.raises(DataError, match="has no task 'no_such_task'"):
        load_source(DatasetSourceConfig(path="reasoning_gym:no_such_task", max_samples=2))


def test_reward_uses_the_suites_checker() -> None:
    """The SFT answer of a row scores 1 (format round trip), a wrong number 0, as score_answer says."""
    sft = rows(kind="sft", builtin_options=ONE_DIGIT_PAIRS, n=4)
    reward = ReasoningGymReward()
    truth = sft[0]["ground_truth"]
    entry = json.loads(truth)
    wrong = str(int(entry["answer"]) + 1)
    results = reward.score(
        [
            RewardRequest(sft[0]["messages"][1]["content"], ground_truth=truth),
            RewardRequest(f"I think the answer is {wrong}.", ground_truth=truth),
            RewardRequest("no idea", ground_truth=truth),
            RewardRequest("The answer is 3.", ground_truth="3"),
        ]
    )
    score_answer = reasoning_gym.get_score_answer_fn("chain_sum")
    assert results[0].score == score_answer(entry["answer"], entry) == 1.0 and results[0].info["correct"]
    assert results[1].score == score_answer(wrong, entry) == 0.0
    assert results[2].info["error"] == "no answer found"
    assert "not a reasoning_gym entry" in results[3].info["error"]


def test_example_passes_preflight() -> None:
    spec, config = load_run_config(ROOT / "examples" / "rlvr_reasoning_gym.yaml", [], preflight=True)
    assert spec.name == "rlvr" and config.rewards["reasoning_gym"].type == "reasoning_gym"
    data = yaml.safe_load((ROOT / "examples" / "rlvr_reasoning_gym.yaml").read_text())
    assert data["data"]["sources"][0]["path"] == "reasoning_gym:chain_sum"
