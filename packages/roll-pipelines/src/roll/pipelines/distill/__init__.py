"""Knowledge distillation: a frozen teacher's top-k logits teach a (smaller) student.

Off-policy KD (the ``distill`` pipeline, :mod:`.pipeline`): each step reads SFT rows, the ``teacher`` role
(:class:`~roll.workers.roles.teacher.TeacherWorker`) computes its top-``k`` logits at every position, the logits
transfer hands each student rank the rows it holds (``transfer: object_store`` through the driver and Ray's object
store, or ``collective``: teacher ranks send to student ranks point to point over a gloo/NCCL group), and the
``student`` role minimizes ``kd_weight * divergence + (1 - kd_weight) * cross-entropy``
(:class:`~.losses.DistillLoss` over :func:`~roll.pipelines.algorithms.divergence.distill_loss`). The optional
``teacher_warmup`` phase first fine-tunes the teacher by SFT (so the built-in example has a teacher worth copying)
and exports it; a resumed run reuses the export.

On-policy distillation (the student samples, teachers score its tokens, the advantage is the negative
log-ratio): :mod:`.onpolicy`.

Teacher and student must share a tokenizer (their distributions are compared token id by token id); setup
compares both tokenizers and names both model paths when they differ.

This module holds only the configs and the spec (no torch, no Ray).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sections import RunConfig
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
from roll.pipelines.algorithms.choices import DivergenceName
from roll.pipelines.common.config import GenerateEvalConfig, TrainRoleConfig, batch_issues, generate_issues
from roll.pipelines.common.exporter import DISTILL_EXPORT
from roll.workers.roles.config import ModelConfig

DEFAULT_TEACHER = "tiny-10m"


def _default_data() -> DataConfig:
    src = {"path": "builtin:arithmetic", "builtin_kind": "sft"}
    return DataConfig(
        sources=[DatasetSourceConfig(**src, max_samples=2048)],
        eval_sources=[DatasetSourceConfig(**src, split="eval", max_samples=64)],
    )


class DistillLossConfig(RollModel):
    """What the student minimizes: ``kd_weight * divergence + (1 - kd_weight) * cross-entropy``.

    ``top_k`` teacher tokens per position carry the divergence (both distributions renormalized over them, see
    :mod:`roll.pipelines.algorithms.divergence`). ``alpha`` is the skew of the skewed KLs, ``beta`` the JS
    weight, ``mu`` the adaptive KL's head mass. ``distill_prompt`` distills every predicted token, prompt
    included (the cross-entropy stays on the response).
    """

    divergence: DivergenceName = Field(
        "forward_kl",
        description="the student-teacher divergence (forward/reverse KL, skewed KLs, js, adaptive_kl)",
    )
    top_k: int = Field(64, ge=1, description="teacher tokens per position sent to the student and compared")
    kd_weight: float = Field(
        1.0, ge=0, le=1, description="weight of the divergence; 1 - kd_weight goes to the cross-entropy"
    )
    student_temperature: float = Field(
        1.0, gt=0, description="temperature of the student's logits in the divergence"
    )
    teacher_temperature: float = Field(
        1.0, gt=0, description="temperature of the teacher's logits in the divergence"
    )
    alpha: float = Field(
        0.1, ge=0, lt=1, description="skew of skew_forward_kl / skew_reverse_kl (0: plain KL)"
    )
    beta: float = Field(0.5, gt=0, lt=1, description="js: the generalized JSD's weight (0.5: the usual JSD)")
    mu: float = Field(0.5, gt=0, le=1, description="adaptive_kl: teacher probability mass of the head tokens")
    distill_prompt: bool = Field(
        False, description="distill prompt tokens too (the cross-entropy stays on the response)"
    )


class TeacherWarmupConfig(RollModel):
    """SFT of the teacher before distillation, ``steps`` steps of ``batch_size`` rows of ``data`` at ``lr``.

    ``data`` defaults to the run's ``data``. The result is exported to ``<output_dir>/teacher_warmup`` and used
    as the teacher; a resumed run finds it there and skips the phase. ``cache: true`` exports it to the user's
    cache dir instead, keyed on the recipe (teacher role, these settings, the seed, the training rows' content;
    see :mod:`.warmup`), so every later run of the same recipe skips the phase. The key names a teacher by its
    path: leave ``cache`` off for a local folder whose weights change.
    """

    steps: int = Field(60, ge=1, description="SFT optimizer steps of the teacher")
    lr: float = Field(3e-3, gt=0, description="the teacher's learning rate during its warm-up")
    batch_size: int = Field(32, ge=1, description="rows per warm-up step")
    micro_batch_samples: int | None = Field(None, ge=1, description="default: batch_size")
    data: DataConfig | None = Field(None, description="warm-up data; unset: the run's data")
    cache: bool = Field(
        False, description="keep the warmed teacher in the user's cache, keyed on the recipe, for later runs"
    )


class DistillEvalConfig(GenerateEvalConfig):
    """Held-out KL to the teacher (every ``eval_every`` steps) and, on a ``builtin:`` task, greedy answer accuracy
    of the student on up to ``max_generate`` held-out prompts (see :class:`GenerateEvalConfig`)."""


def _default_teacher() -> TrainRoleConfig:
    return TrainRoleConfig(model=ModelConfig(path=DEFAULT_TEACHER))


class DistillConfig(RunConfig):
    """Config of the ``distill`` pipeline. Roles: ``student`` (trained) and ``teacher`` (frozen; its ``strategy``
    is used only by ``teacher_warmup``)."""

    pipeline: str = "distill"
    student: TrainRoleConfig = Field(default_factory=TrainRoleConfig)
    teacher: TrainRoleConfig = Field(default_factory=_default_teacher)
    teacher_warmup: TeacherWarmupConfig | None = None
    distill: DistillLossConfig = Field(default_factory=DistillLossConfig)
    transfer: Literal["object_store", "collective"] = Field(
        "object_store",
        description="how teacher top-k logits reach the students: via the driver and Ray's object store, or "
        "point to point over a gloo/NCCL group",
    )
    data: DataConfig = Field(default_factory=_default_data)
    tokenize: TokenizeConfig = Field(default_factory=lambda: TokenizeConfig(max_length=128))
    batch: BatchConfig = Field(
        default_factory=lambda: BatchConfig(prompts_per_step=32, micro_batch_samples=16)
    )
    eval: DistillEvalConfig = Field(default_factory=DistillEvalConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = batch_issues(self.batch, self.student, role_key="student", pairs=False)
        issues += self._warmup_issues() + generate_issues(self.eval, self.data)
        if issues:
            raise issues_error(issues)
        return self

    def _warmup_issues(self) -> list[ConfigIssue]:
        warm = self.teacher_warmup
        if warm is None or warm.micro_batch_samples is None:
            return []
        per_worker, rest = divmod(warm.batch_size, self.teacher.num_workers)
        if rest == 0 and per_worker % warm.micro_batch_samples == 0:
            return []
        message = (
            f"batch_size {warm.batch_size} / teacher.num_workers {self.teacher.num_workers} must be a whole "
            f"multiple of micro_batch_samples {warm.micro_batch_samples}"
        )
        return [ConfigIssue("teacher_warmup.micro_batch_samples", message)]


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.common.checks import offline_preflight

    return offline_preflight("sft", role="student")(config)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.distill.pipeline import DistillRecipe

    return Run(config, name="distill", recipe=lambda host: DistillRecipe(config, host))


SPEC = PipelineSpec(
    name="distill",
    config_model=DistillConfig,
    build=_build,
    preflight=_preflight,
    description="knowledge distillation from a teacher's top-k logits (KL family, JS, adaptive KL; CE mixing)",
    export=DISTILL_EXPORT,
)

VLM_SPEC = PipelineSpec(
    name="distill_vlm",
    config_model=DistillConfig,
    build=_build,
    preflight=_preflight,
    description="distill on image rows (the same pipeline: rows with `images`, VLM teacher and student)",
    export=DISTILL_EXPORT,
)
"""Top-k distillation from a VLM teacher: ``distill`` itself takes image rows; this alias says so in ``roll list``."""

__all__ = [
    "SPEC",
    "VLM_SPEC",
    "DistillConfig",
    "DistillEvalConfig",
    "DistillLossConfig",
    "TeacherWarmupConfig",
]
