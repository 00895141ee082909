"""``roll.strategy`` entry points of the GPU-only backends: ``vllm`` (inference) and ``megatron`` (training).

Light module: it names config models and imports neither vLLM, Megatron nor torch; ``build`` imports the backend
and, when it is missing, raises :class:`~roll.core.errors.PluginError` naming the extra to install.
"""

from __future__ import annotations

from typing import Any

from roll.core.types import StrategySpec
from roll.workers.megatron_config import MegatronConfig
from roll.workers.vllm_config import VLLMConfig


def _build_vllm(config: VLLMConfig, model: Any, **kwargs: Any) -> Any:
    """Build :class:`roll.workers.vllm_infer.VLLMInferStrategy`; ``model`` is a hub name or a local folder."""
    from roll.workers.vllm_infer import VLLMInferStrategy

    return VLLMInferStrategy(model, config, **kwargs)


def _build_megatron(config: MegatronConfig, model: Any, **kwargs: Any) -> Any:
    """Build :class:`roll.workers.megatron_train.MegatronTrainStrategy` (kwargs: ``total_steps``)."""
    from roll.workers.megatron_train import MegatronTrainStrategy

    return MegatronTrainStrategy(model, config, **kwargs)


VLLM = StrategySpec(
    name="vllm",
    kind="infer",
    config_model=VLLMConfig,
    build=_build_vllm,
    description="vLLM AsyncLLM engine: request-level generation, sleep/wake, weight updates by RPC/IPC/NCCL",
    extra="vllm",
)

MEGATRON = StrategySpec(
    name="megatron",
    kind="train",
    config_model=MegatronConfig,
    build=_build_megatron,
    description="Megatron-Core tensor/pipeline-parallel training of Qwen2/Llama-family models",
    extra="megatron",
)
