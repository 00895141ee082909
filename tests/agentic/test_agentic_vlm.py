"""A vision-language agent on image-observation FrozenLake (examples/agentic_vlm_frozen_lake.yaml, tiny-vl-1m):
the example validates, and a short run (warm-up, 2 RL steps) goes through rollout, log-probs and training with
the lake's pictures."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline.agentic import SPEC as AGENTIC
from roll.agentic.pipeline.agentic import AgenticConfig
from roll.core import columns as C
from roll.core.config.loader import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agentic_vlm_frozen_lake.yaml"


def test_example_validates() -> None:
    config = load_config(EXAMPLE, [], model=AgenticConfig)
    assert config.policy_model.path == "tiny-vl-1m"
    [env] = config.env_manager.envs
    assert env.type == "frozen_lake" and env.options["observation"] == "image"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_steps_on_image_frozen_lake(ray_local: Any, tmp_path: Path) -> None:
    overrides = [
        f"output_dir={tmp_path}",
        "max_steps=2",
        "eval_every=0",
        "batch.prompts_per_step=2",
        "batch.samples_per_prompt=4",
        "batch.micro_batch_samples=8",
        "env_manager.extra_groups=0",
        "warmup.steps=2",
        "warmup.batch_size=8",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
    ]
    config = load_config(EXAMPLE, overrides, model=AgenticConfig)
    pipeline = AGENTIC.build(config)
    trained: list[Any] = []
    train = pipeline.recipe.train

    def recording_train(batch: Any, step: int) -> dict[str, float]:
        trained.append(batch)
        return train(batch, step)

    pipeline.recipe.train = recording_train
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [
        r["metrics"] for r in rows if r.get("step", 0) > 0 and "env/success_rate" in r.get("metrics", {})
    ]
    assert len(steps) == 2, rows
    for m in steps:
        assert m["samples"] > 0 and m["tokens/trained"] > 0
        assert math.isfinite(m["actor/loss"]), m
    # Every trained row shows its lake: one 6x6-patch picture (3x3 cells of 16 px; patch 8, merge 2) whose
    # 36 / 4 = 9 image-pad tokens are in the row's ids.
    assert len(trained) == 2
    pad = pipeline.recipe.runtime.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for batch in trained:
        grids = batch.non_tensors[C.IMAGE_GRID_THW]
        assert len(grids) == len(batch) and all(g.tolist() == [[1, 6, 6]] for g in grids)
        pads_B = (batch.tensors[C.INPUT_IDS] == pad).sum(-1)
        assert pads_B.tolist() == [9] * len(batch)
