"""Config sections the ``agentic`` and ``agentic_rollout`` pipelines share. Light: pydantic only."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from roll.agentic.env_manager.config import EnvManagerConfig
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.errors import ConfigIssue
from roll.workers.config import HFInferConfig
from roll.workers.roles.config import ModelConfig

__all__ = ["AgenticRunConfig"]


class AgenticRunConfig(RunConfig):
    """What every agentic run has: the policy, its inference workers, the env workers and the env manager."""

    model: ModelConfig = Field(default_factory=lambda: ModelConfig(path="tiny-1m"))
    actor_infer: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=1))
    env_workers: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.25))
    infer_strategy: str = "hf"
    infer: dict[str, Any] = Field(
        default_factory=lambda: HFInferConfig().model_dump(),
        description="config of infer_strategy (HFInferConfig fields for hf, VLLMConfig fields for vllm)",
    )
    cpu_threads: int | None = Field(None, ge=1, description="torch threads per model worker (CPU runs)")
    env_manager: EnvManagerConfig = Field(default_factory=EnvManagerConfig)

    def _infer_issues(self) -> list[ConfigIssue]:
        if self.infer_strategy != "hf":
            return []
        try:
            HFInferConfig.model_validate(self.infer)
        except ValueError as exc:
            return [ConfigIssue("infer", f"not a valid hf inference config: {exc}")]
        return []
