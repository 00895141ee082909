"""Config models of the CPU/GPU strategies (hf inference, fsdp2 training) and the sampling parameters.

Light module: imports pydantic only (no torch), so ``roll validate`` stays fast. Every model subclasses
:class:`roll.core.config.base.RollModel` (strict, frozen, unknown keys rejected).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from roll.core.config.base import RollModel

DType = Literal["auto", "float32", "bfloat16", "float16"]
"""``auto`` means bfloat16 on CUDA and float32 on CPU (CPUs have no fast bf16 matmul here)."""


class SamplingParams(RollModel):
    """How to sample one request's continuations.

    ``temperature=0`` is greedy decoding (``top_p``/``top_k``/``seed`` are then irrelevant). Generation stops at the
    first token in ``stop_token_ids`` (plus the model's EOS unless ``ignore_eos``), or when the decoded text of the
    continuation contains one of ``stop_strings`` (needs a tokenizer), or after ``max_new_tokens``. ``seed`` makes a
    call reproducible: the same prompts and params give the same samples.
    """

    n: int = Field(1, ge=1, description="samples per prompt")
    temperature: float = Field(1.0, ge=0.0, description="softmax temperature; 0 is greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1 disables it")
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(32, ge=1, description="max generated tokens per continuation")
    stop_token_ids: list[int] = Field(default_factory=list, description="token ids that end a continuation")
    stop_strings: list[str] = Field(default_factory=list, description="texts that end a continuation")
    ignore_eos: bool = Field(False, description="keep generating past the model's EOS token")
    seed: int | None = Field(None, description="makes the call reproducible; unset: unseeded sampling")


class HFInferConfig(RollModel):
    """The ``hf`` inference strategy: our KV-cached decode loop over a transformers causal LM."""

    type: Literal["hf"] = Field("hf", description="selects this strategy")
    device: str = Field("auto", description="'auto' = cuda when available, else cpu")
    dtype: DType = Field(
        "auto",
        description="compute dtype; auto: bfloat16 on CUDA, float32 on CPU. bfloat16 on a CPU with avx512_bf16 decodes"
        " ~1.7x faster than float32 at the cost of a train/infer log-prob gap (docs/mismatch.md)",
    )
    max_tokens_per_micro_batch: int = Field(
        16384, ge=1, description="padded tokens per forward in compute_logprobs"
    )
    generation_batch_size: int = Field(256, ge=1, description="sequences decoded together at most")
    score_without_vision_tokens: bool = Field(
        False, description="a VLM's scores renormalized without its never-sampled vision markers (on-policy)"
    )


class OptimizerConfig(RollModel):
    """AdamW hyperparameters."""

    lr: float = Field(1e-5, gt=0, description="peak learning rate (the scheduler multiplies it)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decay rates")
    eps: float = Field(1e-8, gt=0, description="AdamW's denominator epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay")


class SchedulerConfig(RollModel):
    """Learning-rate multiplier: linear warmup from 0 over ``warmup_steps``, then ``kind`` until ``total_steps``.

    ``linear`` and ``cosine`` decay from 1 to ``min_lr_ratio`` between the end of warmup and ``total_steps``
    (the strategy receives ``total_steps`` at build time, because it derives from the run's ``max_steps``).
    """

    kind: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="the multiplier's shape after warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0")
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="linear/cosine: the multiplier reached at total_steps"
    )


class LoraConfig(RollModel):
    """A peft LoRA adapter. Only adapter parameters train; exports then contain the adapter only."""

    r: int = Field(8, ge=1, description="rank of the adapter matrices")
    alpha: int = Field(16, ge=1, description="LoRA scaling numerator: updates are scaled by alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the linear modules that get an adapter",
    )


class FSDP2Config(RollModel):
    """The ``fsdp2`` training strategy.

    Micro-batches: give ``micro_batch_size`` (rows) or ``max_tokens_per_micro_batch`` (valid tokens, packed or
    padded), not both; neither means one micro-batch per ``train_step``. ``packed`` runs each micro-batch
    padding-free (one row, position ids restarting per sequence).
    """

    type: Literal["fsdp2"] = Field("fsdp2", description="selects this strategy")
    device: str = Field("auto", description="'auto' = cuda when available, else cpu")
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="'auto' = bf16 params with fp32 reductions on CUDA, fp32 on CPU; 'bf16' on CPU: bf16 autocast "
        "(bf16 matmuls on fp32 weights; one rank)",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    max_grad_norm: float | None = Field(1.0, gt=0, description="None disables clipping")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="rows per micro-batch; pipelines fill it from batch.micro_batch_samples (leave it unset)",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="valid tokens per micro-batch; pipelines fill it from batch.micro_batch_tokens (leave it unset)",
    )
    packed: bool = Field(
        False, description="run each micro-batch padding-free, its sequences packed in one row"
    )
    shared_prefix: bool = Field(
        True,
        description="run each distinct prompt of a micro-batch once (GRPO groups share it); same scores and "
        "gradients, less work; padded, text-only micro-batches without gradient checkpointing",
    )
    pair_prefix: bool = Field(
        True,
        description="run a preference loss's chosen/rejected pairs as one row each, their common prefix once "
        "(DPO); same scores and gradients, less work; padded, text-only micro-batches",
    )
    score_without_vision_tokens: bool = Field(
        False, description="a VLM's scores renormalized without its never-sampled vision markers (on-policy)"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward: less memory, more compute"
    )
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (regional, dynamic shapes): fused elementwise kernels, "
        "faster steps after a one-off compile on the first micro-batch (~40 s on 2 CPU cores); short rows on CPU: "
        "also set the role's model.attn_implementation: eager",
    )
    reshard_after_forward: bool = Field(
        True,
        description="free gathered parameters after forward (FSDP2's ZeRO-3 behaviour); false keeps them",
    )
    lora: LoraConfig | None = Field(
        None, description="train a LoRA adapter instead of all weights; unset: full"
    )

    @model_validator(mode="after")
    def _one_micro_batch_unit(self) -> FSDP2Config:
        if self.micro_batch_size is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError(
                "give micro_batch_size or max_tokens_per_micro_batch, not both "
                f"(got {self.micro_batch_size} and {self.max_tokens_per_micro_batch})"
            )
        return self
