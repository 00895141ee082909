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
from roll.core.config.sections import RoleConfig
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.algorithms.registry import ESTIMATORS
from roll.pipelines.policy.config import PolicyRunConfig

SUPPORTED_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
"""The estimators RLVR runs (GiGPO needs the step-level rows of agentic runs)."""


class RolloutConfig(RollModel):
    """How rollouts are sampled and scheduled (see :mod:`roll.core.scheduler.generate`)."""

    max_new_tokens: int = Field(32, ge=1, description="max tokens of one sampled response")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 disables it")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens; 0 disables it")
    request_prompts: int = Field(8, ge=1, description="prompts per generation request sent to one worker")
    max_inflight_per_rank: int = Field(
        2, ge=1, description="generation requests one inference rank holds at once"
    )
    max_rounds: int = Field(4, ge=1, description="dynamic sampling: rounds of oversampling before filling")
    async_generation_ratio: float = Field(
        0.0, ge=0, description="0: sync; r > 0: generate up to r steps ahead while training"
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="max policy-version lag of a trained sample (with partial: of its oldest token); default "
        "ceil(ratio)",
    )
    partial: bool = Field(
        False,
        description="partial rollout (async modes only): samples are generated in segments of "
        "partial_segment_tokens, so a weight update interrupts long samples, which continue from their prefix "
        "under the new weights; every token records the policy version that sampled it; in-flight prompts and "
        "partial responses are checkpointed",
    )
    partial_segment_tokens: int = Field(
        32,
        ge=1,
        description="partial rollout: the most tokens a sample gets per generation request (the points where "
        "a weight update can come in; smaller cuts in sooner, at the cost of one prefill and one resubmission "
        "per segment: on 2 CPU cores, 32 of 96 new tokens was level with step_ahead where 8 was slower than sync)",
    )
    async_mode: Literal["stream", "step_ahead"] = Field(
        "stream",
        description="stream: a generator thread keeps up to ratio steps of groups ready (timing decides which "
        "groups a step gets and which weights made them, so two runs of one config differ and a resume is not "
        "exact); step_ahead (ratio 1): the next step's batch generates on this step's weights while it trains "
        "and the sync waits for it: one update stale, reproducible, resumed exactly",
    )


class ValidationConfig(RollModel):
    """Generation on held-out prompts every ``eval_every`` steps (``data.eval_*`` supplies them): greedy, one
    answer per prompt, by default; ``samples_per_prompt: k`` with a temperature adds ``mean@k``, ``pass@k`` and
    ``maj@k`` (:mod:`roll.pipelines.common.sampled_eval`), overall and per domain."""

    num_prompts: int = Field(
        64, ge=1, description="held-out prompts evaluated: the first N of data's eval split"
    )
    temperature: float = Field(0.0, ge=0, description="0 is greedy decoding")
    max_new_tokens: int | None = Field(None, ge=1, description="default: rollout.max_new_tokens")
    samples_per_prompt: int = Field(
        1, ge=1, description="answers per prompt (k): > 1 logs mean@k, pass@k, maj@k; needs a temperature > 0"
    )

    @model_validator(mode="after")
    def _sampled(self) -> Self:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            message = f"samples_per_prompt = {self.samples_per_prompt} greedy answers would all be the same"
            hint = (
                "set validation.temperature > 0 (the rollout's, often 0.6 to 1.0), or samples_per_prompt: 1"
            )
            raise issues_error([ConfigIssue("samples_per_prompt", message, hint)], title="ValidationConfig")
        return self


class RewardDomainConfig(RollModel):
    """One reward domain: a ``roll.reward`` plugin, the tags routed to it, and its workers.

    ``options`` are the plugin's config fields (validated against its config model when the run builds).
    ``tags`` unset (``null``): the default domain, which takes every row no other domain's tags route (every row,
    when it is the only domain). At most one domain may leave it unset.
    """

    type: str = Field(
        min_length=1, description="roll.reward entry point: arithmetic, math, code_sandbox, ..."
    )
    tags: list[str] | None = Field(
        None, min_length=1, description="the row tags it scores; unset: every row no other domain takes"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the reward plugin's own keys (see rewards), validated at build time",
    )
    workers: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=1, cpus_per_worker=0.1))


class WarmupConfig(RollModel):
    """An SFT warm-up on ``actor_train`` before RL: teaches the answer format so RL has a signal to amplify."""

    steps: int = Field(20, ge=1, description="SFT optimizer steps before RL")
    batch_size: int = Field(32, ge=1, description="rows per warm-up step (the data repeats when it runs out)")
    lr: float | None = Field(None, gt=0, description="default: the RL optimizer's lr")
    data: DataConfig


