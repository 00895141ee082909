"""Supervised fine-tuning: token cross-entropy on the assistant turns of conversations or prompt/response rows.

One role, ``actor_train`` (data-parallel :class:`~roll.workers.roles.actor.ActorTrainWorker` ranks with an extra
evaluation method). Each step reads the next ``batch.prompts_per_step`` rows (epoch-shuffled, position saved in
checkpoints), trains on them, and every ``eval_every`` steps reports held-out loss, token accuracy and, on a
built-in task, the accuracy of greedy answers. ``actor_train.strategy.packed: true`` trains padding-free.

This module holds only the config and the spec (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.batch import BatchConfig, issues_error
from roll.core.config.sections import RunConfig
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
from roll.pipelines.common.config import (
    GenerateEvalConfig,
    TrainRoleConfig,
    batch_issues,
    generate_issues,
)
from roll.pipelines.common.exporter import OFFLINE_EXPORT


def _default_data() -> DataConfig:
    src = {"path": "builtin:arithmetic", "builtin_kind": "sft"}
    return DataConfig(
        sources=[DatasetSourceConfig(**src, max_samples=2048)],
        eval_sources=[DatasetSourceConfig(**src, split="eval", max_samples=64)],
    )


class SFTEvalConfig(GenerateEvalConfig):
    """SFT evaluation: held-out loss and token accuracy; answers scored as :class:`GenerateEvalConfig` says."""


class SFTConfig(RunConfig):
    """Config of the ``sft`` pipeline."""

    pipeline: str = "sft"
    actor_train: TrainRoleConfig = Field(default_factory=TrainRoleConfig)
    data: DataConfig = Field(default_factory=_default_data)
    tokenize: TokenizeConfig = Field(default_factory=lambda: TokenizeConfig(max_length=128))
    batch: BatchConfig = Field(
        default_factory=lambda: BatchConfig(prompts_per_step=32, micro_batch_samples=16)
    )
    eval: SFTEvalConfig = Field(default_factory=SFTEvalConfig)

    @model_validator(mode="after")
    def _batch_fits(self) -> Self:
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=False)
        issues += generate_issues(self.eval, self.data)
        if issues:
            raise issues_error(issues)
        return self


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.common.checks import offline_preflight

    return offline_preflight("sft", role="actor_train")(config)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.sft.pipeline import SFTRecipe

    return Run(config, name="sft", recipe=lambda host: SFTRecipe(config, host))


SPEC = PipelineSpec(
    name="sft",
    config_model=SFTConfig,
    build=_build,
    preflight=_preflight,
    description="supervised fine-tuning (padded or packed) with held-out loss, token and answer accuracy",
    export=OFFLINE_EXPORT,
)
