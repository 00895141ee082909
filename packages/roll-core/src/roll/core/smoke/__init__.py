"""The smoke pipeline: the whole runtime on a problem small enough to finish in seconds on a laptop CPU.

Two data-parallel Ray actors fit a linear regression with gradients all-reduced over real ``torch.distributed``
(gloo), batches dispatched with ``Dispatch.DP_SPLIT``, metrics reduced across workers and tracked, checkpoints
written atomically and resumed exactly. It proves an installation works before any model is downloaded; the
training modes of roll-pipelines replace it as the main job.

This module holds only the config and the spec (no torch, no Ray); :mod:`.pipeline` has the implementation.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.batch import BatchConfig
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.config.validate import issues_error
from roll.core.types import Pipeline, PipelineSpec


class SmokeConfig(RunConfig):
    """Config of the smoke pipeline."""

    pipeline: str = "smoke"
    workers: RoleConfig = Field(default_factory=lambda: RoleConfig(num_workers=2, cpus_per_worker=0.5))
    batch: BatchConfig = Field(
        default_factory=lambda: BatchConfig(prompts_per_step=64, micro_batch_samples=8)
    )
    features: int = Field(8, ge=1, description="input dimension of the linear regression")
    lr: float = Field(0.1, gt=0, description="learning rate of each worker's optimizer")
    noise: float = Field(
        0.01, ge=0, description="std of the Gaussian noise on the targets (the loss floor is its square)"
    )

    @model_validator(mode="after")
    def _batch_fits_workers(self) -> Self:
        issues = self.batch.check(self.workers.num_workers, where="workers.num_workers")
        if issues:
            raise issues_error(issues)
        return self


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.core.smoke.pipeline import SmokeRecipe

    return Run(config, name="smoke", recipe=lambda host: SmokeRecipe(config, host))


SPEC = PipelineSpec(
    name="smoke",
    config_model=SmokeConfig,
    build=_build,
    description="runtime smoke test: data-parallel linear regression on Ray actors",
)
