"""The algorithm registries: names, needs, the generated messages, and the shared PolicyLoss over every loss type.

The estimators' golden values are in ``test_algorithms_estimators.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from roll.core import columns as C
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.estimators import AdvantageInputs, EstimatorParams, estimate_advantages
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.algorithms.registry import ESTIMATORS, POLICY_LOSSES
from roll.workers.types import ForwardOutput

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown advantage estimator 'ppo2'[\s\S]*gae: [\s\S]*gigpo: "):
        estimate_advantages("ppo2", AdvantageInputs(torch.ones(1), torch.ones(1, 1)), EstimatorParams())
    with pytest.raises(ConfigError, match=r"unknown policy loss 'a2c'[\s\S]*ppo: [\s\S]*topr: "):
        POLICY_LOSSES.entry("a2c")
    assert ESTIMATORS.entry("gae").needs == {"critic"} and "groups" in ESTIMATORS.entry("rloo").needs


def test_pipelines_reject_an_unsupported_estimator_with_the_generated_message() -> None:
    from roll.core.config.loader import load_config
    from roll.pipelines.rlvr import RLVRConfig

    with pytest.raises(ConfigError) as rlvr:
        load_config(EXAMPLES / "quickstart.yaml", ["algorithm.adv_estimator=gigpo"], model=RLVRConfig)
    text = str(rlvr.value)
    assert "advantage estimator 'gigpo' is not supported by the rlvr pipeline (it needs groups)" in text
    assert ESTIMATORS.entry("rloo").line() in text  # the supported ones, with their descriptions


@pytest.mark.parametrize("loss_type", POLICY_LOSSES.names)
def test_policy_loss_applies_tis_for_every_loss_type(loss_type: str) -> None:
    """The shared PolicyLoss (rlvr and agentic) reads ``infer_logp_BT`` when ``tis_cap`` is set: trainer and
    sampler log-probs differ by log 4 per token, so the weight exp(log 4) = 4 is capped at 2 everywhere
    (``tis_mean`` 2, ``tis_clip_frac`` 1). Without the column no TIS metric appears."""
    algo = preset_config("grpo", kl_mode="none", kl_coef=0.0, loss_type=loss_type, tis_cap=2.0)
    loss_fn = PolicyLoss(algo, norm_len=2, use_old_logp=False)
    logp_BT = torch.full((2, 2), -1.0, requires_grad=True)
    mb = {C.RESPONSE_MASK: torch.ones(2, 2), C.ADVANTAGES: torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
          C.INFER_LOGP: torch.full((2, 2), -1.0 - math.log(4.0))}  # fmt: skip
    _, metrics = loss_fn(ForwardOutput(logp_BT), mb)
    assert float(metrics["tis_mean"]) == pytest.approx(2.0) and float(metrics["tis_clip_frac"]) == 1.0
    _, plain = loss_fn(ForwardOutput(logp_BT), {k: v for k, v in mb.items() if k != C.INFER_LOGP})
    assert "tis_mean" not in plain
