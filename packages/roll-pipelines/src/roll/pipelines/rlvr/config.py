"""Config of the ``rlvr`` pipeline: roles, model, data, rollout, algorithm, reward domains, optional SFT warm-up.

Light: pydantic models only (no torch, no Ray), so ``roll validate`` answers in milliseconds. The one-unit batch
arithmetic of :class:`~roll.core.config.batch.BatchConfig` is checked against ``actor_train.num_workers``, the
algorithm against the group size, and every tag the data can carry against the reward domains' tags.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.config.validate import issues_error, moved_keys_error
from roll.core.errors import ConfigIssue
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.common.config import batch_issues
from roll.workers.roles.config import CriticRoleConfig, InferRoleConfig, ModelConfig, TrainRoleConfig

MOVED_KEYS = {
    "model": "actor_train.model",
    "train_strategy": "actor_train.strategy.type",
    "train": "actor_train.strategy",
    "infer_strategy": "actor_infer.strategy.type",
    "infer": "actor_infer.strategy",
    "critic_model": "critic.model",
    "critic_train": "critic.strategy",
}
"""Keys of the old two-regime layout and where they live now (a config that uses one gets the path as hint)."""

SUPPORTED_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
"""The estimators RLVR runs (GiGPO needs the step-level rows of agentic runs)."""


class RolloutConfig(RollModel):
    """How rollouts are sampled and scheduled (see :mod:`roll.core.scheduler.generate`)."""

    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    request_prompts: int = Field(8, ge=1, description="prompts per generation request sent to one worker")
    max_inflight_per_rank: int = Field(2, ge=1)
    max_rounds: int = Field(4, ge=1, description="dynamic sampling: rounds of oversampling before filling")
    async_generation_ratio: float = Field(
        0.0, ge=0, description="0: sync; r > 0: generate up to r steps ahead while training"
    )
    max_staleness: int | None = Field(
        None, ge=0, description="max policy-version lag of a trained sample; default ceil(ratio)"
    )
    async_mode: Literal["stream", "step_ahead"] = Field(
        "stream",
        description="stream: a generator thread keeps up to ratio steps of groups ready (timing decides which "
        "weights made a group); step_ahead (ratio 1): the next step's batch generates on this step's weights "
        "while it trains and the sync waits for it: one update stale, reproducible, resumed exactly",
    )


class ValidationConfig(RollModel):
    """Greedy generation on held-out prompts every ``eval_every`` steps (``data.eval_*`` supplies them)."""

    num_prompts: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)
    max_new_tokens: int | None = Field(None, ge=1, description="default: rollout.max_new_tokens")


class RewardDomainConfig(RollModel):
    """One reward domain: a ``roll.reward`` plugin, the tags routed to it, and its workers.

    ``options`` are the plugin's config fields (validated against its config model when the run builds).
    """

    type: str = Field(
        min_length=1, description="roll.reward entry point: arithmetic, math, code_sandbox, ..."
    )
    tags: list[str] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)
    workers: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.1))


class WarmupConfig(RollModel):
    """An SFT warm-up on ``actor_train`` before RL: teaches the answer format so RL has a signal to amplify."""

    steps: int = Field(20, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float | None = Field(None, gt=0, description="default: the RL optimizer's lr")
    data: DataConfig


class RLVRConfig(RunConfig):
    """Config of the ``rlvr`` pipeline. Roles: ``actor_train``, ``actor_infer``, ``reference`` (when the KL term
    needs it), ``critic`` (``algorithm.use_critic``: PPO's GAE), and ``reward_<domain>`` per entry of
    ``rewards``."""

    pipeline: str = "rlvr"
    actor_train: TrainRoleConfig
    actor_infer: InferRoleConfig = Field(default_factory=InferRoleConfig)
    reference: InferRoleConfig = Field(default_factory=lambda: InferRoleConfig(cpus_per_worker=0.5))
    critic: CriticRoleConfig = Field(default_factory=lambda: CriticRoleConfig(cpus_per_worker=0.5))
    critic_warmup_steps: int = Field(
        0, ge=0, description="first RL steps train the critic only, so no advantage comes from a random head"
    )
    placement: Literal["separate", "hybrid"] = Field(
        "separate",
        description="separate: actor_train and actor_infer are their own actors; hybrid: one process holds both "
        "(actor_train's placement, actor_infer's strategy; weight sync in process)",
    )
    cpu_threads: int | None = Field(None, ge=1, description="torch threads per model worker (CPU runs)")
    batch: BatchConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=lambda: AlgorithmConfig(preset="grpo"))
    data: DataConfig
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    rewards: dict[str, RewardDomainConfig] = Field(min_length=1)
    warmup: WarmupConfig | None = None
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    bucket_mb: float = Field(256.0, gt=0, description="model-update bucket size")
    plot: bool = Field(True, description="write reward/accuracy PNG (plot.png) at the end of the run")

    @model_validator(mode="before")
    @classmethod
    def _old_layout(cls, data: Any) -> Any:
        error = moved_keys_error(data, MOVED_KEYS)
        if error is not None:
            raise error
        return data

    @property
    def policy_model(self) -> ModelConfig:
        """The trained policy's model (``actor_train.model``): what inference, reference and critic default to."""
        return self.actor_train.model

    @property
    def needs_reference(self) -> bool:
        return self.algorithm.kl_mode != "none"

    @property
    def needs_critic(self) -> bool:
        return self.algorithm.use_critic

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=False)
        issues += self.algorithm.check(self.batch.samples_per_prompt)
        issues += ESTIMATORS.unsupported(self.algorithm.adv_estimator, SUPPORTED_ESTIMATORS, pipeline="rlvr")
        issues += self._tag_issues() + self._critic_issues() + self._async_issues()
        if issues:
            raise issues_error(issues)
        return self

    def _tag_issues(self) -> list[ConfigIssue]:
        seen: dict[str, str] = {}
        issues = []
        for name, domain in self.rewards.items():
            for tag in domain.tags:
                if tag in seen:
                    message = f"tag {tag!r} is routed to both {seen[tag]!r} and {name!r}"
                    issues.append(ConfigIssue(f"rewards.{name}.tags", message, "each tag goes to one domain"))
                seen[tag] = name
        return issues

    def _async_issues(self) -> list[ConfigIssue]:
        r = self.rollout
        if r.async_mode == "step_ahead" and r.async_generation_ratio != 1:
            message = f"async_mode step_ahead generates exactly one step ahead; async_generation_ratio is {r.async_generation_ratio:g}"
            return [
                ConfigIssue(
                    "rollout.async_generation_ratio", message, "set it to 1, or use async_mode: stream"
                )
            ]
        shared = (
            self.actor_train.device_group is not None
            and self.actor_train.device_group == self.actor_infer.device_group
        )
        if r.async_generation_ratio > 0 and (shared or self.placement == "hybrid"):
            message = "async generation overlaps generation with training, but actor_train and actor_infer share devices"
            return [
                ConfigIssue(
                    "rollout.async_generation_ratio",
                    message,
                    "set it to 0, or give actor_infer its own devices",
                )
            ]
        return []

    def _critic_issues(self) -> list[ConfigIssue]:
        issues = []
        if not self.needs_critic:
            given: dict[str, object] = {
                "critic.model": self.critic.model,
                "critic.strategy": self.critic.strategy,
            }
            given["critic_warmup_steps"] = self.critic_warmup_steps or None
            for key in [k for k, v in given.items() if v is not None]:
                message = f"{key} is set but algorithm.use_critic is false, so no critic runs"
                hint = f"remove {key}, or use a critic preset (algorithm.preset=ppo)"
                issues.append(ConfigIssue(key, message, hint))
            return issues
        issues += batch_issues(self.batch, self.critic, role_key="critic", pairs=False)
        if self.critic_warmup_steps >= self.max_steps:
            message = f"critic_warmup_steps = {self.critic_warmup_steps} >= max_steps = {self.max_steps}: the actor never trains"
            issues.append(ConfigIssue("critic_warmup_steps", message, "set it below max_steps"))
        return issues


SamplingMode = Literal["rollout", "validation"]
