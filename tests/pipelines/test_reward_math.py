"""Math reward: extraction, math-verify equivalence, format weight, and the kill-on-timeout pool.

``9^{9^{9^{9}}}`` makes sympy try to evaluate a tower of powers, which does not finish in minutes: it stands in
for the pathological expressions that must not hang a reward worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from roll.pipelines.rewards.config import MathRewardConfig
from roll.pipelines.rewards.math import MathReward, final_answer_text, has_think_format, last_boxed
from roll.pipelines.rewards.types import RewardRequest, RewardResult


@pytest.fixture(scope="module")
def reward() -> Iterator[MathReward]:
    with MathReward(MathRewardConfig(timeout_s=1.5, format_weight=0.5, num_workers=2)) as built:
        yield built


def test_extraction_helpers() -> None:
    text = "<think>maybe \\boxed{1}</think> so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}}"
    assert final_answer_text(text) == " so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}}"
    assert last_boxed(final_answer_text(text)) == "x^{2}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None
    assert has_think_format("<think>a</think> 42") and not has_think_format("<think>a</think>  ")
    assert not has_think_format("42")


def _score_in_thread(reward: MathReward, requests: list[RewardRequest]) -> list[RewardResult]:
    """Reward workers call from threads, where math-verify's own signal-based timeout would raise."""
    out: list[list[RewardResult]] = []
    worker = threading.Thread(target=lambda: out.append(reward.score(requests)))
    worker.start()
    worker.join(timeout=60)
    assert out, "scoring from a non-main thread did not finish"
    return out[0]


def test_scores_from_a_non_main_thread_and_survives_a_hanging_item(reward: MathReward) -> None:
    requests = [
        RewardRequest("<think>1/2</think> The answer is \\boxed{\\frac{1}{2}}", ground_truth="0.5"),
        RewardRequest("\\boxed{3}", ground_truth="4"),
        RewardRequest("<think>big</think> \\boxed{9^{9^{9^{9}}}}", ground_truth="1"),
        RewardRequest("<think>\\boxed{0}</think> \\boxed{x^2+2x+1}", ground_truth="(x+1)^2"),
        RewardRequest("no answer at all", ground_truth="7"),
    ]
    started = time.monotonic()
    results = _score_in_thread(reward, requests)
    elapsed = time.monotonic() - started
    assert [r.score for r in results] == [1.5, 0.0, 0.5, 1.5, 0.0]
    assert results[0].info["correct"] and results[0].info["format"]
    assert results[2].info == {
        "correct": False,
        "format": True,
        "answer": "9^{9^{9^{9}}}",
        "error": "timeout",
    }
    assert results[3].info["answer"] == "x^2+2x+1"  # after </think>, not the boxed 0 inside it
    assert reward.restarts >= 1
    assert elapsed < 20, elapsed
    # The pool is healthy again after the kill.
    again = _score_in_thread(reward, [RewardRequest("\\boxed{2}", ground_truth="2")])
    assert again[0].info["correct"]


def test_a_response_that_merely_contains_the_number_does_not_score(reward: MathReward) -> None:
    """Without a box only the last line counts, taken whole; math-verify alone reads 'xx 18 yy 16>' as 16."""
    requests = [
        RewardRequest("xx 18 yy 16>", ground_truth="16"),
        RewardRequest("I got 18, no wait, 16", ground_truth="16"),
        RewardRequest("\\boxed{xx 18 yy 16}", ground_truth="16"),
        RewardRequest("Some work.\nThe answer is 16.", ground_truth="16"),
        RewardRequest("Answer: $\\frac{1}{2}$", ground_truth="0.5"),
        RewardRequest("\\boxed{16 \\text{ apples}}", ground_truth="16"),
    ]
    results = _score_in_thread(reward, requests)
    assert [r.info["correct"] for r in results] == [False, False, False, True, True, True]
    assert [r.info.get("error") for r in results[:3]] == [
        "not a bare answer",
        "not a bare answer",
        "not a bare answer",
    ]
    assert results[3].info["answer"] == "16"


@pytest.mark.parametrize(("no_box", "expected"), [("zero", [False, False]), ("anywhere", [True, True])])
def test_the_no_box_fallback_is_configurable(no_box: str, expected: list[bool]) -> None:
    config = MathRewardConfig(timeout_s=5.0, num_workers=1, no_box=no_box)  # type: ignore[arg-type]
    with MathReward(config) as reward:
        results = _score_in_thread(
            reward, [RewardRequest("xx 18 yy 16>", ground_truth="16"), RewardRequest("16", ground_truth="16")]
        )
    assert [r.info["correct"] for r in results] == expected
    if no_box == "zero":
        assert results[1].info["error"] == "no boxed answer"
