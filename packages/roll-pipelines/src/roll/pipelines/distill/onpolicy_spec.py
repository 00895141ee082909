"""The ``distill_onpolicy`` plugin spec (entry point ``roll.pipeline``): RLVR's pipeline under its own name with the
:class:`~roll.pipelines.distill.onpolicy.OnPolicyDistill` transform.

Light: the config is :mod:`.onpolicy_config` (pydantic only); ``build`` imports the implementation. The spec sits in
a module of its own so that the implementation, which imports the config, is never imported back by it.
"""

from __future__ import annotations

from typing import Any

from roll.core.errors import ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.pipelines.common.exporter import POLICY_EXPORT
from roll.pipelines.distill.onpolicy_config import OnPolicyDistillConfig


def _preflight(config: Any) -> list[ConfigIssue]:
    from roll.pipelines.preflight import rlvr_preflight

    return rlvr_preflight(config)


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.pipelines.distill.onpolicy import OnPolicyDistill
    from roll.pipelines.rlvr.pipeline import RLVRRecipe

    transform = OnPolicyDistill(config)
    return Run(
        config, name="distill_onpolicy", recipe=lambda host: RLVRRecipe(config, host, transform=transform)
    )


SPEC = PipelineSpec(
    name="distill_onpolicy",
    config_model=OnPolicyDistillConfig,
    build=_build,
    preflight=_preflight,
    description="on-policy distillation: RLVR rollouts, advantage from -(logp_student - logp_teacher) per token",
    export=POLICY_EXPORT,
)
