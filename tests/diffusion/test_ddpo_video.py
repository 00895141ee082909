"""DDPO raises the JPEG-compressibility reward (no gradient through the reward), and the Wan-family video path
runs two steps and writes frame strips and GIFs. Both run in the shared Ray, one actor each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_config
from roll.core.testing import read_metrics
from roll.diffusion.reward_fl import RewardFLConfig

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["tracking.progress=false", "tracking.backends=[jsonl]"]
DDPO_STEPS = 6
DDPO = [
    f"max_steps={DDPO_STEPS}",
    f"eval_every={DDPO_STEPS}",
    "reward.name=jpeg_compressibility",
    "reward.options={}",
    "algorithm={type: ddpo, clip_range: 0.0001}",
    "sampling.eta=1.0",
    "sampling.num_steps=5",
    "batch.prompts_per_step=4",
    "batch.samples_per_prompt=4",
    "batch.micro_batch_samples=16",
    "actor_train.strategy.optimizer.lr=1e-3",
    "checkpoint.export_hf=false",
]


@pytest.mark.slow
def test_ddpo_raises_jpeg_compressibility(
    ray_local: Any, tiny_sd: Path, run_reward_fl: Any, tmp_path: Path
) -> None:
    """Eval reward = minus the kB of the 8 eval prompts' samples as JPEG (same seed before and after)."""
    metrics = read_metrics(
        run_reward_fl(ROOT / "examples" / "reward_fl.yaml", tmp_path / "ddpo", [*QUIET, *DDPO])
    )
    before, after = metrics[0]["eval/reward_mean"], metrics[DDPO_STEPS]["eval/reward_mean"]
    assert after > before + 0.005, (before, after)
    assert metrics[1]["train/clipfrac"] == 0.0  # one optimizer step per rollout: on-policy, ratio exactly 1


@pytest.mark.slow
def test_video_path_runs_two_steps_and_writes_frames(
    ray_local: Any, run_reward_fl: Any, tmp_path: Path
) -> None:
    from PIL import Image

    out = run_reward_fl(ROOT / "examples" / "reward_fl_video.yaml", tmp_path / "video", QUIET)
    metrics = read_metrics(out)
    assert sorted(metrics) == [0, 1, 2]
    assert 0.0 <= metrics[2]["train/reward_mean"] <= 1.0
    assert metrics[2]["train/grad_norm"] > 0.0
    strip = Image.open(out / "samples" / "step_000002.png")
    assert strip.size == ((16 + 2) * 4 * 4 + 8, (16 + 2) * 2 * 4 + 8)  # 4 frames x 2 prompts, x4
    gif = Image.open(out / "samples" / "step_000002.gif")
    assert gif.n_frames == 4


@pytest.mark.parametrize("bad", ["sampling.eta=0.0", "batch.samples_per_prompt=1"])
def test_ddpo_config_errors_name_the_key(bad: str) -> None:
    from roll.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "examples" / "reward_fl.yaml", [*DDPO, bad], model=RewardFLConfig)
    assert bad.split("=")[0] in str(err.value)
