"""Async generation and dynamic sampling inside the real rlvr pipeline (tiny-1m, a few steps, one run).

The quickstart config with ``rollout.async_generation_ratio=1`` (rollouts of step k+1 are generated while step k
trains, so a sample may be one policy version old, never more) and ``algorithm.dynamic_sampling=true`` (groups
whose rewards are all equal are dropped and replaced; after ``max_rounds`` the batch is filled with dropped
groups). A short warm-up leaves the model right a few times in a hundred, so most groups are all-wrong and get
dropped. Asserted from the logged metrics of every step: the lag of every trained sample is within the bound,
async really overlapped (some step trained on samples one version old), no group was generated only to be
evicted as stale, every step logs the prompts generated for it, dropped groups are counted, and each step trains
on a full batch of P * G samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.pipelines.rlvr import SPEC, RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
P, G = 8, 4


@pytest.mark.slow
def test_async_and_dynamic_sampling(ray_local: Any, tmp_path: Path) -> None:
    overrides = [
        f"output_dir={tmp_path}",
        "max_steps=4",
        "warmup.steps=20",
        f"batch.prompts_per_step={P}",
        f"batch.samples_per_prompt={G}",
        f"batch.micro_batch_samples={P * G}",
        "placement=separate",  # async overlaps two actors; the quickstart's hybrid holds one
        "rollout.async_generation_ratio=1",
        "rollout.max_rounds=2",
        "rollout.request_prompts=4",
        "algorithm.dynamic_sampling=true",
        "cpu_threads=1",  # generation and training overlap
        "eval_every=0",
        "plot=false",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
        "ray.address=auto",
        "ray.num_cpus=null",
    ]
    cfg = validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in rows if r["step"] > 0]
    assert len(steps) == 4
    bound = 1  # max_staleness defaults to ceil(async_generation_ratio)
    lags = [s["rollout/version_lag_max"] for s in steps]
    assert all(0 <= lag <= bound for lag in lags), f"a trained sample was staler than {bound}: {lags}"
    assert max(lags) == bound, f"async never trained on an older policy's samples: {lags}"
    assert all(s["rollout/samples"] == P * G for s in steps), [s["rollout/samples"] for s in steps]
    assert all("rollout/groups_dropped" in s and "rollout/filter_all_equal" in s for s in steps)
    generated = [s["rollout/prompts_generated"] for s in steps]
    assert all(n > 0 for n in generated), f"a step logged no generation: {generated}"
    stale = [s["rollout/groups_stale"] for s in steps]
    assert stale == [0.0] * 4, f"generation ran further ahead than the staleness bound: {stale}"
    dropped = sum(s["rollout/groups_dropped"] for s in steps)
    assert dropped > 0, "dynamic sampling dropped no group although most groups are all wrong"


@pytest.mark.slow
def test_step_ahead_async_resumes_exactly_after_sigkill(
    ray_local: Any, tmp_path: Path, kill_and_resume: Any
) -> None:
    """``rollout.async_mode=step_ahead``: step k+1's batch generates on the weights step k started with, while
    step k trains, and the sync waits for it, so every trained sample is exactly one version old from step 2 on
    and what is generated does not depend on timing. A real ``roll train`` SIGKILLed after its step-2
    checkpoint (which holds the pending batch) and resumed logs steps 3-4 exactly as this uninterrupted run."""
    run = [
        "max_steps=4",
        "warmup.steps=10",
        f"batch.prompts_per_step={P}",
        f"batch.samples_per_prompt={G}",
        f"batch.micro_batch_samples={P * G}",
        "placement=separate",  # async overlaps two actors; the quickstart's hybrid holds one
        "rollout.async_generation_ratio=1",
        "rollout.async_mode=step_ahead",
        "cpu_threads=1",
        "eval_every=0",
        "checkpoint.every_n_steps=2",
        "plot=false",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
    ]
    here = [f"output_dir={tmp_path / 'full'}", "ray.address=auto", "ray.num_cpus=null", *run]
    cfg = validate(load_tree(QUICKSTART, here, model=RLVRConfig), RLVRConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    expected = {r["step"]: r["metrics"] for r in rows}
    lags = [expected[k]["rollout/version_lag_max"] for k in range(1, 5)]
    assert lags == [0, 1, 1, 1], f"step_ahead trains step k+1 on version k's samples: {lags}"
    assert kill_and_resume(QUICKSTART, run, expected, tmp_path) == 2
