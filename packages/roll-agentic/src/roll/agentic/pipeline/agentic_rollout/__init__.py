"""The ``agentic_rollout`` pipeline: evaluation only. Plays envs with a fixed policy, reports the success rate per
env and dumps every trajectory as jsonl.

Each of ``max_steps`` steps plays ``batch.prompts_per_step`` groups of ``batch.samples_per_prompt`` envs (one seed
per group; the key paths every RL mode shares, as in ``agentic``) and appends the episodes to
``<output_dir>/trajectories.jsonl``; ``<output_dir>/success_rates.json`` holds the success rate and
mean return per env tag over all steps. No trainer runs: roles are ``actor_infer`` and ``env_workers`` only.

This module holds only the config and ``SPEC`` (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from roll.agentic.env_manager.check import env_preflight
from roll.agentic.pipeline.config import AgenticRunConfig
from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sampling import upgrade_sampling
from roll.core.config.validate import issues_error, unknown_key
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec

__all__ = ["MOVED_KEYS", "SPEC", "TRAINING_BATCH_KEYS", "AgenticRolloutConfig", "RolloutBatchConfig"]

MOVED_KEYS = {
    "groups": "batch.prompts_per_step",
    "group_size": "batch.samples_per_prompt",
}
"""Keys of the older agentic_rollout layout and their place now: the RL modes' batch paths (agentic's, rlvr's)."""

TRAINING_BATCH_KEYS = tuple(
    name for name in BatchConfig.model_fields if name not in ("prompts_per_step", "samples_per_prompt")
)
"""BatchConfig's keys about training (optimizer steps, micro-batches): a rollout trains nothing."""


class RolloutBatchConfig(RollModel):
    """How many envs a step plays: ``prompts_per_step`` groups of ``samples_per_prompt`` envs, as in
    ``agentic``. Only these two batch keys: a rollout trains nothing, so the optimizer and micro-batch keys are
    refused."""

    prompts_per_step: int = Field(8, ge=1, description="P: env groups (one seed each) per step")
    samples_per_prompt: int = Field(
        1, ge=1, description="G: envs per group (same seed; >1 estimates pass@k-style spread)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_training_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            issues = [
                ConfigIssue(
                    key,
                    f"batch.{key} sizes training steps; agentic_rollout trains nothing",
                    "remove it: an agentic_rollout batch takes only batch.prompts_per_step and "
                    "batch.samples_per_prompt",
                )
                for key in data
                if key in TRAINING_BATCH_KEYS
            ]
            if issues:  # every other unknown key with them, not once they are fixed
                known = (*TRAINING_BATCH_KEYS, *cls.model_fields)
                issues += [unknown_key(cls, [key], data) for key in data if key not in known]
                raise issues_error(issues, title=cls.__name__)
        return data


class AgenticRolloutConfig(AgenticRunConfig):
    """Config of the ``agentic_rollout`` pipeline."""

    pipeline: str = "agentic_rollout"
    batch: RolloutBatchConfig = Field(default_factory=RolloutBatchConfig)
    greedy: bool = Field(
        True, description="greedy decoding; false samples with rollout.temperature and rollout.top_p"
    )
    trajectories_file: str = Field(
        "trajectories.jsonl", description="file name, under output_dir, of the written trajectories"
    )

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return {**super().moved_keys(), **MOVED_KEYS}

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An older run's config: ``env_manager.{max_new_tokens,temperature,top_p}`` move under ``rollout``,
        top-level ``groups`` and ``group_size`` to ``batch.prompts_per_step`` and ``batch.samples_per_prompt``
        (a key ``batch`` already holds is kept)."""
        data = upgrade_sampling(dict(data), "env_manager")
        batch = dict(data.get("batch") or {})
        for old, new in MOVED_KEYS.items():
            if old in data:
                batch.setdefault(new.removeprefix("batch."), data.pop(old))
        return {**data, "batch": batch} if batch else data


def _build(config: Any) -> Pipeline:
    from roll.agentic.pipeline.agentic_rollout.pipeline import AgenticRolloutRecipe
    from roll.core.run import Run

    return Run(config, name="agentic_rollout", recipe=lambda host: AgenticRolloutRecipe(config, host))


SPEC = PipelineSpec(
    name="agentic_rollout",
    config_model=AgenticRolloutConfig,
    build=_build,
    description="evaluate a policy on text envs: success rate per env, trajectories as jsonl",
    preflight=env_preflight,
)
