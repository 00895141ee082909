"""Config pieces shared by the pair-based modes (dpo, reward_model). Light: no torch."""

from __future__ import annotations

from roll.core.config.batch import BatchConfig
from roll.data.config import DataConfig, DatasetSourceConfig


def default_pair_data(max_samples: int = 2048, eval_samples: int = 128) -> DataConfig:
    """The built-in arithmetic task as preference pairs (correct vs plausible wrong answer), with held-out pairs."""
    src = {"path": "builtin:arithmetic", "builtin_kind": "preference"}
    return DataConfig(
        sources=[DatasetSourceConfig(**src, max_samples=max_samples)],
        eval_sources=[DatasetSourceConfig(**src, split="eval", max_samples=eval_samples)],
    )


def default_pair_batch() -> BatchConfig:
    """32 pairs (64 sequences) a step, micro-batches of 16 pairs."""
    return BatchConfig(prompts_per_step=32, samples_per_prompt=2, micro_batch_samples=32)
