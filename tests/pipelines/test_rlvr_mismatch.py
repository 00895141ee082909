"""The train/infer mismatch toolkit in real runs: the quickstart's tiny model on CPU (hybrid placement: fsdp2
trainer and hf generator in one actor, weights copied in process).

- With no correction configured (no ``tis_cap``), every step logs the ``actor/mismatch/*`` metrics.
- The sync check after each weight sync measures ~0 (same weights, fp32 on both sides: only the KV-cached decode
  and the full forward differ, by float rounding).
- Skip a sync after a deliberately large update of the trainer (an NLL step at a high learning rate): the check
  then measures a large gap and its warning fires, with the numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from roll.core import columns as C
from roll.core.config.loader import load_tree, validate
from roll.pipelines.algorithms.losses import MaskedNLLLoss
from roll.pipelines.policy.views import training_view
from roll.pipelines.rlvr import SPEC, RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _config(tmp_path: Path, *extra: str) -> RLVRConfig:
    overrides = [
        f"output_dir={tmp_path}", "max_steps=2", "warmup.steps=10", "eval_every=0", "plot=false",
        "tracking.backends=[jsonl]", "tracking.progress=false", "ray.address=auto", "ray.num_cpus=null",
        "batch.prompts_per_step=8", "batch.micro_batch_samples=64", "rollout.request_prompts=8", "algorithm.skip_zero_advantage=false", *extra,
    ]  # fmt: skip
    return validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)


@pytest.mark.slow
def test_mismatch_metrics_and_sync_check_in_a_real_run(
    ray_local: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, "sync_check.every=1")  # the default checks every 10th sync; here each one
    assert cfg.algorithm.correction() is None and cfg.placement == "hybrid"
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
        steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        steps = [r["metrics"] for r in steps if r["step"] > 0]
        assert len(steps) == 2
        for m in steps:
            for name in (
                "logp_abs_diff_mean",
                "logp_abs_diff_max",
                "kl_k3",
                "ratio_p05",
                "ratio_p50",
                "ratio_p95",
            ):
                assert f"actor/mismatch/{name}" in m, (name, sorted(m))
            # one process, the same fp32 weights: the sampler's log-probs are the trainer's up to rounding
            assert m["actor/mismatch/logp_abs_diff_max"] < 1e-3
            assert (
                m["actor/mismatch/ratio_p05"]
                <= m["actor/mismatch/ratio_p50"]
                <= m["actor/mismatch/ratio_p95"]
            )
            assert m["mismatch/sync_probe_tokens"] == 16.0
            assert m["mismatch/sync_logp_diff_max"] < 1e-4, m["mismatch/sync_logp_diff_max"]
        # Skip a sync: one NLL step at a learning rate 100x the run's moves the trainer, not the generator.
        recipe = pipeline.recipe
        policy = recipe.policy
        rollout = recipe.generate()
        batch = training_view(recipe.score(rollout), (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK))
        policy.actor.set_lr(5e-2)
        policy.actor.train_step(batch, MaskedNLLLoss("response"))
        with caplog.at_level(logging.WARNING, logger="roll.pipelines.policy.sync_check"):
            gap = policy.check_sync()
        assert gap["mismatch/sync_logp_diff_mean"] > cfg.sync_check.threshold, gap
        warned = [r.getMessage() for r in caplog.records if "weight sync check" in r.getMessage()]
        assert len(warned) == 1 and f"{gap['mismatch/sync_logp_diff_mean']:.4g}" in warned[0], warned
        # ... and the sync puts the generator back on the trainer's weights.
        policy.sync()
        assert policy.pop_phase_metrics()["mismatch/sync_logp_diff_max"] < 1e-4
    finally:
        pipeline.shutdown()


def test_sync_check_runs_after_the_first_sync_and_every_nth() -> None:
    """``every: 10`` checks syncs 1, 10, 20 (the first: a sync that never worked shows at step 1); ``every: 1``
    each one; ``every: 0`` none; and nothing before a probe prompt is known."""
    from roll.pipelines.policy.config import SyncCheckConfig
    from roll.pipelines.policy.sync_check import SyncCheck

    class Counting(SyncCheck):
        def check(self, actor: Any, infer: Any, version: int) -> dict[str, float]:
            return {"checked": float(version)}

    def checked(every: int, probe: list[int] | None = [5, 6]) -> list[int]:  # noqa: B006 (read only)
        sc = Counting(SyncCheckConfig(every=every))
        sc.prompt_ids = probe
        return [v for v in range(1, 22) if sc.after_sync(None, None, v)]  # type: ignore[arg-type]

    assert checked(10) == [1, 10, 20]
    assert checked(1) == list(range(1, 22))
    assert checked(0) == [] and checked(10, probe=None) == []
