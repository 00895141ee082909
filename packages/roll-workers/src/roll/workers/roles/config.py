"""Config models of worker roles. Light module: pydantic only, no torch, so ``roll validate`` stays fast."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel

LoadDType = Literal["auto", "float32", "bfloat16", "float16"]


class ModelConfig(RollModel):
    """Which model a role loads and how.

    ``path`` is a tiny preset (``tiny-1m``, ``tiny-10m``, ``tiny-50m``), a local ``save_pretrained`` folder or a
    hub id, resolved by :func:`roll.data.tiny.resolve_model_path`. ``tokenizer`` defaults to ``path``.
    ``dtype`` is the dtype the weights are loaded in: ``auto`` loads float32, because training keeps fp32 master
    weights (FSDP2 casts to bf16 on CUDA itself) and the inference strategy casts to its own ``dtype``.
    ``seed`` seeds torch before loading, so randomly initialised heads (critic, reward model) are reproducible.
    """

    path: str = Field(min_length=1)
    tokenizer: str | None = None
    dtype: LoadDType = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    seed: int = 0
    trust_remote_code: bool = False


__all__ = ["LoadDType", "ModelConfig"]
