"""Config sections the offline training modes share. Light: pydantic and other config modules only.

Batch sizes are stated once, in ``batch`` (:class:`~roll.core.config.batch.BatchConfig`); the strategy's own
micro-batch fields must stay unset (:func:`batch_issues` says so), and :func:`trainer_spec` derives them.
"""

from __future__ import annotations

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.errors import ConfigIssue
from roll.data.config import DataConfig, DatasetSourceConfig
from roll.workers.roles.config import (
    DEFAULT_MODEL,
    MICRO_BATCH_FIELDS,
    TrainRoleConfig,
    TrainStrategyConfig,
    with_micro_batches,
)
from roll.workers.roles.spec import TrainerSpec

__all__ = [
    "DEFAULT_MODEL",
    "EvalConfig",
    "GenerateEvalConfig",
    "TrainRoleConfig",
    "answer_source",
    "batch_issues",
    "generate_issues",
    "trainer_spec",
]


class EvalConfig(RollModel):
    """Held-out evaluation: ``batch_size`` sequences per forward, at most ``max_rows`` held-out rows."""

    batch_size: int = Field(64, ge=1, description="held-out sequences per evaluation forward")
    max_rows: int | None = Field(
        None, ge=1, description="evaluate the first this many held-out rows; unset: all"
    )


class GenerateEvalConfig(EvalConfig):
    """Evaluation that also scores greedy answers of up to ``max_generate`` held-out prompts with the verifier of
    the held-out ``builtin:`` task (:func:`answer_source`). ``generate`` unset does so when that source is a
    ``builtin:`` task; ``true`` on other data is rejected at load time (:func:`generate_issues`): no verifier
    could score the answers, and a metric that silently never appears is worse than an error."""

    generate: bool | None = Field(
        None,
        description="score greedy answers with the held-out builtin: task's verifier; null: when the first "
        "held-out source is builtin:, true: required (rejected for other data), false: never",
    )
    max_generate: int = Field(64, ge=1, description="held-out prompts answered greedily at most")
    max_new_tokens: int = Field(16, ge=1, description="max tokens of one greedy answer")

    def scores_answers(self, data: DataConfig) -> bool:
        """Whether evaluation scores greedy answers on ``data``'s held-out rows."""
        return self.generate is not False and answer_source(data) is not None


def answer_source(data: DataConfig) -> DatasetSourceConfig | None:
    """The held-out source answers are scored on (the first of ``eval_sources``, else of ``sources``) when it is
    a ``builtin:`` task, whose verifier scores them; else ``None``."""
    source = (data.eval_sources or data.sources)[0]
    return source if source.path.startswith("builtin:") else None


def generate_issues(evaluation: GenerateEvalConfig, data: DataConfig) -> list[ConfigIssue]:
    """``eval.generate: true`` where no verifier can score the answers (the held-out source is no builtin task)."""
    if evaluation.generate is not True or answer_source(data) is not None:
        return []
    key = "data.eval_sources.0" if data.eval_sources else "data.sources.0"
    path = (data.eval_sources or data.sources)[0].path
    message = (
        f"generate: true scores greedy answers with a builtin: task's verifier, but the held-out source {key} "
        f"is {path!r}, which has none"
    )
    hint = "drop eval.generate (the held-out loss is still reported), or hold out a builtin: task"
    return [ConfigIssue("eval.generate", message, hint)]


def batch_issues(
    batch: BatchConfig, role: TrainRoleConfig, *, role_key: str, pairs: bool
) -> list[ConfigIssue]:
    """Everything that makes ``batch`` impossible for ``role``; ``pairs`` asks for whole chosen/rejected pairs."""
    dp = role.data_parallel_size()
    where = f"{role_key}.num_workers" + (
        "" if dp == role.num_workers else " / (tensor x pipeline parallel size)"
    )
    issues = batch.check(dp, where=where)
    for name in MICRO_BATCH_FIELDS:
        if getattr(role.strategy, name, None) is not None:
            issues.append(
                ConfigIssue(
                    f"{role_key}.strategy.{name}",
                    "micro-batches are stated once, in batch.micro_batch_samples / batch.micro_batch_tokens",
                    f"remove {role_key}.strategy.{name}",
                )
            )
    if pairs:
        issues += _pair_issues(batch)
    return issues


def _pair_issues(batch: BatchConfig) -> list[ConfigIssue]:
    issues = []
    if batch.samples_per_prompt != 2:
        issues.append(
            ConfigIssue(
                "batch.samples_per_prompt",
                f"a preference pair is 2 sequences (chosen, rejected); got {batch.samples_per_prompt}",
                "set batch.samples_per_prompt: 2 (prompts_per_step counts pairs)",
            )
        )
    if batch.micro_batch_samples is None or batch.micro_batch_samples % 2:
        issues.append(
            ConfigIssue(
                "batch.micro_batch_samples",
                f"a micro-batch must hold whole pairs (an even number of sequences); got {batch.micro_batch_samples}",
                "set batch.micro_batch_samples to an even number (token budgets could split a pair)",
            )
        )
    return issues


def trainer_spec(role: TrainRoleConfig, batch: BatchConfig, max_steps: int) -> TrainerSpec:
    """What an offline mode's trained role builds: ``role``'s model and strategy, the strategy's micro-batch size
    taken from ``batch``, and an LR schedule as long as ``max_steps`` steps of ``batch``'s optimizer steps."""
    strategy: TrainStrategyConfig = with_micro_batches(
        role.strategy, batch.micro_batch_samples, batch.micro_batch_tokens
    )
    return TrainerSpec(
        model=role.model, strategy=strategy, total_steps=max_steps * batch.optimizer_steps_per_step
    )
