"""``best_of_n``: answer every prompt ``n`` times, score the answers with RLVR's reward plugins, keep the best one.

The kept answers (``best_of_n.jsonl``: prompt, response, ground truth, score and all ``n`` scores) are rejection-
sampling data: an SFT set of the model's own best answers. The metrics say what picking the best bought:
``best_of_n/best_score`` (mean over prompts of the best score) against ``best_of_n/mean_score`` (mean of all).

The spec's module is light (the config model and the spec); :mod:`.pipeline` holds the run, imported by ``build``
only, so ``roll validate`` and ``roll list`` never import torch.
"""

from __future__ import annotations

from pydantic import Field

from roll.core.config.sections import RunConfig
from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.data.config import DataConfig, TokenizeConfig
from roll.pipelines.rlvr.config import RewardDomainConfig
from roll.workers.roles.config import InferRoleConfig, ModelConfig


class SampledModelConfig(InferRoleConfig):
    """The sampled model: placement, an infer strategy and ``model``, required here (in modes that train,
    an inference role's model defaults to the trained one; this mode trains none)."""

    model: ModelConfig


class BestOfNConfig(RunConfig):
    """The ``best_of_n`` run: a :class:`RunConfig` (seed, output_dir, ray, tracking, ...) plus these sections,
    each one of roll's shared config models, so they read and validate as in every other mode."""

    pipeline: str = "best_of_n"
    actor_infer: SampledModelConfig
    cpu_threads: int | None = Field(None, ge=1)
    data: DataConfig
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    rewards: dict[str, RewardDomainConfig] = Field(min_length=1)
    n: int = Field(4, ge=2, description="answers sampled per prompt")
    temperature: float = Field(1.0, gt=0.0, description="> 0: n greedy answers would all be the same")
    max_new_tokens: int = Field(32, ge=1)
    request_prompts: int = Field(8, ge=1, description="prompts per generate request")


def build(config: BestOfNConfig) -> Pipeline:
    """roll.core.types.PipelineBuild: runs in the driver of ``roll train``, after the config is loaded."""
    from roll.core.run import Run
    from roll_example_pipeline.pipeline import BestOfNRecipe

    return Run(config, name="best_of_n", recipe=lambda host: BestOfNRecipe(config, host))


def preflight(config: BestOfNConfig) -> list[ConfigIssue]:
    """rlvr's checks, shared: every reward domain's plugin and options, and the first rows of every data source."""
    from roll.pipelines.preflight import rlvr_preflight

    return rlvr_preflight(config)


SPEC = PipelineSpec(
    name="best_of_n",
    config_model=BestOfNConfig,
    build=build,
    description="sample n answers per prompt, keep the best-scored one (rejection-sampling data)",
    preflight=preflight,
)
