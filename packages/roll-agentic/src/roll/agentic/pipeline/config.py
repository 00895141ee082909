"""Config sections the ``agentic`` and ``agentic_rollout`` pipelines share. Light: pydantic only."""

from __future__ import annotations

from pydantic import Field

from roll.agentic.env_manager.config import EnvManagerConfig
from roll.core.config.sampling import SamplingConfig, moved_sampling_keys
from roll.core.config.sections import RoleConfig, RunConfig
from roll.workers.roles.config import DEFAULT_MODEL, InferRoleConfig, ModelConfig

__all__ = ["AgenticRunConfig"]


class AgenticRunConfig(RunConfig):
    """What every agentic run has: the policy's inference workers, the env workers, the env manager, and how
    turns are sampled (``rollout``: the key path every RL mode shares)."""

    actor_infer: InferRoleConfig = Field(default_factory=InferRoleConfig)
    env_workers: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.25))
    cpu_threads: int | None = Field(None, ge=1, description="torch threads per model worker (CPU runs)")
    env_manager: EnvManagerConfig = Field(default_factory=EnvManagerConfig)
    rollout: SamplingConfig = Field(default_factory=SamplingConfig)

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        """Keys of the old layout and their new place (the hint of the error a config using one gets)."""
        return {
            "model": "actor_infer.model",
            "infer_strategy": "actor_infer.strategy.type",
            "infer": "actor_infer.strategy",
            **moved_sampling_keys("env_manager"),
        }

    @property
    def policy_model(self) -> ModelConfig:
        """The model the inference workers serve (``actor_infer.model``, default the tiny preset)."""
        return self.actor_infer.model or ModelConfig(path=DEFAULT_MODEL)
