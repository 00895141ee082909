"""Batch sizes, stated once, globally, in one unit (samples = sequences); everything else is derived.

Four numbers describe a step (the top confusion in verl and TRL is stating the same thing three ways):

- ``prompts_per_step`` (P): prompts drawn per training step;
- ``samples_per_prompt`` (G): responses generated per prompt (the GRPO group size; 1 for SFT/DPO-style runs);
- ``samples_per_optimizer_step``: sequences one optimizer step consumes, summed over all data-parallel
  workers. Default P × G: one optimizer step per training step. Smaller values take several optimizer steps
  per training step (PPO-style mini-batches);
- the micro-batch each worker runs forward/backward on: either ``micro_batch_samples`` (fixed size, so
  gradient accumulation steps are fixed) or ``micro_batch_tokens`` (a token budget: dynamic batching packs
  as many sequences as fit, so the number of micro-batches varies). Exactly one.

Derived: ``samples_per_step = P × G``; ``optimizer_steps_per_step = samples_per_step /
samples_per_optimizer_step``; per data-parallel worker and optimizer step, ``samples_per_optimizer_step / dp``
samples in ``that / micro_batch_samples`` micro-batches. Checks that need only these numbers run when the model
validates; checks that need the data-parallel size run in :meth:`BatchConfig.check`, which pipelines call from
their own config's ``model_validator`` with their role sizes (see :func:`roll.core.config.validate.issues_error`).
Every rejection spells out its arithmetic and proposes numbers that work.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isqrt
from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.validate import issues_error

__all__ = ["BatchConfig", "DerivedBatch", "issues_error"]
from roll.core.config.yaml_tree import join
from roll.core.errors import ConfigError, ConfigIssue


@dataclass(frozen=True)
class DerivedBatch:
    """The batch arithmetic for one data-parallel size. ``grad_accumulation_steps`` is None under dynamic
    batching (``micro_batch_tokens``), where the number of micro-batches depends on sequence lengths."""

    dp_size: int
    samples_per_step: int
    samples_per_optimizer_step: int
    optimizer_steps_per_step: int
    samples_per_worker: int
    micro_batch_samples: int | None
    micro_batch_tokens: int | None
    grad_accumulation_steps: int | None


def _one_optimizer_step(data: dict[str, Any]) -> int:
    # Called only when prompts_per_step and samples_per_prompt validated; otherwise pydantic skips it.
    return int(data["prompts_per_step"]) * int(data["samples_per_prompt"])


class BatchConfig(RollModel):
    """How many samples a step generates and trains on (see the module docstring for the arithmetic)."""

    prompts_per_step: int = Field(ge=1, description="P: prompts per training step")
    samples_per_prompt: int = Field(1, ge=1, description="G: samples (responses) per prompt")
    samples_per_optimizer_step: int = Field(
        default_factory=_one_optimizer_step,
        ge=1,
        description="sequences per optimizer step over all workers; default P × G (one optimizer step per step)",
    )
    micro_batch_samples: int | None = Field(None, ge=1, description="sequences per micro-batch per worker")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="token budget per micro-batch per worker (dynamic batching)"
    )

    @property
    def samples_per_step(self) -> int:
        """P × G: the sequences one training step generates and trains on."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def optimizer_steps_per_step(self) -> int:
        """How many optimizer steps one training step takes (whole: checked at validation)."""
        return self.samples_per_step // self.samples_per_optimizer_step

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self._micro_batch_issues() + self._optimizer_step_issues()
        if issues:
            raise issues_error(issues, title=type(self).__name__)
        return self

    def _micro_batch_issues(self) -> list[ConfigIssue]:
        given = [
            name for name in ("micro_batch_samples", "micro_batch_tokens") if getattr(self, name) is not None
        ]
        if len(given) == 1:
            return []
        state = "both are set" if given else "neither is set"
        message = f"set exactly one of micro_batch_samples or micro_batch_tokens; {state}"
        hint = "micro_batch_samples fixes the micro-batch size; micro_batch_tokens is a token budget (dynamic batching)"
        return [ConfigIssue("micro_batch_samples", message, hint)]

    def _optimizer_step_issues(self) -> list[ConfigIssue]:
        total, per_opt = self.samples_per_step, self.samples_per_optimizer_step
        if total % per_opt == 0:
            return []
        message = (
            f"samples_per_step = prompts_per_step × samples_per_prompt = {self.prompts_per_step} × "
            f"{self.samples_per_prompt} = {total} is not a multiple of samples_per_optimizer_step = {per_opt}"
        )
        hint = f"use a divisor of {total}: {_or(_nearest_divisors(total, per_opt))}"
        return [ConfigIssue("samples_per_optimizer_step", message, hint)]

    def check(
        self, dp_size: int, *, where: str, path: str = "batch", max_seq_len: int | None = None
    ) -> list[ConfigIssue]:
        """Issues that make this batch impossible on ``dp_size`` data-parallel workers (empty: it fits).

        ``where`` names the key that set ``dp_size`` (``actor_train.num_workers``) for the message; ``path`` is
        where this section sits, relative to the model that calls (issue paths are ``path.<field>``). With
        ``max_seq_len``, a token budget smaller than one sequence is rejected too.
        """
        if dp_size < 1:
            return [ConfigIssue(where, f"{where} = {dp_size}: need at least one data-parallel worker")]
        per_opt = self.samples_per_optimizer_step
        if per_opt % dp_size:
            return [self._dp_issue(dp_size, where, path)]
        per_worker = per_opt // dp_size
        if self.micro_batch_samples is not None and per_worker % self.micro_batch_samples:
            return [self._micro_issue(dp_size, per_worker, path)]
        budget = self.micro_batch_tokens
        if budget is not None and max_seq_len is not None and budget < max_seq_len:
            message = f"micro_batch_tokens = {budget} is less than max_seq_len = {max_seq_len}: a sequence would not fit"
            return [ConfigIssue(join(path, "micro_batch_tokens"), message, f"use at least {max_seq_len}")]
        return []

    def _dp_issue(self, dp_size: int, where: str, path: str) -> ConfigIssue:
        per_opt = self.samples_per_optimizer_step
        below = per_opt // dp_size * dp_size
        options = [n for n in (below, below + dp_size) if n > 0]
        message = (
            f"samples_per_optimizer_step {per_opt} / {dp_size} data-parallel workers ({where}) is not whole; "
            f"use {_or(options)}"
        )
        hint = f"or set {where} to a divisor of {per_opt}: {', '.join(map(str, _divisors(per_opt)))}"
        return ConfigIssue(join(path, "samples_per_optimizer_step"), message, hint)

    def _micro_issue(self, dp_size: int, per_worker: int, path: str) -> ConfigIssue:
        micro = self.micro_batch_samples
        message = (
            f"samples per worker per optimizer step = samples_per_optimizer_step / data-parallel workers = "
            f"{self.samples_per_optimizer_step} / {dp_size} = {per_worker} is not a multiple of "
            f"micro_batch_samples = {micro}; use {_or(_nearest_divisors(per_worker, micro or 1))}"
        )
        return ConfigIssue(join(path, "micro_batch_samples"), message)

    def per_worker(self, dp_size: int) -> DerivedBatch:
        """The derived sizes on ``dp_size`` workers; raises :class:`ConfigError` when :meth:`check` fails."""
        issues = self.check(dp_size, where="dp_size")
        if issues:
            raise ConfigError(issues=issues)
        per_worker = self.samples_per_optimizer_step // dp_size
        micro = self.micro_batch_samples
        return DerivedBatch(
            dp_size=dp_size,
            samples_per_step=self.samples_per_step,
            samples_per_optimizer_step=self.samples_per_optimizer_step,
            optimizer_steps_per_step=self.optimizer_steps_per_step,
            samples_per_worker=per_worker,
            micro_batch_samples=micro,
            micro_batch_tokens=self.micro_batch_tokens,
            grad_accumulation_steps=per_worker // micro if micro is not None else None,
        )


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _nearest_divisors(n: int, near: int) -> list[int]:
    """The divisors of ``n`` just below and just above ``near`` (one of them when ``near`` is out of range)."""
    divisors = _divisors(n)
    below = [d for d in divisors if d < near][-1:]
    above = [d for d in divisors if d > near][:1]
    return below + above


def _or(numbers: list[int]) -> str:
    return " or ".join(map(str, numbers))
