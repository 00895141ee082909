"""Config of the ``megatron`` training strategy. Light module: pydantic only, no torch or Megatron."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.workers.config import OptimizerConfig, SchedulerConfig


class MegatronConfig(RollModel):
    """Megatron-Core tensor/pipeline-parallel training of a Qwen2/Llama-family decoder.

    The world (``torch.distributed``) must hold ``tensor_parallel_size * pipeline_parallel_size * dp`` ranks; the
    data-parallel size is what remains. Every rank of one pipeline (its TP and PP peers) receives the same batch.

    - ``layer_spec``: ``local`` uses Megatron-Core's own modules (no Transformer Engine needed);
      ``transformer_engine`` uses TE's fused kernels (install TE yourself; it is not part of the extra).
    - ``precision``: ``bf16`` keeps bf16 weights with fp32 main weights and gradients in the optimizer; ``fp32``
      trains in full precision (slow on GPUs, for equivalence tests); ``auto`` is bf16 on CUDA and fp32 on CPU (where
      the strategy runs over gloo when no GPU is visible: :mod:`roll.workers.megatron_device`).
    - ``micro_batch_size`` rows per micro-batch (``None``: one micro-batch per step). With pipeline parallelism
      every micro-batch is padded to the same ``[rows, tokens]`` shape, because stages exchange fixed-shape tensors.
    - ``max_grad_norm``: Megatron's ``clip_grad``; ``None`` disables clipping.
    """

    type: Literal["megatron"] = Field("megatron", description="selects this strategy")
    tensor_parallel_size: int = Field(1, ge=1, description="ranks each layer's weights are split over")
    pipeline_parallel_size: int = Field(1, ge=1, description="stages the layers are split over")
    layer_spec: Literal["local", "transformer_engine"] = Field(
        "local", description="local: Megatron-Core's own modules; transformer_engine: TE's fused kernels"
    )
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="auto: bf16 on CUDA, fp32 on CPU; bf16 weights with fp32 main weights; or full fp32",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping norm; None disables it")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="rows per micro-batch; pipelines fill it from batch.micro_batch_samples (leave it unset)",
    )
    use_distributed_optimizer: bool = Field(
        True, description="shard optimizer state over data-parallel ranks (Megatron's distributed optimizer)"
    )
    vocab_multiple: int = Field(128, ge=1, description="Megatron's make_vocab_size_divisible_by")
    seed: int = Field(1234, description="seed of Megatron's model-parallel RNG tracker")

    def parallel_sizes(self) -> tuple[int, int, int]:
        """``(tp, pp, cp)``: how the role's cluster lays out its ranks (``roll.core.cluster.Mesh``)."""
        return self.tensor_parallel_size, self.pipeline_parallel_size, 1

    @model_validator(mode="after")
    def _pipeline_needs_micro_batches(self) -> MegatronConfig:
        if self.pipeline_parallel_size > 1 and self.micro_batch_size is None:
            raise ValueError(
                "pipeline_parallel_size > 1 needs micro_batch_size (a pipeline overlaps stages across "
                "micro-batches; one micro-batch per step would leave all but one stage idle)"
            )
        return self
