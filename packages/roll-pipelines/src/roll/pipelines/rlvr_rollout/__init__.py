"""The ``rlvr_rollout`` pipeline: evaluate a model on prompt sets with RLVR's rewards, generating only.

Any model path roll loads (an HF export such as ``<output_dir>/hf`` of a training run, a ``save_pretrained``
folder, a hub id, a tiny preset) answers every prompt of ``data`` ``batch.samples_per_prompt`` times (sampled as
``rollout`` says); the configured reward domains
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

from roll.core.config.base import RollModel
from roll.core.config.sampling import SamplingConfig
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
    "samples": "batch.samples_per_prompt",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "max_new_tokens": "rollout.max_new_tokens",
    "request_prompts": "rollout.request_prompts",
}
"""Keys of older rlvr_rollout layouts and their place now: the key paths the RL modes share (rlvr's)."""


class EvalSamplingConfig(SamplingConfig):
    """How answers are sampled: rlvr's ``rollout.*`` keys, greedy by default."""

    max_new_tokens: int = Field(64, ge=1, description="max tokens of one answer")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy (needs batch.samples_per_prompt: 1)")
    request_prompts: int = Field(8, ge=1, description="prompts per generation request sent to one worker")


class EvalBatchConfig(RollModel):
    """How many answers each prompt gets: rlvr's ``batch.samples_per_prompt`` (the group size)."""

    samples_per_prompt: int = Field(1, ge=1, description="answers per prompt (n)")


class RolloutEvalConfig(RunConfig):
    """Config of the ``rlvr_rollout`` pipeline (every source of ``data``, train and eval, is evaluated)."""

    pipeline: str = "rlvr_rollout"
    actor_infer: EvalModelRoleConfig
    cpu_threads: int | None = Field(None, ge=1, description="OMP threads of each inference worker (CPU runs)")
    data: DataConfig
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    rewards: dict[str, RewardDomainConfig] = Field(min_length=1)
    batch: EvalBatchConfig = Field(default_factory=EvalBatchConfig)
    rollout: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    pass_k: list[int] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="the k of each pass@k reported; each <= batch.samples_per_prompt",
    )
    max_prompts: int | None = Field(None, ge=1, description="evaluate the first this many prompts")

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return dict(MOVED_KEYS)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = reward_routing_issues(self.rewards)
        samples = self.batch.samples_per_prompt
        too_big = [k for k in self.pass_k if not 1 <= k <= samples]
        if too_big:
            hint = f"raise batch.samples_per_prompt to {max(too_big)} or drop those k"
            message = f"pass@k needs 1 <= k <= batch.samples_per_prompt = {samples}: {too_big}"
            issues.append(ConfigIssue("pass_k", message, hint))
        if samples > 1 and self.rollout.temperature == 0:
            message = f"batch.samples_per_prompt = {samples} greedy answers would all be the same"
            issues.append(
                ConfigIssue("rollout.temperature", message, "set rollout.temperature > 0 (e.g. 1.0)")
            )
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

__all__ = ["MOVED_KEYS", "SPEC", "EvalBatchConfig", "EvalSamplingConfig", "RolloutEvalConfig"]
