"""Direct preference optimisation: DPO (sigmoid), conservative DPO (label smoothing) and IPO on preference pairs.

Roles: ``actor_train`` (the policy) and, when ``reference.mode: worker``, a frozen ``reference`` that scores every
batch. ``reference.mode: precompute`` instead scores every pair once with the initial policy before the first step
(the reference *is* the initial policy) and keeps those log-probs in the checkpoint, saving the second model's
memory and forward passes. Batches count pairs: ``batch.prompts_per_step`` pairs, ``samples_per_prompt: 2``.
Pairs whose chosen equals rejected are skipped (and counted). Every step logs its batch's reward accuracy (chosen's
implicit reward higher), reward margin and mean chosen/rejected rewards (``train/*``, measured before the update);
evaluation reports the same on held-out pairs, with the held-out loss.

This module holds only the config and the spec (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig, issues_error
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.common.config import EvalConfig, TrainRoleConfig, batch_issues
from roll.pipelines.common.exporter import OFFLINE_EXPORT
from roll.pipelines.common.preference import default_pair_batch, default_pair_data
from roll.workers.roles.config import ModelConfig


class ReferenceConfig(RoleConfig):
    """Where reference log-probs come from. ``model=None`` means the actor's initial model."""

    mode: Literal["precompute", "worker"] = Field(
        "precompute",
        description="precompute: score every pair once before training; worker: a reference actor scores each step",
    )
    model: ModelConfig | None = Field(
        None, description="the reference model; unset: the actor's initial model"
    )
    strategy_name: str = Field("hf", description="a roll.strategy plugin; 'hf' scores forward-only")


class DPOLossConfig(RollModel):
    """``type: sigmoid`` is DPO (``label_smoothing > 0``: conservative DPO); ``type: ipo`` is IPO.

    ``average_logp`` uses per-token mean response log-probs; default (None): on for IPO, as its authors do, off
    for DPO, as the DPO paper does.
    """

    type: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid: DPO; ipo: IPO's squared loss")
    beta: float = Field(0.1, gt=0, description="strength of the implicit KL to the reference")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="sigmoid only: assumed share of flipped labels (conservative DPO)"
    )
    average_logp: bool | None = Field(
        None, description="use mean per-token response log-probs; unset: on for ipo, off for sigmoid"
    )

    @property
    def averages(self) -> bool:
        return self.type == "ipo" if self.average_logp is None else self.average_logp


class DPOConfig(RunConfig):
    """Config of the ``dpo`` pipeline."""

    pipeline: str = "dpo"
    actor_train: TrainRoleConfig = Field(default_factory=TrainRoleConfig)
    reference: ReferenceConfig = Field(default_factory=lambda: ReferenceConfig(cpus_per_worker=0.5))
    loss: DPOLossConfig = Field(default_factory=DPOLossConfig)
    data: DataConfig = Field(default_factory=default_pair_data)
    tokenize: TokenizeConfig = Field(default_factory=lambda: TokenizeConfig(max_length=128))
    batch: BatchConfig = Field(default_factory=default_pair_batch)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=True)
        if self.loss.type == "ipo" and self.loss.label_smoothing:
            issues.append(
                ConfigIssue(
                    "loss.label_smoothing", "label smoothing is a DPO (sigmoid) option", "set it to 0"
                )
            )
        if issues:
            raise issues_error(issues)
        return self


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.common.checks import offline_preflight

    return offline_preflight("preference", role="actor_train")(config)


def _build(config: Any) -> Pipeline:
    from roll.pipelines.dpo.pipeline import DPOPipeline

    return DPOPipeline(config)


SPEC = PipelineSpec(
    name="dpo",
    config_model=DPOConfig,
    build=_build,
    preflight=_preflight,
    description="DPO / conservative DPO / IPO on preference pairs, reference worker or precomputed log-probs",
    export=OFFLINE_EXPORT,
)
