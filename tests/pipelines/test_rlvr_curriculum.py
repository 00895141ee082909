"""``rlvr`` with a curriculum: the built-in arithmetic task's level rises during a run once accuracy passes.

The quickstart made small: a short warm-up on level-0 sums, then GRPO steps in hybrid placement (one policy
actor) on the session's Ray. The logged ``curriculum/level`` must rise and must be exactly what the rule
(:class:`~roll.data.procedural.AccuracyCurriculum`) makes of the logged accuracies, the feed's level pools
must have served ``prompts_per_step`` prompts per step spent at each level, and the pipeline's checkpoint state
must hold the level reached.

Measured (seed 0): accuracy 0.062, 0.047, 0.062, 0.000 over the 4 steps, levels 0, 1, 1, 2 (and 2 next). Took 226 s
on the 2 shared cores under load 30-46 (not measured on a quiet box).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.data.procedural import AccuracyCurriculum
from roll.pipelines.rlvr import SPEC, RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
P, STEPS, THRESHOLD, WINDOW = 16, 4, 0.05, 1


@pytest.mark.slow
def test_difficulty_rises_when_accuracy_passes(ray_local: Any, tmp_path: Path) -> None:
    overrides = [
        f"output_dir={tmp_path}",
        "placement=hybrid",
        f"max_steps={STEPS}",
        "eval_every=0",
        "plot=false",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
        "ray.address=auto",
        "ray.num_cpus=null",
        f"batch.prompts_per_step={P}",
        "batch.samples_per_prompt=4",
        "batch.micro_batch_samples=64",
        "warmup.steps=30",
        "data.sources.0.builtin_options={}",
        "data.sources.0.max_samples=80",  # level 0 has 100 one-digit sums, 83 of them in the train split
        "warmup.data.sources.0.builtin_options={level: 0}",  # the warm-up this was measured with (the quickstart's
        "warmup.data.sources.0.max_samples=80",  # before it moved to three-term sums)
        f"curriculum={{levels: 3, threshold: {THRESHOLD}, window: {WINDOW}}}",
    ]
    cfg = validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
        state = pipeline.recipe.state()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in rows if r["step"] > 0 and "curriculum/level" in r["metrics"]]
    levels = [int(s["curriculum/level"]) for s in steps]
    accuracy = [s["reward/accuracy"] for s in steps]
    rule = AccuracyCurriculum(max_level=2, threshold=THRESHOLD, window=WINDOW)
    expected = [0] + [rule.observe(a) for a in accuracy]
    assert len(steps) == STEPS and levels == expected[:-1]
    assert levels[-1] > levels[0] == 0, f"the level never rose: accuracy {accuracy}"
    feed = state["feeder"]
    assert feed["rule"]["level"] == expected[-1]
    served = [feeder["epoch"] * 80 + feeder["position"] for feeder in feed["feeders"]]
    assert served == [P * levels.count(level) for level in range(3)]
