"""The ``agentic`` pipeline: multi-turn RL on text envs with the RLVR-family algorithms and GiGPO.

One step: roll out ``batch.prompts_per_step`` groups of ``batch.samples_per_prompt`` envs (the env manager),
normalize rewards (by batch, group, tag or running statistics), estimate advantages (the ``algorithm`` preset's
estimator over episode groups, or GiGPO's episode + anchor-state groups in step mode; both through
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
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.pipelines.algorithms.choices import RewardNorm
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.common.exporter import POLICY_EXPORT
from roll.pipelines.policy.config import MOVED_KEYS, PolicyRunConfig
from roll.workers.roles.config import ModelConfig

__all__ = ["SPEC", "AgenticConfig", "GiGPOConfig", "WarmupConfig"]

SUPPORTED_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo")
"""The estimators agentic runs (``gae`` with the ``critic`` role)."""


class GiGPOConfig(RollModel):
    """GiGPO (Feng et al. 2025): ``A = A_episode + step_weight * A_step``; needs ``env_manager.mode: step``."""

    step_weight: float = Field(1.0, ge=0, description="weight of the step-level (anchor state) advantage")
    norm_by_std: bool = Field(True, description="divide both advantages by their group's std (GRPO style)")


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
    gigpo: GiGPOConfig | None = None
    reward_norm: RewardNorm = Field(
        "none", description="normalize episode rewards (as algorithm.reward_norm; either may be set)"
    )
    warmup: WarmupConfig | None = None
    async_generation_ratio: Literal[0, 1] = Field(
        0,
        description="1: roll out step t+1 on the current weights while step t trains (staleness exactly 1; the "
        "pending rollout is checkpointed); 0: synchronous",
    )
    plot: bool = Field(True, description="write the success-rate curve (plot.png) at the end of the run")

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return dict(
            MOVED_KEYS
        )  # the policy's layout, not the rollout pipeline's (model -> actor_infer.model)

    @property
    def policy_model(self) -> ModelConfig:
        """The trained policy's model (``actor_train.model``); ``actor_infer`` serves it."""
        return self.actor_train.model

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self.policy_issues(
            async_ratio=self.async_generation_ratio, async_key="async_generation_ratio"
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
        if "none" not in (a.reward_norm, self.reward_norm) and a.reward_norm != self.reward_norm:
            message = f"reward_norm={self.reward_norm!r} and algorithm.reward_norm={a.reward_norm!r} disagree"
            issues.append(ConfigIssue("algorithm.reward_norm", message, "set one of them"))
        return issues

    @property
    def estimator(self) -> str:
        """The estimator run: GiGPO when the ``gigpo`` section is set, else ``algorithm.adv_estimator``."""
        return "gigpo" if self.gigpo is not None else self.algorithm.adv_estimator

    @property
    def reward_norm_mode(self) -> RewardNorm:
        """``reward_norm`` or ``algorithm.reward_norm``, whichever is set (they may not disagree)."""
        return self.reward_norm if self.reward_norm != "none" else self.algorithm.reward_norm

    def _gigpo_issues(self) -> list[ConfigIssue]:
        if self.estimator == "gigpo" and self.env_manager.mode != "step":
            message = "GiGPO's step-level groups need one sample per step"
            return [ConfigIssue("gigpo", message, "set env_manager.mode: step, or remove gigpo")]
        return []


def _build(config: Any) -> Pipeline:
    from roll.agentic.pipeline.agentic.pipeline import AgenticPipeline

    return AgenticPipeline(config)


SPEC = PipelineSpec(
    name="agentic",
    config_model=AgenticConfig,
    build=_build,
    description="multi-turn RL on text envs (GRPO-family presets, GiGPO), env workers on Ray",
    preflight=env_preflight,
    export=POLICY_EXPORT,
)
