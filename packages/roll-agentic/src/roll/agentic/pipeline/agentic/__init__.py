"""The ``agentic`` pipeline: multi-turn RL on text envs with the RLVR-family algorithms and GiGPO.

One step: roll out ``batch.prompts_per_step`` groups of ``batch.samples_per_prompt`` envs (the env manager),
normalize rewards (``algorithm.reward_norm``: by batch, group, tag or running statistics), estimate advantages (the
``algorithm`` preset's estimator over episode groups, or, with ``algorithm.adv_estimator: gigpo``, GiGPO's episode
+ anchor-state groups in step mode; both through
:func:`roll.pipelines.algorithms.estimators.estimate_advantages`), train ``actor_train``, push the weights to
``actor_infer``. An optional SFT ``warmup`` first teaches the answer *format* on env prompts with uniformly random
valid actions (RL starts from a policy that answers but knows nothing of the task), or imitates a noisy expert
(``warmup.expert_fraction``: that share of answers is the env's expert action, the rest random).

This module holds only the config and ``SPEC`` (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.agentic.env_manager.check import env_preflight
from roll.agentic.pipeline.config import AgenticRunConfig
from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sampling import SamplingConfig, moved_sampling_keys, upgrade_sampling
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.common.exporter import POLICY_EXPORT
from roll.pipelines.policy.config import MOVED_KEYS as POLICY_MOVED_KEYS
from roll.pipelines.policy.config import PolicyRunConfig
from roll.workers.roles.config import ModelConfig

__all__ = ["MOVED_KEYS", "SPEC", "AgenticConfig", "StepAheadRolloutConfig", "WarmupConfig"]

SUPPORTED_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo")
"""The estimators agentic runs (``gae`` with the ``critic`` role)."""


MOVED_KEYS = {
    **POLICY_MOVED_KEYS,  # the policy's layout, not the rollout pipeline's (model -> actor_infer.model)
    "async_generation_ratio": "rollout.async_generation_ratio",
    "reward_norm": "algorithm.reward_norm",
    "gigpo": "algorithm.gigpo (with algorithm.adv_estimator: gigpo)",
    **moved_sampling_keys("env_manager"),
}
"""Keys of older agentic layouts and their place now: the RL modes share one key path per setting (rlvr's)."""


class StepAheadRolloutConfig(SamplingConfig):
    """How agentic rollouts are sampled and scheduled: the key paths are rlvr's (``rollout.max_new_tokens``,
    ``rollout.temperature``, ``rollout.top_p``, ``rollout.async_generation_ratio``), the values the ones the env
    manager supports (synchronous, or exactly one step ahead)."""

    async_generation_ratio: Literal[0, 1] = Field(
        0,
        description="1: roll out step t+1 on the current weights while step t trains (staleness exactly 1; the "
        "pending rollout is checkpointed); 0: synchronous",
    )


class WarmupConfig(RollModel):
    """SFT on env prompts (first states) answered in the answer format: by default with a uniformly random valid
    action (the format, not the task); with ``expert_fraction`` > 0, that fraction of answers imitates the env's
    expert (``info["expert_action"]``), so the warm-up policy is a noisy expert that RL then sharpens."""

    steps: int = Field(20, ge=1, description="SFT optimizer steps before RL")
    batch_size: int = Field(32, ge=1, description="rows per warm-up step")
    lr: float | None = Field(None, gt=0, description="default: the RL optimizer's lr")
    answer_template: str = Field("<answer>{action}</answer>", description="how an action is written")
    expert_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="share of answers that take the env's expert action (info key)"
    )


def _default_algorithm() -> AlgorithmConfig:
    return AlgorithmConfig(preset="grpo", kl_mode="none", loss_agg_mode="token-mean")


class AgenticConfig(AgenticRunConfig, PolicyRunConfig):
    """Config of the ``agentic`` pipeline. Roles: ``actor_train``, ``actor_infer``, ``env_workers``, and
    ``reference`` (when the KL term needs it) and ``critic`` (``algorithm.use_critic``: PPO's GAE)."""

    pipeline: str = "agentic"
    batch: BatchConfig = Field(
        default_factory=lambda: BatchConfig(prompts_per_step=8, samples_per_prompt=4, micro_batch_samples=32)
    )
    algorithm: AlgorithmConfig = Field(default_factory=_default_algorithm)
    rollout: StepAheadRolloutConfig = Field(default_factory=StepAheadRolloutConfig)
    warmup: WarmupConfig | None = None
    plot: bool = Field(True, description="write the success-rate curve (plot.png) at the end of the run")

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return dict(MOVED_KEYS)

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A config an older agentic run saved, in today's layout: its top-level ``async_generation_ratio``,
        ``reward_norm`` (it won over ``algorithm.reward_norm`` unless ``none``) and ``gigpo`` (set, it meant
        ``adv_estimator: gigpo``) move under ``rollout`` and ``algorithm``, ``env_manager.{max_new_tokens,
        temperature,top_p}`` under ``rollout``."""
        data = upgrade_sampling(dict(data), "env_manager")
        rollout, algorithm = dict(data.get("rollout") or {}), dict(data.get("algorithm") or {})
        if "async_generation_ratio" in data:
            rollout.setdefault("async_generation_ratio", data.pop("async_generation_ratio"))
        reward_norm = data.pop("reward_norm", None)
        if reward_norm not in (None, "none"):
            algorithm["reward_norm"] = reward_norm
        gigpo = data.pop("gigpo", None)
        if gigpo is not None:
            algorithm.update(adv_estimator="gigpo", gigpo=gigpo)
        return {**data, "rollout": rollout, "algorithm": algorithm}

    @property
    def policy_model(self) -> ModelConfig:
        """The trained policy's model (``actor_train.model``); ``actor_infer`` serves it."""
        return self.actor_train.model

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self.policy_issues(
            async_ratio=self.rollout.async_generation_ratio, async_key="rollout.async_generation_ratio"
        )
        issues += self._algorithm_issues() + self._gigpo_issues()
        if issues:
            raise issues_error(issues)
        return self

    def _algorithm_issues(self) -> list[ConfigIssue]:
        a, issues = self.algorithm, []
        issues += ESTIMATORS.unsupported(a.adv_estimator, SUPPORTED_ESTIMATORS, pipeline="agentic")
        for key in ("overlong_filter", "overlong_penalty"):
            if getattr(a, key):
                issues.append(
                    ConfigIssue(f"algorithm.{key}", f"{key} is an RLVR option", f"set {key}: false")
                )
        return issues

    def _gigpo_issues(self) -> list[ConfigIssue]:
        if self.algorithm.adv_estimator == "gigpo" and self.env_manager.mode != "step":
            message = "GiGPO's step-level groups need one sample per step"
            hint = "set env_manager.mode: step, or another algorithm.adv_estimator"
            return [ConfigIssue("algorithm.adv_estimator", message, hint)]
        return []


def _build(config: Any) -> Pipeline:
    from roll.agentic.pipeline.agentic.pipeline import AgenticRecipe
    from roll.core.run import Run

    return Run(config, name="agentic", recipe=lambda host: AgenticRecipe(config, host))


SPEC = PipelineSpec(
    name="agentic",
    config_model=AgenticConfig,
    build=_build,
    description="multi-turn RL on text envs (GRPO-family presets, GiGPO), env workers on Ray",
    preflight=env_preflight,
    export=POLICY_EXPORT,
)
