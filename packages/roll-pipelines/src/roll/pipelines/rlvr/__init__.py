"""The ``rlvr`` pipeline: RL with verifiable rewards (GRPO, DAPO, RLOO, REINFORCE++, GSPO, TOPR, CISPO ...).

This module is light (config and spec only; no torch, no Ray): ``roll validate`` and ``roll list`` load it in
milliseconds. :mod:`.pipeline` holds the implementation (its losses are :mod:`roll.pipelines.algorithms.losses`),
:mod:`.reward_worker` the reward actors, :mod:`.metrics` and :mod:`.plot` what a run reports. Entry point:
``rlvr = "roll.pipelines.rlvr:SPEC"`` in the ``roll.pipeline`` group.
"""

from __future__ import annotations

from typing import Any

from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.pipelines.common.exporter import POLICY_EXPORT
from roll.pipelines.rlvr.config import (
    RewardDomainConfig,
    RLVRConfig,
    RolloutConfig,
    ValidationConfig,
    WarmupConfig,
)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.rlvr.pipeline import RLVRRecipe

    return Run(config, name="rlvr", recipe=lambda host: RLVRRecipe(config, host))


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.preflight import rlvr_preflight

    return rlvr_preflight(config)


def _explain(config: Any) -> list[str]:
    from roll.pipelines.preflight import rlvr_explain

    return rlvr_explain(config)


SPEC = PipelineSpec(
    name="rlvr",
    config_model=RLVRConfig,
    build=_build,
    preflight=_preflight,
    explain=_explain,
    description="RL with verifiable rewards: rollouts, reward workers by domain, any algorithm preset",
    export=POLICY_EXPORT,
)

VLM_SPEC = PipelineSpec(
    name="rlvr_vlm",
    config_model=RLVRConfig,
    build=_build,
    preflight=_preflight,
    explain=_explain,
    description="rlvr on image prompts (the same pipeline: rows with `images` + a VLM such as tiny-vl-1m)",
    export=POLICY_EXPORT,
)
"""The name ROLL users know for RLVR on images. ``rlvr`` itself takes image rows; this alias says so in
``roll list`` and builds the same pipeline."""

__all__ = [
    "SPEC",
    "VLM_SPEC",
    "RLVRConfig",
    "RewardDomainConfig",
    "RolloutConfig",
    "ValidationConfig",
    "WarmupConfig",
]
