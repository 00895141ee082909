"""Direct preference optimisation: DPO (sigmoid), conservative DPO (label smoothing), IPO and SimPO on preference
pairs, and KTO on unpaired completions labelled desirable or not (or on pairs, split into two such rows).

Roles: ``actor_train`` (the policy) and, when ``reference.mode: worker``, a frozen ``reference`` that scores every
batch. ``reference.mode: precompute`` instead scores every pair once with the initial policy before the first step
(the reference *is* the initial policy) and keeps those log-probs in the checkpoint, saving the second model's
memory and forward passes. SimPO needs no reference. Batches count pairs: ``batch.prompts_per_step`` pairs,
``samples_per_prompt: 2``; for KTO they count completions (``samples_per_prompt: 1``).
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
from roll.workers.config import HFInferConfig
from roll.workers.roles.config import InferStrategyConfig, ModelConfig


class ReferenceConfig(RoleConfig):
    """Where reference log-probs come from. ``model=None`` means the actor's initial model."""

    mode: Literal["precompute", "worker"] = Field(
        "precompute",
        description="precompute: score every pair once before training; worker: a reference actor scores each step",
    )
    model: ModelConfig | None = Field(
        None, description="the reference model; unset: the actor's initial model"
    )
    strategy: InferStrategyConfig = Field(
        default_factory=HFInferConfig, description="the strategy that scores (forward only); type hf or vllm"
    )


class DPOLossConfig(RollModel):
    """``type: sigmoid`` is DPO (``label_smoothing > 0``: conservative DPO); ``ipo`` is IPO; ``simpo`` is SimPO
    (reference-free, length-normalized, margin ``simpo_gamma``); ``kto`` is KTO on unpaired completions labelled
    desirable or not (``desirable_weight``, ``undesirable_weight``).

    ``average_logp`` uses per-token mean response log-probs; default (None): on for IPO, as its authors do, and
    for SimPO, which is defined with them; off for DPO and KTO, as their papers do. ``beta`` defaults to 0.1, and
    to 2.0 for SimPO (the paper's range is 2 to 2.5; its log-probs are per token, so its beta is larger).
    """

    type: Literal["sigmoid", "ipo", "simpo", "kto"] = Field(
        "sigmoid",
        description="sigmoid: DPO; ipo: IPO's squared loss; simpo: SimPO (no reference); kto: KTO on unpaired rows",
    )
    beta: float = Field(
        0.1, gt=0, description="strength of the implicit KL to the reference; simpo default 2.0"
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="sigmoid/simpo only: assumed share of flipped labels (conservative DPO)",
    )
    average_logp: bool | None = Field(
        None, description="use mean per-token response log-probs; unset: on for ipo and simpo, off otherwise"
    )
    simpo_gamma: float = Field(1.0, ge=0, description="SimPO's target reward margin")
    desirable_weight: float = Field(1.0, gt=0, description="KTO's weight of desirable completions (lambda_D)")
    undesirable_weight: float = Field(1.0, gt=0, description="KTO's weight of undesirable ones (lambda_U)")

    @model_validator(mode="before")
    @classmethod
    def _loss_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "simpo":
            return {"beta": 2.0, **data}
        return data

    def issues(self) -> list[ConfigIssue]:
        """Keys that contradict ``type`` (reported by :class:`DPOConfig` with its own, all at once)."""
        issues = []
        if self.label_smoothing and self.type not in ("sigmoid", "simpo"):
            message = f"label smoothing is a DPO / SimPO option, not {self.type}"
            issues.append(ConfigIssue("loss.label_smoothing", message, "set it to 0"))
        if self.type == "simpo" and self.average_logp is False:
            message = "SimPO is defined on length-normalized log-probs (its reward is beta times the mean token log-prob)"
            issues.append(ConfigIssue("loss.average_logp", message, "remove average_logp (or set it true)"))
        for key, loss in (
            ("simpo_gamma", "simpo"),
            ("desirable_weight", "kto"),
            ("undesirable_weight", "kto"),
        ):
            if getattr(self, key) != type(self).model_fields[key].default and self.type != loss:
                message = f"{key} applies to type {loss!r}, not {self.type!r}"
                issues.append(ConfigIssue(f"loss.{key}", message, f"remove {key}"))
        return issues

    @property
    def averages(self) -> bool:
        return self.type in ("ipo", "simpo") if self.average_logp is None else self.average_logp

    @property
    def needs_reference(self) -> bool:
        return self.type != "simpo"


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

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        """``reference.strategy_name`` (a plugin name beside no config) became the ``reference.strategy``
        section, whose ``type`` names the plugin."""
        return {"reference.strategy_name": "reference.strategy.type"}

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        kto = self.loss.type == "kto"
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=not kto)
        issues += self.loss.issues()
        if kto and self.batch.samples_per_prompt != 1:
            message = f"KTO trains on single completions (unpaired rows), so a row is 1 sequence; got {self.batch.samples_per_prompt}"
            hint = "set batch.samples_per_prompt: 1 (prompts_per_step counts completions; a pair gives 2)"
            issues.append(ConfigIssue("batch.samples_per_prompt", message, hint))
        if kto and self.batch.prompts_per_step < 2:
            message = (
                "KTO's reference point is estimated from mismatched completions of other rows in the step"
            )
            issues.append(ConfigIssue("batch.prompts_per_step", message, "use at least 2 rows a step"))
        if not self.loss.needs_reference and self.reference.mode == "worker":
            message = "SimPO is reference-free: a reference worker would score every batch for nothing"
            issues.append(ConfigIssue("reference.mode", message, "remove reference.mode (or use precompute)"))
        if issues:
            raise issues_error(issues)
        return self


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.common.checks import offline_preflight

    return offline_preflight("preference", role="actor_train")(config)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.dpo.pipeline import DPORecipe

    return Run(config, name="dpo", recipe=lambda host: DPORecipe(config, host))


SPEC = PipelineSpec(
    name="dpo",
    config_model=DPOConfig,
    build=_build,
    preflight=_preflight,
    description="DPO / cDPO / IPO / SimPO on preference pairs, KTO on unpaired completions; reference worker or "
    "precomputed log-probs",
    export=OFFLINE_EXPORT,
)
