"""Config of on-policy distillation: the RLVR config plus teachers (routed by sample tag) and the advantage mix.

Light: pydantic only. See :mod:`roll.pipelines.distill.onpolicy` for the algorithm and
:mod:`roll.pipelines.distill.onpolicy_spec` for the plugin spec.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.pipelines.common.config import TrainRoleConfig
from roll.pipelines.distill import TeacherWarmupConfig
from roll.pipelines.rlvr.config import RLVRConfig


class OnPolicyTeacherConfig(TrainRoleConfig):
    """One teacher: its placement and model, the sample tags it scores (``None``: every tag no other teacher
    claims), and an optional SFT warm-up (its ``strategy`` is used only there)."""

    tags: list[str] | None = Field(
        None, description="sample tags this teacher scores; unset: every unclaimed tag"
    )
    warmup: TeacherWarmupConfig | None = Field(
        None, description="SFT of this teacher before the run; unset: none"
    )


class OnPolicyDistillSettings(RollModel):
    """``advantage_BT = distill_coef * D_BT + rl_coef * rl_advantage_BT``, ``D`` built from the per-token
    negative log-ratio ``r_t = -(logp_student - logp_teacher)`` (see
    :func:`~roll.pipelines.algorithms.distill.distill_advantages`).

    ``rl_coef = 0`` is pure on-policy distillation (the reward still gets logged); ``clip`` bounds ``r_t``
    (``None``: unbounded); ``gamma`` sums the future ``r`` discounted (``1``: the gradient of the reverse KL of
    whole sequences; ``0``: the per-token reverse KL, ``D_t = r_t``); ``advantage_baseline`` subtracts the mean of
    ``D`` over the batch's response tokens (``batch_mean``) and also divides by its std (``whiten``).
    The defaults (``gamma: 1``, ``batch_mean``) learned fastest on the built-in task (see
    ``examples/distill_onpolicy.yaml``).
    """

    distill_coef: float = Field(
        1.0, ge=0, description="weight of the teacher log-ratio term in the advantage"
    )
    rl_coef: float = Field(0.0, ge=0, description="weight of the RL (reward) advantage; 0: pure distillation")
    clip: float | None = Field(
        None, gt=0, description="bound on the per-token log-ratio r_t; None: unbounded"
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="discount of future r_t (1: whole-sequence reverse KL, 0: per token)"
    )
    advantage_baseline: Literal["none", "batch_mean", "whiten"] = Field(
        "batch_mean",
        description="subtract the batch mean of D (batch_mean), and also divide by its std (whiten)",
    )


class OnPolicyDistillConfig(RLVRConfig):
    """Config of ``distill_onpolicy``: everything of ``rlvr`` plus ``teachers`` (role ``teacher_<name>`` each)
    and ``onpolicy``."""

    pipeline: str = "distill_onpolicy"
    teachers: dict[str, OnPolicyTeacherConfig] = Field(min_length=1)
    onpolicy: OnPolicyDistillSettings = Field(default_factory=OnPolicyDistillSettings)

    @model_validator(mode="after")
    def _routes(self) -> Self:
        issues: list[ConfigIssue] = []
        seen: dict[str, str] = {}
        defaults = [name for name, t in self.teachers.items() if t.tags is None]
        if len(defaults) > 1:
            message = f"teachers {defaults} all have tags: null (the default teacher); at most one may"
            issues.append(ConfigIssue("teachers", message, "give every teacher but one a list of tags"))
        for name, teacher in self.teachers.items():
            for tag in teacher.tags or []:
                if tag in seen:
                    message = f"tag {tag!r} is routed to both teachers {seen[tag]!r} and {name!r}"
                    issues.append(
                        ConfigIssue(f"teachers.{name}.tags", message, "each tag goes to one teacher")
                    )
                seen[tag] = name
        if self.onpolicy.distill_coef == 0 and self.onpolicy.rl_coef == 0:
            issues.append(ConfigIssue("onpolicy", "distill_coef and rl_coef are both 0: nothing to learn"))
        if issues:
            raise issues_error(issues)
        return self
