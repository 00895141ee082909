"""The ``hf`` inference strategy: a KV-cached decode loop of our own over a transformers causal LM.

Why our own loop rather than ``model.generate``: we need the log-prob of every sampled token (RL ratios), n samples
per prompt from one prefill, rows that stop costing compute once they finish, and per-sample seeds; and the generic
``generate`` pays per-step overheads (logits processors, stopping criteria, mask rebuilding) that dominate on
small models. The loop:

1. order the prompts by length and chunk them (``generation_batch_size``), so a chunk pads little; left-pad each
   chunk; position ids count valid tokens, so padding never shifts a sequence's positions;
2. prefill the prompts once, keep only the last position's logits, then repeat the cache rows ``n`` times;
3. each step samples one token per live row, records its log-prob, then drops finished rows from the batch and
   the cache (``DynamicCache.batch_select_indices``) and feeds only the new token. A row's ``t``-th token inverts
   the CDF at uniform ``t`` of the row's own seeded stream, so batching never changes what a prompt samples.

Log-probs are those of the sampled token under ``log_softmax(logits / temperature)``, before top-k/top-p
truncation (temperature 1 when greedy). That is the distribution a trainer can recompute exactly
(``compute_logprobs(..., temperature=T)``); the truncated distribution would give ``-inf`` ratios for tokens
outside the nucleus. vLLM calls this choice ``logprobs_mode="processed_logits"`` minus the truncation. A VLM's
vision markers are never sampled (their logits are ``-inf``), so its log-probs are renormalized without them, as
the scorers' are with ``score_without_vision_tokens`` (:func:`roll.workers.logprobs.forward_scores`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from roll.core import columns as C
from roll.core.errors import DataError, WorkerError
from roll.core.seeding import derive_seed
from roll.workers.config import HFInferConfig, LoraConfig, SamplingParams
from roll.workers.decode_attention import use_decode_attention
from roll.workers.logprobs import forward_scores, left_pad, split_micro_batches, trim_padding, with_cache
from roll.workers.lora import AdapterMerger
from roll.workers.types import FinishReason, GeneratedSample, TokenScores
from roll.workers.vision import (
    Vision,
    next_positions,
    take_vision,
    vision_inputs,
    vision_of,
    vision_token_ids,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is bfloat16 on CUDA and float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


@dataclass
class _Decode:
    """Mutable state of one decode batch. Rows are live sequences; ``slot_B`` maps them to output slots."""

    slot_B: torch.Tensor  # [B] output slot of each live row
    mask_BK: torch.Tensor  # [B, K] attention mask over cached positions
    pos_B: torch.Tensor  # [B] position id of the next token
    cache: Any  # transformers DynamicCache
    logits_BV: torch.Tensor  # [B, V] logits predicting the next token


class HFInferStrategy:
    """Generation and scoring with a transformers causal LM on one device.

    ``model`` is any ``*ForCausalLM`` whose forward accepts ``cache``/``use_cache``/``position_ids``;
    ``tokenizer`` (optional) enables ``text`` and stop strings. ``eos_token_ids`` default to the model's
    generation config.
    """

    model: torch.nn.Module
    device: torch.device

    def __init__(
        self,
        model: torch.nn.Module,
        config: HFInferConfig | None = None,
        *,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.config = config or HFInferConfig()
        self.device = resolve_device(self.config.device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        if self.device.type == "cpu":
            use_decode_attention(
                self.model
            )  # sdpa's one-token step is slow on CPU: roll.workers.decode_attention
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else _model_eos_ids(model)
        self.pad_token_id = _pad_id(model, tokenizer, self.eos_token_ids)
        self._policy_version = 0
        self._max_new = 0
        self._never_sampled = torch.tensor(vision_token_ids(model), dtype=torch.long, device=self.device)
        self._adapters: AdapterMerger | None = None

    @property
    def policy_version(self) -> int:
        """The version of the weights currently loaded (0 = as built)."""
        return self._policy_version

    # ---- generation -------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        vision: Vision | None = None,
    ) -> list[GeneratedSample]:
        """Sample ``params.n`` continuations of each prompt; results are ordered by (prompt, sample).

        ``vision``: the prompts' images, per prompt (:mod:`roll.workers.vision`), for a vision-language model.

        Sample ``s`` of prompt ``p`` draws its uniforms from its own stream, seeded ``derive_seed(seeds[p], s)``
        (:mod:`roll.core.seeding`): the same prompt with the same seed gives the same tokens alone or batched,
        in any chunk, after any earlier call. Without ``seeds`` prompt ``p`` gets ``derive_seed(params.seed, p)``
        (or, with no ``params.seed`` either, a base seed drawn from torch's global RNG).
        """
        if params.stop_strings and self.tokenizer is None:
            raise DataError("stop_strings need a tokenizer; build the strategy with tokenizer=...")
        prompt_seeds = prompt_seeds_for(len(prompts), params.seed, seeds)
        per_chunk = max(1, self.config.generation_batch_size // params.n)
        samples: list[GeneratedSample] = []
        for index_P in length_chunks([len(p) for p in prompts], per_chunk):
            chunk = [list(prompts[i]) for i in index_P]
            u_BN = self._uniforms([prompt_seeds[i] for i in index_P], params)
            samples += self._generate_chunk(chunk, params, u_BN, index_P, take_vision(vision, index_P))
        return sorted(samples, key=lambda s: (s.prompt_index, s.sample_index))

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
        """Partial rollout: continue sample ``sample_indices[i]`` of prompt ``i`` from the tokens it already has,
        ``prefixes[i]``, for at most ``budget`` tokens under the weights served now; one sample per row, in row
        order, whose ``token_ids`` are the new tokens only (``text`` decodes prefix and new tokens together).

        The prefix is prefilled with the prompt (its KV is recomputed under these weights, as vLLM does for a
        resubmitted request). The ``t``-th new token inverts the CDF at uniform ``len(prefix) + t`` of the sample's
        own stream ``derive_seed(seeds[i], sample_indices[i])``, the stream :meth:`generate` reads from position
        0: a sample cut into segments draws the same uniforms as one generated whole, so with unchanged weights it
        gets the same tokens (up to the float order of a longer prefill), and a resumed run repeats them exactly.
        """
        if not len(prompts) == len(prefixes) == len(sample_indices) == len(seeds):
            raise DataError("continue_samples needs one prefix, sample index and seed per prompt")
        one = params.model_copy(update={"n": 1, "max_new_tokens": budget})
        samples: list[GeneratedSample] = []
        full = [list(p) + list(x) for p, x in zip(prompts, prefixes)]
        for index_P in length_chunks([len(row) for row in full], self.config.generation_batch_size):
            u_BN = torch.stack(
                [self._stream(seeds[i], sample_indices[i], len(prefixes[i]), budget) for i in index_P]
            ).to(self.device)
            for sample in self._generate_chunk([full[i] for i in index_P], one, u_BN, index_P):
                i = sample.prompt_index
                text = self._text(list(prefixes[i]) + sample.token_ids, params.stop_strings)
                samples.append(dataclasses.replace(sample, sample_index=int(sample_indices[i]), text=text))
        return sorted(samples, key=lambda s: s.prompt_index)

    @staticmethod
    def _stream(prompt_seed: int, sample_index: int, offset: int, length: int) -> torch.Tensor:
        """Uniforms ``offset .. offset + length`` of sample ``(prompt_seed, sample_index)``'s stream."""
        generator = torch.Generator().manual_seed(derive_seed(int(prompt_seed), int(sample_index)))
        return torch.rand(offset + length, generator=generator)[offset:]

    def _uniforms(self, prompt_seeds: Sequence[int], params: SamplingParams) -> torch.Tensor:
        """``[P * n, max_new_tokens]`` uniforms in [0, 1), row ``p * n + s`` from sample ``(p, s)``'s own stream."""
        rows = []
        for seed in prompt_seeds:
            for s in range(params.n):
                generator = torch.Generator().manual_seed(derive_seed(seed, s))
                rows.append(torch.rand(params.max_new_tokens, generator=generator))
        return torch.stack(rows).to(self.device)

    @torch.inference_mode()
    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        u_BN: torch.Tensor,
        index_P: list[int],
        vision: Vision | None = None,
    ) -> list[GeneratedSample]:
        self._max_new = params.max_new_tokens
        state = self._prefill(prompts, params.n, vision)
        B, max_new = state.slot_B.shape[0], params.max_new_tokens
        tokens_BN = torch.full((B, max_new), self.pad_token_id, dtype=torch.long, device=self.device)
        logp_BN = torch.zeros((B, max_new), dtype=torch.float32, device=self.device)
        lengths = [max_new] * B
        reasons: list[FinishReason] = ["length"] * B
        stop_ids = torch.tensor(self._stop_ids(params), dtype=torch.long, device=self.device)
        for step in range(max_new):
            if self._never_sampled.numel():
                state.logits_BV[:, self._never_sampled] = float("-inf")
            tok_B, tok_logp_B = sample_tokens(state.logits_BV, params, u_BN[state.slot_B, step])
            tokens_BN[state.slot_B, step] = tok_B
            logp_BN[state.slot_B, step] = tok_logp_B
            done_B = torch.isin(tok_B, stop_ids)
            if params.stop_strings:
                done_B |= self._hits_stop_string(tokens_BN, state.slot_B, step, params.stop_strings)
            for slot in state.slot_B[done_B].tolist():
                lengths[slot], reasons[slot] = step + 1, "stop"
            if step == max_new - 1 or bool(done_B.all()):
                break
            self._decode_step(state, tok_B, ~done_B)
        return self._collect(tokens_BN, logp_BN, lengths, reasons, params, index_P)

    def _prefill(self, prompts: list[list[int]], n: int, vision: Vision | None = None) -> _Decode:
        ids_PT, mask_PT = left_pad(prompts, self.pad_token_id, self.device)
        pos_PT = (mask_PT.cumsum(-1) - 1).clamp(min=0)
        # images: their tensors and 3-D positions ([3, P, T]); decoding then continues from the largest position
        images = vision_inputs(self.model, ids_PT, mask_PT, vision)
        pos_PT = images.pop("position_ids", pos_PT)
        cache = _make_cache(getattr(self.model, "config", None), capacity=ids_PT.shape[1] + self._max_new)
        out = self.model(
            input_ids=ids_PT,
            attention_mask=mask_PT,
            position_ids=pos_PT,
            **with_cache(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
            **images,
        )
        logits_PV, next_P = out.logits[:, -1].float(), next_positions(pos_PT)
        if n > 1:
            # One prefill serves all n samples: repeat rows after the forward, not before.
            cache.batch_repeat_interleave(n)
            logits_PV, mask_PT, next_P = (t.repeat_interleave(n, dim=0) for t in (logits_PV, mask_PT, next_P))
        slot_B = torch.arange(mask_PT.shape[0], device=self.device)
        return _Decode(slot_B=slot_B, mask_BK=mask_PT, pos_B=next_P, cache=cache, logits_BV=logits_PV)

    def _decode_step(self, state: _Decode, tok_B: torch.Tensor, keep_B: torch.Tensor) -> None:
        if not bool(keep_B.all()):
            idx_B = keep_B.nonzero().squeeze(-1)
            state.cache.batch_select_indices(idx_B)
            state.slot_B, state.mask_BK, state.pos_B, tok_B = (
                t[idx_B] for t in (state.slot_B, state.mask_BK, state.pos_B, tok_B)
            )
        ones_B1 = torch.ones_like(state.mask_BK[:, :1])
        state.mask_BK = torch.cat([state.mask_BK, ones_B1], dim=1)
        out = self.model(
            input_ids=tok_B[:, None],
            attention_mask=state.mask_BK,
            position_ids=state.pos_B[:, None],
            **with_cache(self.model, state.cache),
            use_cache=True,
        )
        state.logits_BV = out.logits[:, -1].float()
        state.pos_B = state.pos_B + 1

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            ids += self.eos_token_ids
        return ids

    def _hits_stop_string(
        self, tokens_BN: torch.Tensor, slot_B: torch.Tensor, step: int, stops: list[str]
    ) -> torch.Tensor:
        # A stop string of L characters ends within the last L + 2 tokens (tokens decode to >= 1 character, and
        # the margin covers byte tokens that only complete a character together); decoding that tail is O(1).
        window = max(len(s) for s in stops) + 2
        tails = tokens_BN[slot_B, max(0, step + 1 - window) : step + 1].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        hits = [any(s in text for s in stops) for text in texts]
        return torch.tensor(hits, dtype=torch.bool, device=self.device)

    def _collect(
        self,
        tokens_BN: torch.Tensor,
        logp_BN: torch.Tensor,
        lengths: list[int],
        reasons: list[FinishReason],
        params: SamplingParams,
        index_P: list[int],
    ) -> list[GeneratedSample]:
        token_rows, logp_rows = tokens_BN.tolist(), logp_BN.tolist()
        samples = []
        for slot, (toks, logps) in enumerate(zip(token_rows, logp_rows)):
            ids = toks[: lengths[slot]]
            samples.append(
                GeneratedSample(
                    prompt_index=index_P[slot // params.n],
                    sample_index=slot % params.n,
                    token_ids=ids,
                    logprobs=logps[: lengths[slot]],
                    finish_reason=reasons[slot],
                    text=self._text(ids, params.stop_strings),
                    policy_version=self._policy_version,
                )
            )
        return samples

    def _text(self, ids: list[int], stops: list[str]) -> str | None:
        if self.tokenizer is None:
            return None
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in stops if s in text]
        return text[: min(cuts)] if cuts else text

    # ---- scoring ---------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        response_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        vision: Vision | None = None,
    ) -> TokenScores:
        """Forward-only ``logp_BT`` (and ``entropy_BT``) of given sequences, ``[B, T]`` each (``vision``: the
        rows' images, :mod:`roll.workers.vision`).

        Micro-batched by ``max_tokens_per_micro_batch`` padded tokens, padding columns trimmed per micro-batch.
        Pass the generation temperature to reproduce generation log-probs (1.0 for greedy). With
        ``response_mask`` the scores are zeroed outside it.
        """
        if temperature <= 0:
            raise DataError(
                f"temperature must be > 0 for scoring (greedy log-probs use 1.0); got {temperature}"
            )
        batch: dict[str, Any] = {
            C.INPUT_IDS: input_ids.to(self.device),
            C.ATTENTION_MASK: attention_mask.to(self.device),
            **{k: list(v) for k, v in (vision or {}).items()},
        }
        rows = max(1, self.config.max_tokens_per_micro_batch // max(1, input_ids.shape[1]))
        logp_parts, ent_parts = [], []
        for mb in split_micro_batches(batch, micro_batch_size=rows):
            logp_bt, ent_bt = self._score_micro_batch(mb, temperature, with_entropy)
            logp_parts.append(logp_bt)
            ent_parts.append(ent_bt)
        logp_BT = torch.cat(logp_parts)
        ent_BT = torch.cat([e for e in ent_parts if e is not None]) if with_entropy else None
        if response_mask is not None:
            keep_BT = response_mask.to(self.device).bool()
            logp_BT = logp_BT * keep_BT
            ent_BT = ent_BT * keep_BT if ent_BT is not None else None
        return TokenScores(logp_BT=logp_BT, entropy_BT=ent_BT)

    def _score_micro_batch(
        self, mb: Mapping[str, Any], temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        T = mb[C.INPUT_IDS].shape[1]
        cols_T = mb[C.ATTENTION_MASK].bool().any(0).nonzero()
        trimmed = trim_padding(mb)
        logp_bt, ent_bt = forward_scores(
            self.model,
            trimmed[C.INPUT_IDS],
            trimmed[C.ATTENTION_MASK],
            temperature=temperature,
            with_entropy=with_entropy,
            vision=vision_of(mb),
            without_vision_tokens=self.config.score_without_vision_tokens,
        )
        if cols_T.numel() == 0:
            return torch.zeros(mb[C.INPUT_IDS].shape, device=self.device), None
        lo = int(cols_T[0])
        pad = (lo, T - lo - logp_bt.shape[1])
        return _pad_cols(logp_bt, pad), (_pad_cols(ent_bt, pad) if ent_bt is not None else None)

    # ---- weights and placement -------------------------------------------------------------------------------

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Copy named tensors into the model in place (a subset is fine, e.g. one bucket) and set the version.

        Unknown names raise :class:`WorkerError` naming them, so a trainer/inference name mismatch fails loudly.
        """
        # state_dict(keep_vars=True) also lists tied aliases (``lm_head.weight`` of tied embeddings), which a full
        # trainer state dict contains but named_parameters() drops; copying into an alias writes the shared tensor.
        params: dict[str, torch.Tensor] = dict(self.model.state_dict(keep_vars=True))
        params.update(dict(self.model.named_parameters()))
        params.update(dict(self.model.named_buffers()))
        unknown = sorted(set(named_tensors) - set(params))
        if unknown:
            raise WorkerError(f"load_weights: {len(unknown)} unknown tensor names, e.g. {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in named_tensors.items():
                params[name].copy_(tensor.to(device=self.device, dtype=params[name].dtype))
        if self._adapters is not None:
            self._adapters.forget(named_tensors)
        self._policy_version = policy_version

    def load_adapter(
        self, named_tensors: Mapping[str, torch.Tensor], lora: LoraConfig, policy_version: int
    ) -> None:
        """Serve base + this LoRA adapter (wire names of :mod:`roll.workers.lora`; each module's ``A`` and ``B``
        in the same call) as ``policy_version``: merged into the dense weights from pristine base copies, so a
        later adapter replaces this one instead of adding to it."""
        if self._adapters is None:
            self._adapters = AdapterMerger(self.model)
        self._adapters.apply(named_tensors, lora)
        self._policy_version = policy_version

    def offload(self) -> None:
        """Move weights to CPU to free the accelerator (a no-op on CPU)."""
        if self.device.type != "cpu":
            self.model.to("cpu")
            if self._adapters is not None:
                self._adapters.to("cpu")
            torch.cuda.empty_cache()

    def reload(self) -> None:
        """Move weights back to the strategy's device."""
        if self.device.type != "cpu":
            self.model.to(self.device)
            if self._adapters is not None:
                self._adapters.to(self.device)


def _make_cache(model_config: Any, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers write into preallocated buffers.

    ``DynamicLayer`` concatenates every step, copying the whole cache (quadratic in length); ours writes the new
    position in place and hands attention a view of the filled prefix. Caches with other layer kinds (sliding
    window, linear attention) keep transformers' layers.
    """
    cache = DynamicCache(config=model_config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [PreallocatedLayer(capacity) for _ in cache.layers]
    return cache


class PreallocatedLayer(DynamicLayer):  # type: ignore[no-untyped-call,misc,unused-ignore]
    """A full-attention KV layer of fixed capacity ``[B, H, capacity, D]``, filled left to right."""

    def __init__(self, capacity: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call,unused-ignore]
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.is_initialized = key_states.device, True
        shape_k, shape_v = list(key_states.shape), list(value_states.shape)
        shape_k[-2] = shape_v[-2] = self.capacity
        self._k, self._v = key_states.new_empty(shape_k), value_states.new_empty(shape_v)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise WorkerError(f"KV cache capacity {self.capacity} exceeded (need {end})")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        return self._refresh()

    def _refresh(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
            self._refresh()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._refresh()


def length_chunks(lengths: Sequence[int], per_chunk: int) -> list[list[int]]:
    """Prompt indices in chunks of at most ``per_chunk``: in order when one chunk holds them all, else sorted by
    length (stable), so each chunk pads to a length near its rows' own. Per-prompt seeds make the result
    independent of the chunking."""
    order = list(range(len(lengths)))
    if len(order) > per_chunk:
        order.sort(key=lambda i: lengths[i])
    return [order[start : start + per_chunk] for start in range(0, len(order), per_chunk)]


def prompt_seeds_for(num_prompts: int, base: int | None, seeds: Sequence[int] | None) -> list[int]:
    """Each prompt's seed: ``seeds`` as given, else ``derive_seed(base, p)``; ``base`` None draws one from torch's
    global RNG (so ``torch.manual_seed`` still makes an unseeded run reproducible)."""
    if seeds is not None:
        if len(seeds) != num_prompts:
            raise DataError(f"generate got {len(seeds)} seeds for {num_prompts} prompts; give one per prompt")
        return [int(s) for s in seeds]
    if base is None:
        base = int(torch.randint(0, 2**62, (1,)).item())
    return [derive_seed(base, p) for p in range(num_prompts)]


def sample_tokens(
    logits_BV: torch.Tensor, params: SamplingParams, u_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob under ``log_softmax(logits / T)`` (``T = 1`` when greedy).

    Sampling draws from the temperature-scaled distribution restricted to top-k and then top-p, by inverting its
    CDF at each row's uniform ``u_B`` (in [0, 1)), so a row's token depends on its own logits and uniform only.
    """
    if params.temperature == 0:
        tok_B = logits_BV.argmax(-1)
        logp_BV = logits_BV.log_softmax(-1)
        return tok_B, logp_BV.gather(-1, tok_B[:, None]).squeeze(-1)
    scaled_BV = logits_BV / params.temperature
    logp_BV = scaled_BV.log_softmax(-1)
    filtered_BV = _top_k_top_p(scaled_BV, params.top_k, params.top_p)
    tok_B = _inverse_cdf_sample(filtered_BV.softmax(-1), u_B)
    return tok_B, logp_BV.gather(-1, tok_B[:, None]).squeeze(-1)


def _inverse_cdf_sample(probs_BV: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting the CDF at ``u_B`` (cheaper than ``torch.multinomial``'s per-call setup).

    ``searchsorted(..., right=True)`` returns the first index whose CDF exceeds ``u``, so zero-probability
    (filtered) tokens are never drawn; ``u`` stays strictly below the total mass.
    """
    cdf_BV = probs_BV.cumsum(-1)
    total_B1 = cdf_BV[:, -1:]
    u_B1 = u_B.to(device=probs_BV.device, dtype=cdf_BV.dtype)[:, None] * total_B1
    u_B1 = torch.minimum(u_B1, torch.nextafter(total_B1, torch.zeros_like(total_B1)))
    return torch.searchsorted(cdf_BV, u_B1, right=True).squeeze(-1).clamp_(max=probs_BV.shape[-1] - 1)


def _top_k_top_p(scaled_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k, then outside the smallest set with mass >= top_p, to -inf."""
    neg_inf = torch.finfo(scaled_BV.dtype).min
    if 0 < top_k < scaled_BV.shape[-1]:
        kth_B1 = scaled_BV.topk(top_k, dim=-1).values[:, -1:]
        scaled_BV = scaled_BV.masked_fill(scaled_BV < kth_B1, neg_inf)
    if top_p < 1.0:
        sorted_BV, order_BV = scaled_BV.sort(-1, descending=True)
        cum_BV = sorted_BV.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop_BV = (cum_BV - sorted_BV.softmax(-1)) >= top_p
        scaled_BV = scaled_BV.masked_fill(torch.zeros_like(drop_BV).scatter(-1, order_BV, drop_BV), neg_inf)
    return scaled_BV


def _pad_cols(x_BT: torch.Tensor, pad: tuple[int, int]) -> torch.Tensor:
    return torch.nn.functional.pad(x_BT, pad) if pad != (0, 0) else x_BT


def _model_eos_ids(model: torch.nn.Module) -> list[int]:
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list | tuple) else [int(eos)]


def _pad_id(model: torch.nn.Module, tokenizer: Any, eos_ids: list[int]) -> int:
    for source in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return eos_ids[0] if eos_ids else 0
