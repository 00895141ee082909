"""Partial rollout in the real rlvr pipeline (tiny-1m quickstart, a few steps): config checks, the deterministic
``step_ahead`` mode with an exact kill-and-resume, and the free-running ``stream`` mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.core.errors import ConfigError
from roll.pipelines.rlvr import SPEC, RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
P, G, SEGMENT = 8, 4, 4


def config(*overrides: str) -> RLVRConfig:
    return validate(load_tree(QUICKSTART, list(overrides), model=RLVRConfig), RLVRConfig)


def test_partial_is_rejected_without_an_async_mode() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.partial") as caught:
        config("rollout.partial=true")
    assert "async_generation_ratio" in str(caught.value)  # the hint names the fix


def test_partial_is_accepted_in_both_async_modes() -> None:
    for mode in ("stream", "step_ahead"):
        cfg = config(
            "placement=separate", "rollout.partial=true", "rollout.async_generation_ratio=1",
            f"rollout.async_mode={mode}", f"rollout.partial_segment_tokens={SEGMENT}",
        )  # fmt: skip
        assert cfg.rollout.partial and cfg.rollout.partial_segment_tokens == SEGMENT


def test_partial_segment_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="partial_segment_tokens"):
        config("rollout.partial_segment_tokens=0")


RUN = [
    "max_steps=3",
    "warmup.steps=10",  # the format is half learned: many answers run past one segment
    f"batch.prompts_per_step={P}",
    f"batch.samples_per_prompt={G}",
    f"batch.micro_batch_samples={P * G}",
    "placement=separate",  # async overlaps two actors; the quickstart's hybrid holds one
    "rollout.async_generation_ratio=1",
    "rollout.partial=true",
    f"rollout.partial_segment_tokens={SEGMENT}",
    "cpu_threads=1",
    "eval_every=0",
    "plot=false",
    "tracking.backends=[jsonl]",
    "tracking.progress=false",
]


def run(out: Path, *overrides: str) -> dict[int, dict[str, float]]:
    cfg = config(f"output_dir={out}", "ray.address=auto", "ray.num_cpus=null", *RUN, *overrides)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["metrics"] for r in rows}


@pytest.mark.slow
def test_step_ahead_partial_switches_version_at_the_segment_and_resumes_exactly(
    ray_local: Any, tmp_path: Path, kill_and_resume: Any
) -> None:
    """``async_mode=step_ahead`` + ``partial``: while step k trains, only the first segment (4 tokens) of step
    k+1's samples is generated on step k's weights; after the sync the rest continues on the new ones. So from
    step 2 on every sample's oldest token is one version old, samples longer than a segment span two versions
    (and step 1's, made on one version, none), and nothing depends on timing: a real ``roll train`` SIGKILLed
    after its step-2 checkpoint (which holds the prefetched partial responses and the feed position) and resumed
    logs step 3 exactly as this uninterrupted run, prompts generated included (no prompt lost)."""
    args = [*RUN, "rollout.async_mode=step_ahead", "checkpoint.every_n_steps=2"]
    expected = run(tmp_path / "full", "rollout.async_mode=step_ahead", "checkpoint.every_n_steps=2")
    lags = [expected[k]["rollout/version_lag_max"] for k in range(1, 4)]
    assert lags == [0, 1, 1], f"step k+1 starts on version k's weights: {lags}"
    spans = [expected[k]["rollout/version_span_max"] for k in range(1, 4)]
    assert spans == [0, 1, 1], spans
    assert expected[1]["rollout/multi_version_share"] == 0
    assert all(expected[k]["rollout/multi_version_share"] > 0 for k in range(2, 4))
    assert all(expected[k]["rollout/aborts"] > 0 for k in range(1, 4))
    assert all(expected[k]["rollout/samples"] == P * G for k in range(1, 4))
    assert kill_and_resume(QUICKSTART, args, expected, tmp_path) == 2
