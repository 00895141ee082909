"""The ``hf_capped`` strategy: an ``HFInferStrategy`` whose requests are capped (imports torch, via roll's hf)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.types import GeneratedSample, TokenScores
from roll_example_strategy import HFCappedConfig


class CappedStrategy:
    """roll.workers.types.InferStrategy: every member passes through to the hf strategy except ``generate``."""

    def __init__(self, config: HFCappedConfig, model: torch.nn.Module, **kwargs: Any) -> None:
        self.config = config
        hf = HFInferConfig.model_validate(
            config.model_dump(include=set(HFInferConfig.model_fields) - {"type"})
        )
        self.inner = HFInferStrategy(model, hf, **kwargs)

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        **kw: Any,
    ) -> list[GeneratedSample]:
        cap = self.config.max_new_tokens
        update: dict[str, Any] = {"stop_strings": [*params.stop_strings, *self.config.stop]}
        if cap is not None:
            update["max_new_tokens"] = min(params.max_new_tokens, cap)
        return self.inner.generate(prompts, params.model_copy(update=update), seeds, **kw)

    def compute_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
    ) -> TokenScores:
        return self.inner.compute_logprobs(input_ids, attention_mask, **kw)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        self.inner.load_weights(named_tensors, policy_version)

    def load_adapter(self, named_tensors: Mapping[str, torch.Tensor], lora: Any, policy_version: int) -> None:
        self.inner.load_adapter(named_tensors, lora, policy_version)

    def offload(self) -> None:
        self.inner.offload()

    def reload(self) -> None:
        self.inner.reload()
