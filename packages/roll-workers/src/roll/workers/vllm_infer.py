"""The ``vllm`` inference strategy: a vLLM ``AsyncLLM`` engine behind the synchronous :class:`InferStrategy`.

This module imports no vLLM at the top, so it imports anywhere; building :class:`VLLMInferStrategy` without vLLM
raises :class:`~roll.core.errors.PluginError` naming ``pip install 'roll-workers[vllm]'``.

Design:

- **One event loop thread** owns the engine. Synchronous callers (``generate``, ``load_weights`` ...) submit
  coroutines to it and wait; :meth:`VLLMInferStrategy.submit` returns a future for request-level use (a scheduler
  can keep many requests in flight and :meth:`abort` any of them from another thread).
- **One vLLM request per sample**: ``prompts x n`` requests with ``n=1`` each, ids ``"{call}-{prompt}-{sample}"``,
  so each sample can be aborted alone and, when seeded, gets its own seed ``derive_seed(prompt_seed, sample)``
  (:mod:`roll.core.seeding`; vLLM seeds each request's sampler), independent of what else is in flight. Prefix
  caching makes the shared prompt cheap.
- **Weights** arrive through our worker extension (:class:`RollWorkerExtension`, passed as vLLM's
  ``worker_extension_cls`` and called with ``collective_rpc``): by value (a safetensors blob, any placement,
  loaded with vLLM's in-place ``reload_weights``, which also re-packs the CPU backend's GEMM weights) or by CUDA
  IPC handles (colocated with the trainer). A collective update (disaggregated roles) is received by the role's
  actor (:mod:`roll.workers.model_update`) and loaded by value. Each update resets the prefix cache (cached KV of the old weights would be reused otherwise)
  and records the ``policy_version`` the engine now serves; every sample carries it.
- **Sleep mode** frees the GPU between phases when colocated: ``offload`` = ``sleep(level)``, ``reload`` =
  ``wake_up()``; :meth:`VLLMInferStrategy.wake_up` takes vLLM's tags (``["weights"]`` first, update, then
  ``["kv_cache"]``) to keep peak memory low during an update.
- **LoRA**: a LoRA trainer's update carries the adapter only (:mod:`roll.workers.lora`); :meth:`VLLMInferStrategy.
  load_adapter` saves it as a peft folder and serves it through vLLM's ``LoRARequest`` (``enable_lora: true``),
  a new adapter id per policy version, the previous one removed.
- **Vision markers are never sampled** (a VLM's ``<|image_pad|>`` ..., :func:`roll.workers.vision.vision_token_ids`,
  the list the hf decode loop bans): each request's ``logit_bias`` puts them at ``-inf``, which vLLM applies before
  it samples and before the ``processed_logprobs`` it reports, so the log-probs are those the trainer's scorer
  computes with ``score_without_vision_tokens`` (:func:`roll.workers.logprobs.forward_scores`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from roll.core import columns as C
from roll.core.errors import DataError, PluginError, WorkerError, WorkerTimeoutError
from roll.core.seeding import derive_seed
from roll.workers.config import LoraConfig, SamplingParams
from roll.workers.types import FinishReason, GeneratedSample, TokenScores
from roll.workers.vision import config_vision_token_ids, multimodal_prompt
from roll.workers.vllm_config import VLLMConfig

INSTALL_HINT = "pip install 'roll-workers[vllm]'  (or: uv sync --extra vllm)"
EXTENSION = "roll.workers.vllm_infer.RollWorkerExtension"
T = TypeVar("T")


def require_vllm() -> Any:
    """Import ``vllm`` or raise :class:`PluginError` naming the extra to install."""
    try:
        import vllm
    except ImportError as err:
        raise PluginError(
            f"the 'vllm' strategy needs vLLM, which is not installed ({err}); {INSTALL_HINT}"
        ) from err
    return vllm


class _LoopThread:
    """A daemon thread running one asyncio loop; coroutines are submitted from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="roll-vllm-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError as err:
            future.cancel()
            raise WorkerTimeoutError(f"vllm: {what} did not finish within {timeout:.0f} s") from err

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def engine_args(config: VLLMConfig, model_path: str) -> Any:
    """vLLM ``AsyncEngineArgs`` for ``config`` with our worker extension installed."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": config.dtype,
        "seed": config.seed,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": config.enforce_eager,
        "enable_prefix_caching": config.enable_prefix_caching,
        "enable_sleep_mode": config.enable_sleep_mode and sleep_mode_available(),
        "kv_cache_memory_bytes": config.kv_cache_memory_bytes,
        "logprobs_mode": config.logprobs_mode,
        "load_format": config.load_format,
        "skip_tokenizer_init": config.skip_tokenizer_init,
        "worker_extension_cls": EXTENSION,
        "disable_log_stats": True,
    }
    if config.enable_lora:
        kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=config.max_loras)
    return AsyncEngineArgs(**kwargs)


def sleep_mode_available() -> bool:
    """Whether vLLM's platform has sleep mode (CUDA does; the CPU backend rejects ``enable_sleep_mode``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def to_vllm_params(
    params: SamplingParams, *, seed: int | None, detokenize: bool, never_sampled: Sequence[int] = ()
) -> Any:
    """One sample's ``vllm.SamplingParams``: ``n=1``, final output only, the sampled token's log-prob; the
    ``never_sampled`` ids banned (:func:`never_sampled_bias`)."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_new_tokens,
        stop=list(params.stop_strings) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        ignore_eos=params.ignore_eos,
        seed=seed,
        logprobs=0,
        detokenize=detokenize,
        skip_special_tokens=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
        logit_bias=never_sampled_bias(never_sampled),
    )


def never_sampled_bias(ids: Sequence[int]) -> dict[int, float] | None:
    """``{id: -inf}`` for ``logit_bias`` (None for none). vLLM's constructor keeps the value as given (only its
    ``from_optional``, the OpenAI server's path, clamps to -100) and adds it to the logits before sampling and
    before ``processed_logprobs``: the token gets probability 0, the rest are renormalized without it."""
    return {int(i): float("-inf") for i in ids} or None


def sample_seed(
    base: int | None, prompt_seed: int | None, prompt_index: int, sample_index: int
) -> int | None:
    """The vLLM seed of one sample: ``derive_seed(prompt_seed, s)``, with ``prompt_seed`` defaulting to
    ``derive_seed(base, p)``; None (the engine's RNG) when neither is given. The hf strategy derives the same."""
    if prompt_seed is None:
        if base is None:
            return None
        prompt_seed = derive_seed(base, prompt_index)
    return derive_seed(prompt_seed, sample_index)


def segment_seed(prompt_seed: int, sample_index: int, offset: int) -> int:
    """The vLLM seed of a partial-rollout segment that starts at token ``offset`` of its sample (offset 0 is the
    seed :func:`sample_seed` gives the whole sample)."""
    seed = derive_seed(prompt_seed, sample_index)
    return seed if offset == 0 else derive_seed(seed, offset)


def sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """Log-prob of each sampled token from vLLM's per-position ``{token_id: Logprob}`` entries."""
    if logprobs is None:
        raise WorkerError("vllm returned no logprobs although the request asked for them (logprobs=0)")
    return [float(entry[token].logprob) for token, entry in zip(token_ids, logprobs)]


def _model_path(model: Any) -> str:
    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    path = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    if not path:
        raise DataError(
            "the vllm strategy loads the model itself: pass a hub name or a save_pretrained folder"
        )
    return str(path)


class VLLMInferStrategy:
    """Generation with a vLLM engine; weight updates, sleep/wake and LoRA adapters. See the module docstring.

    ``model`` is a hub name or a local ``save_pretrained`` folder (or a transformers model, whose
    ``name_or_path`` is used).
    """

    def __init__(self, model: Any, config: VLLMConfig | None = None) -> None:
        require_vllm()
        self.config = config or VLLMConfig()
        self.model_path = _model_path(model)
        self._loop = _LoopThread()
        self._calls = itertools.count()
        self._policy_version = 0
        self._lora: Any = None
        self._lora_dir: str | None = None
        self._lora_ids = itertools.count(1)
        self._adapter_dirs = itertools.count()
        self._asleep = False
        self._sleep_mode = self.config.enable_sleep_mode and sleep_mode_available()
        self.engine = self._run(self._start(), "engine start")

    async def _start(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args(self.config, self.model_path))

    def _run(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        return self._loop.run(coro, self.config.request_timeout_s, what)

    @property
    def policy_version(self) -> int:
        """The version of the weights the engine serves (0 = as loaded)."""
        return self._policy_version

    # ---- generation ---------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        vision: Mapping[str, Sequence[Any]] | None = None,
    ) -> list[GeneratedSample]:
        """Sample ``params.n`` continuations of each prompt; ordered by (prompt, sample). Aborted samples are
        left out. Sample ``s`` of prompt ``p`` is one request with vLLM seed ``derive_seed(seeds[p], s)`` (without
        ``seeds``: ``derive_seed(derive_seed(params.seed, p), s)``, or the engine's RNG when unseeded).

        ``vision``: per-prompt image and video columns; the raw ``images`` and ``videos`` go to vLLM as
        ``multi_modal_data`` (see :func:`roll.workers.vision.multimodal_prompt`)."""
        if params.stop_strings and self.config.skip_tokenizer_init:
            raise DataError("stop_strings need the tokenizer; set skip_tokenizer_init: false")
        if seeds is not None and len(seeds) != len(prompts):
            raise DataError(
                f"generate got {len(seeds)} seeds for {len(prompts)} prompts; give one per prompt"
            )
        call = next(self._calls)
        images = list((vision or {}).get(C.IMAGES) or [None] * len(prompts))
        videos = list((vision or {}).get(C.VIDEOS) or [None] * len(prompts))
        coros = [
            self._generate_one(
                list(prompt),
                params,
                request_id=f"{call}-{p}-{s}",
                prompt_index=p,
                sample_index=s,
                seed=sample_seed(params.seed, None if seeds is None else seeds[p], p, s),
                images=images[p],
                videos=videos[p],
            )
            for p, prompt in enumerate(prompts)
            for s in range(params.n)
        ]
        results = self._run(_gather(coros), f"generate ({len(coros)} samples)")
        return [r for r in results if r is not None]

    def continue_samples(
        self,
        prompts: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        sample_indices: Sequence[int],
        seeds: Sequence[int],
        budget: int,
    ) -> list[GeneratedSample]:
        """Partial rollout: resubmit sample ``sample_indices[i]`` of prompt ``i`` as a new request whose prompt is
        the prompt plus the tokens it already has (``prefixes[i]``), for at most ``budget`` tokens under the weights
        served now (vLLM's public ``generate``; the prefix's KV is recomputed, the prefix cache was reset by the
        update). One sample per row, in row order; ``token_ids`` are the new tokens, ``text`` decodes them alone.
        Seeded ``derive_seed(derive_seed(seeds[i], s), len(prefix))``: vLLM restarts a request's sampler at its
        seed, so each segment gets its own stream instead of replaying the first segment's."""
        one = params.model_copy(update={"n": 1, "max_new_tokens": budget})
        call = next(self._calls)
        coros = [
            self._generate_one(
                list(prompt) + list(prefix),
                one,
                request_id=f"{call}-c{i}-{sample_indices[i]}",
                prompt_index=i,
                sample_index=int(sample_indices[i]),
                seed=segment_seed(int(seeds[i]), int(sample_indices[i]), len(prefix)),
            )
            for i, (prompt, prefix) in enumerate(zip(prompts, prefixes))
        ]
        results = self._run(_gather(coros), f"continue ({len(coros)} samples)")
        return [r for r in results if r is not None]

    def _never_sampled(self) -> list[int]:
        """The model's vision markers (``[]`` for a text model), read from its config once."""
        if not hasattr(self, "_never_sampled_ids"):
            from transformers import AutoConfig

            self._never_sampled_ids = config_vision_token_ids(AutoConfig.from_pretrained(self.model_path))
        return self._never_sampled_ids

    def _token_id(self, name: str) -> int | None:
        """The model's ``image_token_id`` or ``video_token_id`` (read from its config once, when the first image or
        video prompt comes)."""
        if not hasattr(self, "_media_tokens"):
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.model_path)
            self._media_tokens = {n: getattr(config, n, None) for n in ("image_token_id", "video_token_id")}
        return self._media_tokens.get(name)

    def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str,
        prompt_index: int = 0,
        sample_index: int = 0,
        prompt_seed: int | None = None,
    ) -> concurrent.futures.Future[GeneratedSample | None]:
        """Start one sample as request ``request_id`` (``params.n`` is ignored); the future resolves to the sample,
        or ``None`` when it was aborted. Ids must be unique among requests in flight. Seeded as in
        :meth:`generate` (``prompt_seed`` plays ``seeds[prompt_index]``)."""
        coro = self._generate_one(
            list(prompt),
            params,
            request_id=request_id,
            prompt_index=prompt_index,
            sample_index=sample_index,
            seed=sample_seed(params.seed, prompt_seed, prompt_index, sample_index),
        )
        return self._loop.submit(coro)

    def abort(self, request_ids: str | Sequence[str]) -> None:
        """Abort requests by id (from any thread); their ``generate`` results are left out."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._run(self.engine.abort(ids), f"abort {ids[:3]}")

    async def _generate_one(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        prompt_index: int,
        sample_index: int,
        seed: int | None,
        images: Sequence[Any] | None = None,
        videos: Sequence[Any] | None = None,
    ) -> GeneratedSample | None:
        vllm_params = to_vllm_params(
            params,
            seed=seed,
            detokenize=not self.config.skip_tokenizer_init,
            never_sampled=self._never_sampled(),
        )
        version = self._policy_version
        final = None
        request = multimodal_prompt(
            prompt,
            images,
            self._token_id("image_token_id") if images else None,
            videos,
            self._token_id("video_token_id") if videos else None,
        )
        async for out in self.engine.generate(request, vllm_params, request_id, lora_request=self._lora):
            final = out
        if final is None or not final.outputs:
            return None
        completion = final.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            return None  # aborted
        reason: FinishReason = "stop" if completion.finish_reason == "stop" else "length"
        token_ids = list(completion.token_ids)
        return GeneratedSample(
            prompt_index=prompt_index,
            sample_index=sample_index,
            token_ids=token_ids,
            logprobs=sampled_logprobs(token_ids, completion.logprobs),
            finish_reason=reason,
            text=None if self.config.skip_tokenizer_init else completion.text,
            policy_version=version,
        )

    # ---- scoring ------------------------------------------------------------------------------------------

    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        response_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenScores:
        """``logp_BT`` of given sequences via vLLM's prompt log-probs (one request per row, one token generated).

        vLLM scores prompt tokens from the raw logits only, so ``temperature`` must be 1 and no entropy is
        available; use the trainer's ``compute_logprobs`` for anything else.
        """
        if temperature != 1.0 or with_entropy:
            raise WorkerError(
                "vllm compute_logprobs supports temperature=1 without entropy only (vLLM's prompt log-probs are "
                "raw); score with the train strategy instead"
            )
        mask = attention_mask.bool().cpu()
        rows = [ids[m].tolist() for ids, m in zip(input_ids.cpu(), mask)]
        scored = [b for b, row in enumerate(rows) if len(row) >= 2]  # a lone token has nothing to score
        call = next(self._calls)
        coros = [self._prompt_logprobs(rows[b], f"{call}-score-{b}") for b in scored]
        outs = self._run(_gather(coros), f"score ({len(coros)} rows)")
        logp_BT = torch.zeros(input_ids.shape, dtype=torch.float32)
        for b, values in zip(scored, outs):
            cols = mask[b].nonzero().squeeze(-1)
            logp_BT[b, cols[1:]] = torch.tensor(values[1:], dtype=torch.float32)
        if response_mask is not None:
            logp_BT = logp_BT * response_mask.bool().cpu()
        return TokenScores(logp_BT=logp_BT)

    async def _prompt_logprobs(self, row: list[int], request_id: str) -> list[float]:
        from vllm import SamplingParams as VLLMSamplingParams

        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": row}, params, request_id):
            final = out
        entries = final.prompt_logprobs if final is not None else None
        if entries is None:
            raise WorkerError(f"vllm returned no prompt logprobs for request {request_id}")
        return [0.0] + [float(entry[token].logprob) for token, entry in zip(row[1:], entries[1:])]

    # ---- weights --------------------------------------------------------------------------------------------

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Load named tensors (HF names; a subset such as one bucket is fine) by value into every vLLM worker.

        They travel as one safetensors blob: vLLM's RPC channel (msgpack) carries bytes as they are but turns an
        untyped tensor argument into a bare ``[dtype, shape, buffer index]`` list on the worker side. Full weights
        replace the policy, so an adapter served until now is dropped."""
        self._rpc("roll_update_weights", weights_blob(named_tensors))
        self._lora = None
        self._after_update(policy_version)

    def load_weights_from_ipc(
        self, handles: Mapping[str, list[tuple[str, Any]]], policy_version: int
    ) -> None:
        """Load tensors shared by CUDA IPC (:func:`roll.workers.model_update.share_bucket`) on the same GPU(s) as
        the sender."""
        self._rpc("roll_update_weights_from_ipc", dict(handles))
        self._after_update(policy_version)

    def load_lora(self, path: str, policy_version: int) -> None:
        """Serve the LoRA adapter saved at ``path`` (peft format) from now on, as ``policy_version``."""
        from vllm.lora.request import LoRARequest

        if not self.config.enable_lora:
            raise WorkerError("load_lora needs enable_lora: true in the vllm strategy config")
        request = LoRARequest(
            # vLLM caches adapters by id: a fresh id per load, so re-serving a version never hits a stale cache.
            lora_name=f"policy-{policy_version}",
            lora_int_id=next(self._lora_ids),
            lora_path=path,
        )
        self._run(self.engine.add_lora(request), "add_lora")
        previous, self._lora = self._lora, request
        if previous is not None:
            self._run(self.engine.remove_lora(previous.lora_int_id), "remove_lora")
        self._after_update(policy_version)

    def load_adapter(
        self, named_tensors: Mapping[str, torch.Tensor], lora: LoraConfig, policy_version: int
    ) -> None:
        """Serve the LoRA adapter ``named_tensors`` (wire names of :mod:`roll.workers.lora`, the whole adapter in
        one call) as ``policy_version``: written as a peft folder, then added with a ``LoRARequest``.

        The folder of the adapter served before is removed once the new one is in (vLLM reads it at
        ``add_lora``)."""
        from roll.workers.lora import write_peft_adapter

        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="roll-lora-")
        folder = write_peft_adapter(
            Path(self._lora_dir) / f"adapter-{next(self._adapter_dirs)}", named_tensors, lora, self.model_path
        )
        previous = self._lora.lora_path if self._lora is not None else None
        self.load_lora(str(folder), policy_version)
        if previous is not None and previous.startswith(self._lora_dir):
            shutil.rmtree(previous, ignore_errors=True)

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        return self._run(
            self.engine.collective_rpc(method, timeout=self.config.request_timeout_s, args=args), method
        )

    def _after_update(self, policy_version: int) -> None:
        # Prefix-cached KV blocks were computed with the old weights; reusing them would mix policies.
        self._run(self.engine.reset_prefix_cache(), "reset_prefix_cache")
        self._policy_version = policy_version

    # ---- placement ------------------------------------------------------------------------------------------

    def offload(self) -> None:
        """Sleep: free GPU memory (KV cache dropped; weights to CPU at level 1, dropped at level 2)."""
        if self._asleep:
            return
        if not self.config.enable_sleep_mode:
            raise WorkerError("offload needs enable_sleep_mode: true in the vllm strategy config")
        if not self._sleep_mode:
            return  # vLLM's CPU backend has no sleep mode; host RAM is not what colocation frees
        self._run(self.engine.sleep(self.config.sleep_level), "sleep")
        self._asleep = True

    def reload(self) -> None:
        """Wake everything up (weights and KV cache)."""
        self.wake_up(None)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake parts of the engine: ``["weights"]``, ``["kv_cache"]`` or all (``None``)."""
        if not self._sleep_mode:
            return
        self._run(self.engine.wake_up(tags), f"wake_up {tags}")
        self._asleep = tags is not None and "kv_cache" not in tags

    def is_sleeping(self) -> bool:
        return bool(self._run(self.engine.is_sleeping(), "is_sleeping"))

    def shutdown(self) -> None:
        """Stop the engine and its loop thread."""
        self.engine.shutdown()
        self._loop.stop()
        # Drop the engine now: left for interpreter exit, vLLM's __del__ runs shutdown again without its globals.
        self.engine = None


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    return list(await asyncio.gather(*coros))


# ---- the worker extension (runs inside vLLM's worker processes) -----------------------------------------------


class RollWorkerExtension:
    """Mixed into vLLM's GPU worker through ``worker_extension_cls``; called by name via ``collective_rpc``.

    ``self`` is the vLLM worker: ``self.device`` and ``self.model_runner.model`` (whose ``load_weights`` takes HF
    names and handles vLLM's fused/sharded layouts, including TP) come from it.
    """

    device: torch.device
    model_runner: Any
    reload_weights: Any

    def roll_update_weights(self, blob: bytes) -> int:
        from safetensors.torch import load

        weights = [(name, t.to(self.device, non_blocking=True)) for name, t in load(blob).items()]
        # vLLM's in-place reload, not ``model.load_weights``: after loading, the CPU backend repacks each linear
        # layer's weight for its GEMM kernels (dropping the plain parameter and its loader), so a bare load
        # either fails or leaves the old packed copy in use; the reload re-runs that processing, and skips the
        # layers a bucket does not touch.
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        _synchronize(self.device)
        return len(weights)

    def roll_device_uuid(self) -> str:
        return str(torch.cuda.get_device_properties(self.device).uuid)

    def roll_update_weights_from_ipc(self, handles: dict[str, list[tuple[str, Any]]]) -> int:
        mine = handles.get(self.roll_device_uuid())
        if mine is None:
            raise WorkerError(f"no IPC handles for this worker's GPU {self.roll_device_uuid()}")
        weights = [(name, _rebuild_ipc(handle, self.device.index)) for name, handle in mine]
        self.model_runner.model.load_weights(weights=weights)
        _synchronize(self.device)
        return len(weights)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weights_blob(named_tensors: Mapping[str, torch.Tensor]) -> bytes:
    """Named CPU tensors as safetensors bytes; a tensor sharing storage with an earlier one (tied embeddings)
    is copied, since safetensors refuses shared storage."""
    from safetensors.torch import save

    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in named_tensors.items():
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return bytes(save(tensors))


def _rebuild_ipc(handle: tuple[Any, tuple[Any, ...]], device_index: int | None) -> torch.Tensor:
    # Argument 6 of torch's rebuild_cuda_tensor is the device index in the *sender's* numbering; processes can see
    # different CUDA_VISIBLE_DEVICES, so use our own index of the same (UUID-matched) GPU.
    func, args = handle
    args_list = list(args)
    if device_index is not None:
        args_list[6] = device_index
    return func(*args_list)  # type: ignore[no-any-return]
