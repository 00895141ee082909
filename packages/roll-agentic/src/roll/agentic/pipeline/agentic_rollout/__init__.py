"""The ``agentic_rollout`` pipeline: evaluation only. Plays envs with a fixed policy, reports the success rate per
env and dumps every trajectory as jsonl.

Each of ``max_steps`` steps plays ``groups`` groups of ``group_size`` envs (one seed per group) and appends the
episodes to ``<output_dir>/trajectories.jsonl``; ``<output_dir>/success_rates.json`` holds the success rate and
mean return per env tag over all steps. No trainer runs: roles are ``actor_infer`` and ``env_workers`` only.

This module holds only the config and ``SPEC`` (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from roll.agentic.env_manager.check import env_preflight
from roll.agentic.pipeline.config import AgenticRunConfig
from roll.core.config.sampling import upgrade_sampling
from roll.core.types import Pipeline, PipelineSpec

__all__ = ["SPEC", "AgenticRolloutConfig"]


class AgenticRolloutConfig(AgenticRunConfig):
    """Config of the ``agentic_rollout`` pipeline."""

    pipeline: str = "agentic_rollout"
    groups: int = Field(8, ge=1, description="env groups (seeds) per step")
    group_size: int = Field(1, ge=1, description="envs per seed (>1 estimates pass@k-style spread)")
    greedy: bool = Field(
        True, description="greedy decoding; false samples with rollout.temperature and rollout.top_p"
    )
    trajectories_file: str = Field(
        "trajectories.jsonl", description="file name, under output_dir, of the written trajectories"
    )

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An older run's config: ``env_manager.{max_new_tokens,temperature,top_p}`` move under ``rollout``."""
        return upgrade_sampling(data, "env_manager")


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
