"""``roll.strategy`` entry points of roll-workers: the ``hf`` inference and ``fsdp2`` training strategies.

Light module: the specs name config models from :mod:`roll.workers.config`; torch and transformers are imported
only when ``build`` runs.
"""

from __future__ import annotations

from typing import Any

from roll.core.types import StrategySpec
from roll.workers.config import FSDP2Config, HFInferConfig


def _build_hf(config: HFInferConfig, model: Any, **kwargs: Any) -> Any:
    """Build :class:`roll.workers.hf_infer.HFInferStrategy` (kwargs: ``tokenizer``, ``eos_token_ids``)."""
    from roll.workers.hf_infer import HFInferStrategy

    return HFInferStrategy(model, config, **kwargs)


def _build_fsdp2(config: FSDP2Config, model: Any, **kwargs: Any) -> Any:
    """Build :class:`roll.workers.fsdp2.FSDP2TrainStrategy` (kwargs: ``total_steps``)."""
    from roll.workers.fsdp2 import FSDP2TrainStrategy

    return FSDP2TrainStrategy(model, config, **kwargs)


HF = StrategySpec(
    name="hf",
    kind="infer",
    config_model=HFInferConfig,
    build=_build_hf,
    description="KV-cached decode loop over a transformers causal LM (CPU or one GPU)",
)

FSDP2 = StrategySpec(
    name="fsdp2",
    kind="train",
    config_model=FSDP2Config,
    build=_build_fsdp2,
    description="torch FSDP2 data-parallel training (gloo on CPU, NCCL on GPU); plain module at world size 1",
)
