"""Two uninterrupted runs of one config log identical metrics, step for step, bit for bit (timing aside).

Both runs share the session's Ray and run one after the other in this process. ``cpu_threads=2`` is kept on
purpose: with one torch thread the CPU kernels that once made runs drift (an accumulating ``index_put`` in the
shared-prefix backward) sum in a fixed order anyway, so a one-thread test could not fail. The quickstart run
sends two generation requests per step (``request_prompts`` = P / 2), so a batch whose row order followed request
completion order would be caught too; it passes an evaluation (``eval_every``) before its last optimizer steps.

Measured before the fix (main at e259ae3, the quickstart with ``max_steps=20 eval_every=10``, two runs side by
side): identical through step 8, then ``actor/grad_norm`` and ``actor/entropy`` differed in the 7th digit from
step 9 (one pair), step 11 (another) and step 16 (a third); a replay of one recorded step-9 forward/backward in
one process gave two different gradients, 5 times in 60.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.core.testing import assert_identical_runs, read_metrics

EXAMPLES = Path(__file__).parents[2] / "examples"
SHARED_RAY = ["ray.address=auto", "ray.num_cpus=null"]
QUIET = ["plot=false", "tracking.backends=[jsonl]", "tracking.progress=false"]


def _train(spec: Any, model: type, yaml: Path, overrides: list[str]) -> None:
    cfg = validate(load_tree(yaml, overrides, model=model), model)
    pipeline = spec.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()


def _twice(spec: Any, model: type, yaml: Path, overrides: list[str], tmp_path: Path) -> dict[int, Any]:
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        _train(spec, model, yaml, [f"output_dir={out}", *overrides, *SHARED_RAY, *QUIET])
        runs.append(read_metrics(out))
    assert_identical_runs(*runs)
    return runs[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_twice_gives_identical_metrics(ray_local: Any, tmp_path: Path) -> None:
    from roll.pipelines.rlvr import SPEC, RLVRConfig

    overrides = [
        "max_steps=6",
        "eval_every=4",
        "warmup.steps=30",
        "batch.prompts_per_step=16",
        "rollout.request_prompts=8",
        "batch.micro_batch_samples=64",
        "validation.num_prompts=8",
        "cpu_threads=2",
    ]
    metrics = _twice(SPEC, RLVRConfig, EXAMPLES / "quickstart.yaml", overrides, tmp_path)
    assert sorted(k for k in metrics if k > 0) == list(range(1, 7))
    assert "eval/accuracy" in metrics[4] and "actor/grad_norm" in metrics[6]
    assert metrics[6]["rollout/requests"] == 2.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_onpolicy_distillation_twice_gives_identical_metrics(ray_local: Any, tmp_path: Path) -> None:
    from roll.pipelines.distill.onpolicy_config import OnPolicyDistillConfig
    from roll.pipelines.distill.onpolicy_spec import SPEC

    overrides = [
        "~teachers.arith.warmup",
        "teachers.arith.model.path=tiny-1m",
        "max_steps=5",
        "eval_every=3",
        "warmup.steps=10",
        "batch.prompts_per_step=8",
        "rollout.request_prompts=4",
        "batch.micro_batch_samples=16",
        "validation.num_prompts=8",
        "resume=never",
        "cpu_threads=2",
    ]
    metrics = _twice(SPEC, OnPolicyDistillConfig, EXAMPLES / "distill_onpolicy.yaml", overrides, tmp_path)
    assert "eval/accuracy" in metrics[3] and "distill/reverse_kl" in metrics[5]
