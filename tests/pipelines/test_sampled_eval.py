"""Sampled validation in the RL modes: mean@k, the unbiased pass@k estimator and maj@k (golden values by hand),
the config check, and a real run of the quickstart's tiny model that evaluates with k = 4 samples per prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.pipelines.common.sampled_eval import majority_correct, pass_at_k, sampled_metrics, vote_key
from roll.pipelines.rlvr import SPEC, RLVRConfig
from roll.pipelines.rlvr.config import ValidationConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def test_pass_at_k_golden() -> None:
    """1 - C(n - c, k) / C(n, k): n=4, c=1, k=2: 1 - 3/6 = 1/2; n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10;
    no correct answer: 0; k = n: 1 as soon as one is correct; k = 1: c / n."""
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_sampled_metrics_golden() -> None:
    """Two prompts, k = 4.
    Prompt 0: correct [T, F, F, F], answers 7 8 8 9: mean 1/4; the majority says 8, wrong: maj 0;
    pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, pass@4 = 1.
    Prompt 1: correct [T, T, F, F], answers 5 5 6 7: mean 1/2; majority 5, right: maj 1;
    pass@1 = 1/2, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1.
    Means over prompts: mean@4 3/8, maj@4 1/2, pass@1 3/8, pass@2 (1/2 + 5/6) / 2 = 2/3, pass@4 1."""
    correct = [[True, False, False, False], [True, True, False, False]]
    keys = [["7", "8", "8", "9"], ["5", "5", "6", "7"]]
    out = sampled_metrics(correct, keys, prefix="x/")
    expected = {"x/mean@4": 3 / 8, "x/maj@4": 0.5, "x/pass@1": 3 / 8, "x/pass@2": 2 / 3, "x/pass@4": 1.0}
    assert sorted(out) == sorted(expected)
    for name, value in expected.items():
        assert out[name] == pytest.approx(value), name
    assert out["x/pass@4"] >= out["x/mean@4"]


def test_majority_vote_keys_and_ties() -> None:
    """A tie goes to the answer given first; the reward's extracted answer votes, else the normalized text."""
    assert majority_correct(["a", "b"], [False, True]) is False
    assert majority_correct(["b", "a", "a"], [False, True, True]) is True
    assert vote_key("7", "The answer is 7.") == "7"
    assert vote_key(None, "  The answer\n is 7. ") == "The answer is 7."


def test_sampled_validation_needs_a_temperature() -> None:
    with pytest.raises(ValueError, match="greedy answers would all be the same"):
        ValidationConfig(samples_per_prompt=4)
    assert ValidationConfig(samples_per_prompt=4, temperature=1.0).samples_per_prompt == 4
    assert ValidationConfig().samples_per_prompt == 1  # greedy, k = 1, by default


@pytest.mark.slow
def test_sampled_validation_in_a_real_run(ray_local: Any, tmp_path: Path) -> None:
    """The quickstart (a short warm-up, one RL step) evaluated with 4 samples per prompt at temperature 1: mean@4,
    pass@4 and maj@4 are logged overall and for the arithmetic domain, pass@4 >= pass@2 >= mean@4 = pass@1, and the
    evaluation is seeded per request: evaluating again on the same weights gives the same numbers."""
    overrides = [
        f"output_dir={tmp_path}", "max_steps=1", "warmup.steps=40", "eval_every=1", "plot=false",
        "tracking.backends=[jsonl]", "tracking.progress=false", "ray.address=auto", "ray.num_cpus=null",
        "batch.prompts_per_step=8", "batch.micro_batch_samples=64", "rollout.request_prompts=8",
        "validation.samples_per_prompt=4", "validation.temperature=1.0",
    ]  # fmt: skip
    cfg = validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
        again = pipeline.recipe.evaluate(1)
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r["metrics"] for r in rows if "eval/mean@4" in r["metrics"]]
    assert evals, "no sampled validation logged"
    m = evals[-1]
    for name in ("mean@4", "pass@1", "pass@2", "pass@4", "maj@4"):
        assert f"eval/{name}" in m and f"eval/domain/arithmetic/{name}" in m, (name, sorted(m))
    assert m["eval/pass@4"] >= m["eval/pass@2"] >= m["eval/mean@4"]
    assert m["eval/mean@4"] == pytest.approx(m["eval/pass@1"]) == pytest.approx(m["eval/accuracy"])
    assert m["eval/pass@4"] > 0, "the warmed-up model never answered right: the check would be vacuous"
    assert {k: again[k.removeprefix("eval/")] for k in m if k.startswith("eval/")} == {
        k: v for k, v in m.items() if k.startswith("eval/")
    }
