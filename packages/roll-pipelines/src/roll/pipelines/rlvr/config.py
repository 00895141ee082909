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
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.workers.config import FSDP2Config, HFInferConfig
from roll.workers.roles.config import ModelConfig

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
    model: ModelConfig
    actor_train: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=1))
    actor_infer: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=1))
    reference: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.5))
    critic: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.5))
    # The critic (algorithm.use_critic): a backbone with a one-output value head whose head starts random.
    critic_model: ModelConfig | None = Field(
        None, description="default: model (the actor before any warm-up)"
    )
    critic_train: FSDP2Config | None = Field(None, description="default: train")
    critic_warmup_steps: int = Field(
        0, ge=0, description="first RL steps train the critic only, so no advantage comes from a random head"
    )
    train_strategy: str = "fsdp2"
    train: FSDP2Config = Field(default_factory=FSDP2Config)
    infer_strategy: str = "hf"
    infer: dict[str, Any] = Field(
        default_factory=lambda: HFInferConfig().model_dump(),
        description="config of infer_strategy (HFInferConfig fields for hf, VLLMConfig fields for vllm)",
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

    @property
    def needs_reference(self) -> bool:
        return self.algorithm.kl_mode != "none"

    @property
    def needs_critic(self) -> bool:
        return self.algorithm.use_critic

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self.batch.check(self.actor_train.num_workers, where="actor_train.num_workers")
        issues += self.algorithm.check(self.batch.samples_per_prompt)
        issues += ESTIMATORS.unsupported(self.algorithm.adv_estimator, SUPPORTED_ESTIMATORS, pipeline="rlvr")
        issues += self._tag_issues() + self._strategy_issues() + self._critic_issues()
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

    def _critic_issues(self) -> list[ConfigIssue]:
        issues = []
        if not self.needs_critic:
            given: dict[str, object] = {"critic_model": self.critic_model, "critic_train": self.critic_train}
            given["critic_warmup_steps"] = self.critic_warmup_steps or None
            for key in [k for k, v in given.items() if v is not None]:
                message = f"{key} is set but algorithm.use_critic is false, so no critic runs"
                hint = f"remove {key}, or use a critic preset (algorithm.preset=ppo)"
                issues.append(ConfigIssue(key, message, hint))
            return issues
        issues += self.batch.check(self.critic.num_workers, where="critic.num_workers")
        if self.critic_warmup_steps >= self.max_steps:
            message = f"critic_warmup_steps = {self.critic_warmup_steps} >= max_steps = {self.max_steps}: the actor never trains"
            issues.append(ConfigIssue("critic_warmup_steps", message, "set it below max_steps"))
        return issues

    def _strategy_issues(self) -> list[ConfigIssue]:
        if self.infer_strategy == "hf":
            try:
                HFInferConfig.model_validate(self.infer)
            except ValueError as exc:
                return [ConfigIssue("infer", f"not a valid hf inference config: {exc}")]
        return []


SamplingMode = Literal["rollout", "validation"]
