"""Reward-model training: a sequence-classification head on a causal LM backbone, Bradley-Terry loss on pairs.

One role, ``actor_train`` placed as :class:`~roll.workers.roles.reward_model.RewardModelWorker` ranks (the model
loads as ``AutoModelForSequenceClassification`` with one label; the head starts random, seeded by
``actor_train.model.seed``). Batches count pairs (``samples_per_prompt: 2``); pairs whose chosen equals rejected
are skipped and counted. Evaluation reports the held-out loss, pairwise accuracy (``r_chosen > r_rejected``) and
mean margin. The export loads with ``AutoModelForSequenceClassification``.

This module holds only the config and the spec (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.batch import BatchConfig, issues_error
from roll.core.config.sections import RunConfig
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.common.config import EvalConfig, TrainRoleConfig, batch_issues
from roll.pipelines.common.exporter import REWARD_MODEL_EXPORT
from roll.pipelines.common.preference import default_pair_batch, default_pair_data


class RewardModelConfig(RunConfig):
    """Config of the ``reward_model`` pipeline."""

    pipeline: str = "reward_model"
    actor_train: TrainRoleConfig = Field(default_factory=TrainRoleConfig)
    data: DataConfig = Field(default_factory=default_pair_data)
    tokenize: TokenizeConfig = Field(default_factory=lambda: TokenizeConfig(max_length=128))
    batch: BatchConfig = Field(default_factory=default_pair_batch)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="after")
    def _batch_fits(self) -> Self:
        issues = batch_issues(self.batch, self.actor_train, role_key="actor_train", pairs=True)
        if issues:
            raise issues_error(issues)
        return self


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.common.checks import offline_preflight

    return offline_preflight("preference", role="actor_train")(config)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.reward_model.pipeline import RewardModelRecipe

    return Run(config, name="reward_model", recipe=lambda host: RewardModelRecipe(config, host))


SPEC = PipelineSpec(
    name="reward_model",
    config_model=RewardModelConfig,
    build=_build,
    preflight=_preflight,
    description="Bradley-Terry reward model on preference pairs (sequence-classification head)",
    export=REWARD_MODEL_EXPORT,
)
