"""The config keys every RL mode that trains a policy shares (rlvr, agentic, on-policy distillation).

:class:`PolicyRunConfig` holds the model roles a :class:`~roll.pipelines.policy.group.PolicyGroup` builds
(``actor_train``, ``actor_infer``, ``reference``, ``critic``), their placement, the batch sizes and the algorithm,
and the checks that concern them: micro-batches stated once, critic keys without a critic, a critic warm-up that
leaves the actor untrained, async generation on shared devices, keys of the old layout. A mode's config subclasses
it and adds its own sections (data and rewards; envs). Light: pydantic only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.errors import ConfigIssue
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.pipelines.common.config import batch_issues
from roll.workers.roles.config import (
    CriticRoleConfig,
    InferRoleConfig,
    ModelConfig,
    TrainRoleConfig,
    model_parallel_problem,
)

Placement = Literal["separate", "hybrid"]

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


HYBRID_SHARED = ("num_workers", "gpus_per_worker", "device_group", "node", "model")
"""``actor_infer`` keys whose value placement hybrid takes from ``actor_train`` (its generator runs inside
actor_train's actors): an ``actor_infer`` value that differs would be silently unused. ``cpus_per_worker`` and
``call_timeout_s`` are not among them: actor_train's apply, and a config written for separate actors keeps working
with ``placement=hybrid``."""


class SyncCheckConfig(RollModel):
    """The check after a weight sync (:mod:`roll.pipelines.policy.sync_check`): one prompt decoded greedily by the
    generator and scored by the trainer; metrics ``mismatch/sync_logp_diff_{mean,max}``."""

    # Every 10th, not every sync: the probe is two round trips, a 16-token greedy decode and a forward, which at
    # 64 completions of a few tokens was ~40% of a step (benchmarks/bench_small_batch_vs_trl.py). A failed sync
    # still shows within 10 steps (a sync that never worked, at the first), and the per-batch mismatch metrics
    # (actor/mismatch/*) stay every step.
    every: int = Field(10, ge=0, description="check after the first weight sync and every N-th one; 0: never")
    threshold: float = Field(
        0.05, gt=0, description="warn when the probe's mean |log-prob difference| exceeds it"
    )
    warn_every: int = Field(10, ge=1, description="at most one warning per N checks past the threshold")
    max_new_tokens: int = Field(16, ge=1, description="tokens the generator decodes for the probe")


class PolicyRunConfig(RunConfig):
    """See the module docstring. ``reference`` runs when ``algorithm.kl_mode`` is not ``none``, ``critic`` when
    ``algorithm.use_critic``; their ``model`` defaults to ``actor_train``'s (before any warm-up)."""

    actor_train: TrainRoleConfig = Field(default_factory=TrainRoleConfig)
    actor_infer: InferRoleConfig = Field(default_factory=InferRoleConfig)
    reference: InferRoleConfig = Field(default_factory=lambda: InferRoleConfig(cpus_per_worker=0.25))
    critic: CriticRoleConfig = Field(default_factory=lambda: CriticRoleConfig(cpus_per_worker=0.25))
    critic_warmup_steps: int = Field(
        0, ge=0, description="first RL steps train the critic only, so no advantage comes from a random head"
    )
    placement: Placement = Field(
        "separate",
        description="separate: actor_train and actor_infer are their own actors; hybrid: one process holds both "
        "(actor_train's placement, actor_infer's strategy; weight sync in process)",
    )
    cpu_threads: int | None = Field(None, ge=1, description="torch threads per model worker (CPU runs)")
    bucket_mb: float = Field(256.0, gt=0, description="model-update bucket size")
    batch: BatchConfig
    algorithm: AlgorithmConfig = Field(default_factory=lambda: AlgorithmConfig(preset="grpo"))
    sync_check: SyncCheckConfig = Field(
        default_factory=SyncCheckConfig,
        description="after a weight sync, compare one prompt's log-probs on trainer and generator",
    )

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        """Keys of the old layout and their new place."""
        return dict(MOVED_KEYS)

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

    def policy_roles(self) -> dict[str, RoleConfig]:
        """The roles the policy group places: actor_train, actor_infer (unless hybrid), reference, critic."""
        roles: dict[str, RoleConfig] = {"actor_train": self.actor_train}
        if self.placement == "separate":
            roles["actor_infer"] = self.actor_infer
        if self.needs_reference:
            roles["reference"] = self.reference
        if self.needs_critic:
            roles["critic"] = self.critic
        return roles

    def policy_issues(self, *, async_ratio: float, async_key: str) -> list[ConfigIssue]:
        """Everything impossible about the policy roles; ``async_ratio`` at ``async_key`` is the mode's."""
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=False)
        issues += self.algorithm.check(self.batch.samples_per_prompt)
        issues += self._critic_issues()
        if self.placement == "hybrid":
            issues += self._hybrid_issues()
        shared = self.actor_train.device_group is not None and (
            self.actor_train.device_group == self.actor_infer.device_group
        )
        if async_ratio > 0 and (shared or self.placement == "hybrid"):
            message = "async generation overlaps generation with training, but actor_train and actor_infer share devices"
            issues.append(ConfigIssue(async_key, message, "set it to 0, or give actor_infer its own devices"))
        return issues

    def _hybrid_issues(self) -> list[ConfigIssue]:
        """``actor_infer`` values that placement hybrid cannot honour (see :data:`HYBRID_SHARED`)."""
        issues = []
        for key in HYBRID_SHARED:
            mine, theirs = getattr(self.actor_infer, key), getattr(self.actor_train, key)
            if key not in self.actor_infer.model_fields_set or mine is None or mine == theirs:
                continue
            message = (
                f"actor_infer.{key} is {_shown(mine)}, but placement hybrid runs the generator inside "
                f"actor_train's actors, so it takes actor_train.{key} ({_shown(theirs)})"
            )
            hint = (
                f"remove actor_infer.{key}, or use placement: separate to give the generator its own actors"
            )
            issues.append(ConfigIssue(f"actor_infer.{key}", message, hint))
        return issues

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
        critic = self.critic.resolved(self.actor_train)
        problem = model_parallel_problem(critic.num_workers, critic.strategy)
        if problem and self.critic.strategy is None:
            message = f"{problem} (critic.strategy is unset, so the critic trains with actor_train.strategy)"
            hint = (
                "set critic.num_workers to a multiple of tp * pp, or give the critic its own critic.strategy"
            )
            return [*issues, ConfigIssue("critic.num_workers", message, hint)]
        issues += batch_issues(self.batch, critic, role_key="critic", pairs=False)
        if self.critic_warmup_steps >= self.max_steps:
            message = f"critic_warmup_steps = {self.critic_warmup_steps} >= max_steps = {self.max_steps}: the actor never trains"
            issues.append(ConfigIssue("critic_warmup_steps", message, "set it below max_steps"))
        return issues


def _shown(value: object) -> str:
    path = getattr(value, "path", None)  # a ModelConfig: its path says which model
    return repr(path if path is not None else value)
