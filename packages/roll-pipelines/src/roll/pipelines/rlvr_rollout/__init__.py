"""The ``rlvr_rollout`` pipeline: evaluate a model on prompt sets with RLVR's rewards, generating only.

Any model path roll loads (an HF export such as ``<output_dir>/hf`` of a training run, a ``save_pretrained``
folder, a hub id, a tiny preset) answers every prompt of ``data`` ``samples`` times; the configured reward domains
score the answers; the run writes ``samples.jsonl`` (one line per answer) and ``summary.json`` (accuracy overall
and per domain, pass@k, mean score and length) in ``output_dir``, and logs the summary to the trackers.
``roll eval CONFIG`` runs it. Built from the same parts as ``rlvr`` (the inference role, the generate and reward
schedulers, the reward workers) without its trainer.

This module is light (config and spec); :mod:`.pipeline` has the implementation, :mod:`.metrics` the pure
functions.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.sections import RunConfig
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.rlvr.config import RewardDomainConfig, reward_routing_issues
from roll.workers.roles.config import InferRoleConfig, ModelConfig


class EvalModelRoleConfig(InferRoleConfig):
    """The evaluated model: placement, ``model`` (required: what is evaluated) and an infer strategy."""

    model: ModelConfig


MOVED_KEYS = {
    "model": "actor_infer.model",
    "infer_strategy": "actor_infer.strategy.type",
    "infer": "actor_infer.strategy",
}


class RolloutEvalConfig(RunConfig):
    """Config of the ``rlvr_rollout`` pipeline (every source of ``data``, train and eval, is evaluated)."""

    pipeline: str = "rlvr_rollout"
    actor_infer: EvalModelRoleConfig
    cpu_threads: int | None = Field(None, ge=1, description="OMP threads of each inference worker (CPU runs)")
    data: DataConfig
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    rewards: dict[str, RewardDomainConfig] = Field(min_length=1)
    samples: int = Field(1, ge=1, description="answers per prompt (n)")
    pass_k: list[int] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="the k of each pass@k reported; each <= samples",
    )
    max_prompts: int | None = Field(None, ge=1, description="evaluate the first this many prompts")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy (needs samples: 1)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 disables it")
    max_new_tokens: int = Field(64, ge=1, description="max tokens of one answer")
    request_prompts: int = Field(8, ge=1, description="prompts per generation request sent to one worker")

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return dict(MOVED_KEYS)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = reward_routing_issues(self.rewards)
        too_big = [k for k in self.pass_k if not 1 <= k <= self.samples]
        if too_big:
            hint = f"raise samples to {max(too_big)} or drop those k"
            issues.append(
                ConfigIssue("pass_k", f"pass@k needs 1 <= k <= samples = {self.samples}: {too_big}", hint)
            )
        if self.samples > 1 and self.temperature == 0:
            message = f"samples = {self.samples} greedy answers would all be the same"
            issues.append(ConfigIssue("temperature", message, "set temperature > 0 (e.g. 1.0)"))
        if issues:
            raise issues_error(issues)
        return self


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.rlvr_rollout.pipeline import RolloutEvalRecipe

    return Run(config, name="rlvr_rollout", recipe=lambda host: RolloutEvalRecipe(config, host))


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.preflight import rlvr_preflight

    return rlvr_preflight(config)


SPEC = PipelineSpec(
    name="rlvr_rollout",
    config_model=RolloutEvalConfig,
    build=_build,
    description="evaluate a model with RLVR rewards: samples.jsonl, accuracy per domain, pass@k",
    preflight=_preflight,
)

__all__ = ["SPEC", "RolloutEvalConfig"]
