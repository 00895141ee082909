"""The ``agent_gateway`` pipeline: RL on the user's own agent code, through the agent gateway.

One step: pick ``batch.prompts_per_step`` task rows (a seeded shuffle per pass over ``tasks``), run
``batch.samples_per_prompt`` episodes of each through the gateway (:class:`~roll.agentic.gateway.agents.AgentGateway`
on the policy's ``actor_infer``: the agent, ``agent.type``, talks to it with any OpenAI client and returns the
episode's reward), turn every recorded call into training rows (prompt ids as the model saw them, sampled ids as
sampled: nothing re-tokenized), estimate one advantage per episode over the episodes of each task row, train
``actor_train``, push the weights. An optional SFT ``warmup`` first trains on OpenAI-format conversations rendered
exactly as the gateway renders an agent's requests.

An agent is ``agent.type``: a ``roll.agent`` entry-point name (its ``options`` validate against the plugin's
config model) or ``package.module:function``, a callable ``(base_url, api_key, task) -> reward`` (``options``
must then be empty). Task rows are JSON objects, given inline (``tasks.rows``) or in a JSONL file
(``tasks.path``); each row is handed to the agent as it is.

This module holds only the config and ``SPEC`` (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

import re
from typing import Any, Self

from pydantic import Field, field_validator, model_validator

from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
from roll.core import plugins
from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sampling import moved_sampling_keys, upgrade_sampling
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.common.exporter import POLICY_EXPORT
from roll.pipelines.policy.config import MOVED_KEYS as POLICY_MOVED_KEYS
from roll.pipelines.policy.config import PolicyRunConfig

__all__ = [
    "MOVED_KEYS",
    "SPEC",
    "AgentConfig",
    "AgentGatewayConfig",
    "ConversationWarmupConfig",
    "TaskDataConfig",
]

SUPPORTED_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
"""Episode-level estimators (GiGPO's anchor states are an env manager's; an agent's states are its own)."""
MOVED_KEYS = {
    **POLICY_MOVED_KEYS,
    **moved_sampling_keys("gateway"),
}
"""Keys of older agent_gateway layouts and their place now: sampling is ``rollout.*`` in every RL mode."""
_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class AgentConfig(RollModel):
    """The agent code each episode runs: a ``roll.agent`` plugin or a ``module:function`` callable."""

    type: str = Field(
        description="a roll.agent entry-point name (roll list shows them) or package.module:function, a callable "
        "(base_url, api_key, task) -> reward"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the plugin's options (its config model); empty for module:function"
    )

    @field_validator("type")
    @classmethod
    def _known(cls, name: str) -> str:
        if ":" in name:
            if not _CALLABLE.match(name):
                raise ValueError(f"{name!r} is not package.module:function")
            return name
        known = sorted(plugins.available("roll.agent"))
        if name not in known:
            raise ValueError(
                f"no roll.agent plugin named {name!r}; installed: {', '.join(known) or '(none)'}"
            )
        return name

    @model_validator(mode="after")
    def _options_for_plugins(self) -> Self:
        if ":" in self.type and self.options:
            raise ValueError("options are a roll.agent plugin's; a module:function agent takes none")
        return self


class TaskDataConfig(RollModel):
    """The task rows episodes play: inline or a JSONL file (one JSON object per line), exactly one of them."""

    rows: list[dict[str, Any]] | None = Field(None, description="task rows inline (each a mapping)")
    path: str | None = Field(None, description="a JSONL file of task rows")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.rows is None) == (self.path is None):
            raise ValueError("set exactly one of tasks.rows and tasks.path")
        if self.rows is not None and not self.rows:
            raise ValueError("tasks.rows is empty")
        return self


class ConversationWarmupConfig(RollModel):
    """SFT on OpenAI-format conversations before RL: each line of ``path`` is ``{"messages": [...], "tools":
    [...]}`` (tools optional) whose last message is the assistant's answer to learn (text, or ``tool_calls``).
    They are rendered as the gateway renders an agent's request, so the warm-up trains the very tokens RL
    samples."""

    path: str = Field(description="a JSONL file of conversations")
    steps: int = Field(40, ge=1, description="SFT optimizer steps before RL")
    batch_size: int = Field(32, ge=1, description="conversations per warm-up step (drawn with replacement)")
    lr: float | None = Field(None, gt=0, description="default: the RL optimizer's lr")


def _default_algorithm() -> AlgorithmConfig:
    return AlgorithmConfig(preset="grpo", kl_mode="none", loss_agg_mode="token-mean")


class AgentGatewayConfig(PolicyRunConfig):
    """Config of the ``agent_gateway`` pipeline. Roles: ``actor_train``, ``actor_infer`` (behind the gateway),
    ``reference`` when the KL term needs it, ``critic`` for GAE. ``batch.prompts_per_step`` task rows per step,
    ``batch.samples_per_prompt`` episodes each (the GRPO group)."""

    pipeline: str = "agent_gateway"
    batch: BatchConfig = Field(
        default_factory=lambda: BatchConfig(prompts_per_step=4, samples_per_prompt=4, micro_batch_samples=16)
    )
    algorithm: AlgorithmConfig = Field(default_factory=_default_algorithm)
    agent: AgentConfig
    tasks: TaskDataConfig
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    rollout: GatewaySamplingConfig = Field(default_factory=GatewaySamplingConfig)
    warmup: ConversationWarmupConfig | None = None

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return dict(MOVED_KEYS)

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An older run's config: ``gateway.{max_new_tokens,temperature,top_p}`` move under ``rollout``."""
        return upgrade_sampling(data, "gateway")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self.policy_issues(async_ratio=0, async_key="placement")
        issues += ESTIMATORS.unsupported(
            self.algorithm.adv_estimator, SUPPORTED_ESTIMATORS, pipeline="agent_gateway"
        )
        for key in ("overlong_filter", "overlong_penalty", "dynamic_sampling"):
            if getattr(self.algorithm, key):
                issues.append(
                    ConfigIssue(f"algorithm.{key}", f"{key} is an RLVR option", f"set {key}: false")
                )
        if issues:
            raise issues_error(issues)
        return self


def _build(config: Any) -> Pipeline:
    from roll.agentic.pipeline.agent_gateway.pipeline import AgentGatewayRecipe
    from roll.core.run import Run

    return Run(config, name="agent_gateway", recipe=lambda host: AgentGatewayRecipe(config, host))


SPEC = PipelineSpec(
    name="agent_gateway",
    config_model=AgentGatewayConfig,
    build=_build,
    description="RL on your own agent code (OpenAI API clients) through the agent gateway",
    export=POLICY_EXPORT,
)