class CurriculumConfig(RollModel):
    """Raise the difficulty of the one generated training source when the step's accuracy passes a threshold.

    Level ``l`` is ``difficulty: l`` of a ``reasoning_gym:<task>`` source or ``builtin_options.level: l`` of a
    ``builtin:<task>`` one; a pool of ``max_samples`` rows per level is generated at setup. After each step the
    mean of ``metric`` over the last ``window`` steps at the current level is compared with ``threshold`` (the
    rule is :class:`roll.data.procedural.AccuracyCurriculum`); prompts fed after a raise come from the next level.
    """

    levels: int = Field(ge=2, description="levels 0 .. levels - 1")
    start: int = Field(0, ge=0, description="the level the run starts at")
    threshold: float = Field(
        0.8, gt=0, le=1, description="raise the level when the window's mean metric reaches this"
    )
    window: int = Field(4, ge=1, description="steps whose mean metric decides a raise")
    metric: Literal["reward/accuracy", "reward/mean"] = Field(
        "reward/accuracy", description="the step metric the rule watches"
    )


class RLVRConfig(PolicyRunConfig):
    """Config of the ``rlvr`` pipeline. Roles: ``actor_train``, ``actor_infer``, ``reference`` (when the KL term
    needs it), ``critic`` (``algorithm.use_critic``: PPO's GAE), and ``reward_<domain>`` per entry of
    ``rewards``."""

    pipeline: str = "rlvr"
    batch: BatchConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    rewards: dict[str, RewardDomainConfig] = Field(min_length=1)
    warmup: WarmupConfig | None = None
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    plot: bool = Field(True, description="write reward/accuracy PNG (plot.png) at the end of the run")
    curriculum: CurriculumConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        r = self.rollout
        issues = self.policy_issues(
            async_ratio=r.async_generation_ratio, async_key="rollout.async_generation_ratio"
        )
        issues += ESTIMATORS.unsupported(self.algorithm.adv_estimator, SUPPORTED_ESTIMATORS, pipeline="rlvr")
        issues += self._tag_issues() + self._async_issues() + self._curriculum_issues()
        if issues:
            raise issues_error(issues)
        return self

    def _tag_issues(self) -> list[ConfigIssue]:
        return reward_routing_issues(self.rewards)

    def _async_issues(self) -> list[ConfigIssue]:
        r = self.rollout
        if r.partial and r.async_generation_ratio == 0:
            message = (
                "partial rollout interrupts generation for a weight update, which only an async mode has"
            )
            hint = (
                "set rollout.async_generation_ratio > 0 (async_mode stream or step_ahead), or partial: false"
            )
            return [ConfigIssue("rollout.partial", message, hint)]
        if r.async_mode == "step_ahead" and r.async_generation_ratio != 1:
            message = f"async_mode step_ahead generates exactly one step ahead; async_generation_ratio is {r.async_generation_ratio:g}"
            return [
                ConfigIssue(
                    "rollout.async_generation_ratio", message, "set it to 1, or use async_mode: stream"
                )
            ]
        return []

    def _curriculum_issues(self) -> list[ConfigIssue]:
        cur = self.curriculum
        if cur is None:
            return []
        issues = []
        if cur.start >= cur.levels:
            message = f"start level {cur.start} is outside 0..{cur.levels - 1}"
            issues.append(ConfigIssue("curriculum.start", message, "lower it or raise curriculum.levels"))
        if len(self.data.sources) != 1:
            message = f"a curriculum drives one generated source; data.sources has {len(self.data.sources)}"
            issues.append(ConfigIssue("data.sources", message, "keep one reasoning_gym:/builtin: source"))
            return issues
        src = self.data.sources[0]
        if not src.path.startswith(("reasoning_gym:", "builtin:")):
            message = f"{src.path!r} is not generated, so it has no difficulty levels"
            issues.append(
                ConfigIssue("data.sources.0.path", message, "use reasoning_gym:<task> or builtin:<task>")
            )
        # A builtin task takes either a level or explicit options (digits, num_ops, ...), never both: the
        # curriculum sets the level, so any option of the source's own would fail when the pools are built.
        keys = ["difficulty"] if src.difficulty is not None else []
        keys += [f"builtin_options.{k}" for k in src.builtin_options]
        for key in keys:
            message = "the curriculum sets the level of every pool"
            issues.append(ConfigIssue(f"data.sources.0.{key}", message, "drop it; use curriculum.start"))
        return issues


def reward_routes(rewards: dict[str, RewardDomainConfig]) -> tuple[dict[str, str], str | None]:
    """``(tag -> domain, default domain)``: the domain without ``tags`` takes every other row (None: no default)."""
    routes = {tag: name for name, d in rewards.items() for tag in d.tags or []}
    default = next((name for name, d in rewards.items() if d.tags is None), None)
    return routes, default


def reward_routing_issues(rewards: dict[str, RewardDomainConfig]) -> list[ConfigIssue]:
    """A tag routed to two domains, or more than one default domain (no ``tags``)."""
    seen: dict[str, str] = {}
    issues = []
    for name, domain in rewards.items():
        for tag in domain.tags or []:
            if tag in seen:
                message = f"tag {tag!r} is routed to both {seen[tag]!r} and {name!r}"
                issues.append(ConfigIssue(f"rewards.{name}.tags", message, "each tag goes to one domain"))
            seen[tag] = name
    defaults = [name for name, d in rewards.items() if d.tags is None]
    if len(defaults) > 1:
        message = f"reward domains {defaults} all leave `tags` unset (each would take every untagged row)"
        issues.append(ConfigIssue("rewards", message, "give every domain but one a list of tags"))
    return issues
