"""Forward helpers shared by every strategy: token log-probs and entropy, micro-batching, packing.

Conventions (see :mod:`roll.workers.types`): ``logp_BT[b, t] = log p(ids[b, t] | ids[b, :t])`` under
``log_softmax(logits / temperature)``; positions without a prediction (padding, a sequence's first token) hold 0.
With ``without_vision_tokens`` (the hf and fsdp2 strategies' ``score_without_vision_tokens``, off by default) a
vision-language model's softmax leaves out the tokens no sampler emits (its vision markers,
:func:`roll.workers.vision.vision_token_ids`), as the decode loop does, so a sample's log-prob equals its score
(the PPO ratio starts at 1); a label that is itself such a token (a prompt's image pads) keeps the full softmax.

Memory and speed: the log-softmax is taken over row chunks of the flattened ``[B*T, V]`` logits, so the float
temporaries are ``[chunk, V]`` instead of further ``[B, T, V]`` copies next to the logits the model already
returned; without entropy each chunk is one fused ``cross_entropy`` (log-softmax + pick, fused backward).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from roll.core import columns as C
from roll.core.errors import DataError

LOGIT_CHUNK_ROWS = 1024
"""Rows of ``[rows, V]`` logits processed at once by :func:`logprobs_from_logits`."""


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` (a transformers ``Cache``) to ``model``'s forward.

    transformers renamed it from ``past_key_values`` to ``cache`` (5.2x); a forward that takes neither name by
    signature takes ``**kwargs``, where the old name silently does nothing on a new release and the new one on an
    old release, so the name is read off the forward's own signature.
    """
    try:
        names = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = set()
    return {"cache" if "cache" in names else "past_key_values": cache}


def position_ids_from_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    """Positions counting valid tokens from 0 in each row; padding gets 0. Works for left and right padding."""
    return (mask_BT.long().cumsum(-1) - 1).clamp(min=0)


def logprobs_from_logits(
    logits_NV: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    ignore_index: int = C.IGNORE_INDEX,
    never_sampled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``labels_N`` under ``log_softmax(logits_NV / temperature)``, and optionally the entropy.

    Computed in float32 over chunks of :data:`LOGIT_CHUNK_ROWS` rows; differentiable. Rows whose label is
    ``ignore_index`` get 0 (and no gradient). ``temperature`` must be > 0 (greedy decoding reports temperature-1
    log-probs, so callers pass 1.0 for it). ``never_sampled`` (token ids, ``[K]``): left out of the softmax (and
    the entropy) of every row whose label is not one of them, see :func:`without_never_sampled`.

    Without entropy this is ``-cross_entropy(..., reduction="none")``: log-softmax and the pick in one op whose
    backward is one fused kernel, and no ``[rows, V]`` log-softmax is kept for the backward beyond the op's own.
    """
    logp_chunks: list[torch.Tensor] = []
    ent_chunks: list[torch.Tensor] = []
    # split (not slicing in a loop): its backward concatenates the chunk gradients once
    chunks = zip(
        torch.split(logits_NV, LOGIT_CHUNK_ROWS), torch.split(labels_N, LOGIT_CHUNK_ROWS), strict=True
    )
    for x_CV, labels_C in chunks:
        x_CV = x_CV.float()
        if temperature != 1.0:
            x_CV = x_CV / temperature
        if never_sampled is not None:
            x_CV = without_never_sampled(x_CV, labels_C, never_sampled)
        if with_entropy:
            logp_CV = x_CV.log_softmax(-1)
            logp_chunks.append(-F.nll_loss(logp_CV, labels_C, reduction="none", ignore_index=ignore_index))
            ent_chunks.append(-(logp_CV.exp() * logp_CV).sum(-1))
        else:
            logp_chunks.append(-F.cross_entropy(x_CV, labels_C, reduction="none", ignore_index=ignore_index))
    if not logp_chunks:
        empty = logits_NV.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    logp_N = logp_chunks[0] if len(logp_chunks) == 1 else torch.cat(logp_chunks)
    if not with_entropy:
        return logp_N, None
    return logp_N, (ent_chunks[0] if len(ent_chunks) == 1 else torch.cat(ent_chunks))


def without_never_sampled(x_CV: torch.Tensor, labels_C: torch.Tensor, ids_K: torch.Tensor) -> torch.Tensor:
    """``x_CV`` with columns ``ids_K`` at the float minimum, on the rows whose label is not one of them.

    The decode loop sets those logits to ``-inf`` before sampling, so its log-prob of a token is
    ``x[tok] - logsumexp(x without ids_K)``; this gives the scorer the same value (``exp(min - max)`` is exactly 0,
    and unlike ``-inf`` it keeps ``p * log p`` of the entropy at 0 instead of NaN). A row whose label is one of
    them (the image pads of a prompt, never a sampled token) keeps its full-vocabulary logits: its score stays
    finite, and no loss reads it.
    """
    keep_C1 = torch.isin(labels_C, ids_K)[:, None]
    return torch.where(keep_C1, x_CV, x_CV.index_fill(1, ids_K, torch.finfo(x_CV.dtype).min))


def never_sampled_ids(model: torch.nn.Module, device: torch.device) -> torch.Tensor | None:
    """The ids ``model``'s samplers never emit, on ``device`` (None for a text model: its path is unchanged)."""
    from roll.workers.vision import vision_token_ids

    ids = vision_token_ids(model)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def shifted_scores(
    logits_BTV: torch.Tensor,
    ids_BT: torch.Tensor,
    has_prev_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    never_sampled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Score ``ids[:, t]`` with the logits at ``t - 1``; 0 wherever ``has_prev_BT`` is false (``never_sampled``:
    see :func:`logprobs_from_logits`).

    The labels are rolled left instead of slicing the logits, so the flattened logits stay a view (no copy);
    positions without a prediction get the ignore label, so the fused cross-entropy gives them 0 directly.
    """
    B, T, V = logits_BTV.shape
    keep_BT = has_prev_BT.bool()
    labels_BT = torch.roll(ids_BT.masked_fill(~keep_BT, C.IGNORE_INDEX), shifts=-1, dims=1)
    logp_N, ent_N = logprobs_from_logits(
        logits_BTV.reshape(B * T, V),
        labels_BT.reshape(-1),
        temperature=temperature,
        with_entropy=with_entropy,
        never_sampled=never_sampled,
    )
    # the score of ids[:, t] sits at t - 1: shift right by one, column 0 (no previous token) is 0
    logp_BT = F.pad(logp_N.view(B, T)[:, :-1], (1, 0))
    if ent_N is None:
        return logp_BT, None
    ent_BT = F.pad(ent_N.view(B, T)[:, :-1], (1, 0))
    return logp_BT, ent_BT.masked_fill(~keep_BT, 0.0)


def has_prev_from_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    """True where a token and the token before it are both valid (padded layout)."""
    prev_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    prev_BT[:, 1:] = mask_BT[:, :-1].bool()
    return prev_BT & mask_BT.bool()


def forward_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    packed: bool = False,
    score_mask: torch.Tensor | None = None,
    vision: Mapping[str, Any] | None = None,
    without_vision_tokens: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``model`` on one padded micro-batch ``[B, T]`` and return ``(logp_BT, entropy_BT | None)``.

    ``vision`` (per-row image columns, :mod:`roll.workers.vision`) adds the rows' images and 3-D rotary
    positions; rows with images always take the padded path.

    ``packed=True`` removes the padding first: the valid tokens of all rows go into one row ``[1, N]`` whose
    position ids restart at 0 per sequence, which transformers turns into a block-diagonal mask (sdpa) or
    varlen attention (flash-attn); results are scattered back to ``[B, T]``, so both paths agree. Padded, the
    columns that are padding in every row (a micro-batch shorter than its batch) are left out of the forward.

    ``score_mask`` (``[B, T]``, optional) names the only positions the caller reads (e.g. an SFT loss's label
    tokens): the output projection (``get_output_embeddings()``) then runs on just the hidden states that predict
    them, and every other position holds 0. The scores there are the same as without it.

    ``without_vision_tokens``: a vision-language model's scores leave its vision markers out of the softmax
    (:func:`never_sampled_ids`), as its samplers do (the strategies' ``score_without_vision_tokens``); a text
    model's are untouched either way.
    """
    never = never_sampled_ids(model, input_ids.device) if without_vision_tokens else None
    if packed and not vision:
        return _packed_forward_scores(
            model, input_ids, attention_mask, temperature, with_entropy, score_mask, never
        )
    T = attention_mask.shape[1]
    lo, hi = _valid_columns(attention_mask)
    if hi - lo < T:  # columns that are padding in every row: run without them, put zeros back
        logp_BT, ent_BT = forward_scores(
            model,
            input_ids[:, lo:hi],
            attention_mask[:, lo:hi],
            temperature=temperature,
            with_entropy=with_entropy,
            score_mask=None if score_mask is None else score_mask[:, lo:hi],
            vision=vision,
            without_vision_tokens=without_vision_tokens,
        )
        return F.pad(logp_BT, (lo, T - hi)), (None if ent_BT is None else F.pad(ent_BT, (lo, T - hi)))
    pos_BT = position_ids_from_mask(attention_mask)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": pos_BT}
    if vision:
        from roll.workers.vision import vision_inputs

        inputs.update(vision_inputs(model, input_ids, attention_mask, vision))
    has_prev_BT = has_prev_from_mask(attention_mask)
    if score_mask is not None:
        return scores_at(
            model, inputs, input_ids, has_prev_BT & score_mask.bool(), temperature, with_entropy, never
        )
    logits_BTV = model(**inputs, use_cache=False).logits
    return shifted_scores(
        logits_BTV, input_ids, has_prev_BT, temperature=temperature, with_entropy=with_entropy,
        never_sampled=never,
    )  # fmt: skip


def scores_at(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    ids_BT: torch.Tensor,
    scored_BT: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    never_sampled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores of ``ids_BT`` at ``scored_BT`` (each with a previous token), 0 elsewhere, projecting only the hidden
    states at the positions before them: a pre-hook on the output embeddings selects those rows (inside the model's
    forward, so sharded parameters are gathered as usual and logit post-processing still applies). ``inputs`` may
    carry a KV cache and ``use_cache=True`` (:mod:`roll.workers.shared_prefix`); the default is no cache."""
    head = _output_head(model)
    if head is None:  # no separate output projection to narrow: score every position, keep the asked ones
        logits_BTV = model(**{"use_cache": False, **inputs}).logits
        return shifted_scores(
            logits_BTV, ids_BT, scored_BT, temperature=temperature, with_entropy=with_entropy,
            never_sampled=never_sampled,
        )  # fmt: skip
    # the hidden state at t - 1 predicts ids[:, t]; column 0 is never scored, so the roll wraps nothing in
    prev_BT = torch.roll(scored_BT, shifts=-1, dims=1)

    def select(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden_BTH = args[0]
        if hidden_BTH.shape[:2] != prev_BT.shape:
            raise RuntimeError(
                f"score_mask: the output projection got hidden states {tuple(hidden_BTH.shape)}, expected "
                f"{tuple(prev_BT.shape)} + (hidden,); this model does not project every position at once"
            )
        return (hidden_BTH[prev_BT].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        logits_1MV = model(**{"use_cache": False, **inputs}).logits
    finally:
        handle.remove()
    logp_M, ent_M = logprobs_from_logits(
        logits_1MV[0], ids_BT[scored_BT], temperature=temperature, with_entropy=with_entropy,
        never_sampled=never_sampled,
    )  # fmt: skip
    zeros_BT = torch.zeros(scored_BT.shape, dtype=torch.float32, device=ids_BT.device)
    logp_BT = zeros_BT.masked_scatter(scored_BT, logp_M)
    return logp_BT, (None if ent_M is None else zeros_BT.masked_scatter(scored_BT, ent_M))


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    return head if isinstance(head, torch.nn.Module) else None


def _packed_forward_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    score_mask: torch.Tensor | None = None,
    never_sampled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    valid_BT = attention_mask.bool()
    ids_1N = input_ids[valid_BT].unsqueeze(0)
    pos_1N = position_ids_from_mask(attention_mask)[valid_BT].unsqueeze(0)
    inputs = {"input_ids": ids_1N, "position_ids": pos_1N}
    if score_mask is None:
        logits_1NV = model(**inputs, use_cache=False).logits
        logp_1N, ent_1N = shifted_scores(
            logits_1NV, ids_1N, pos_1N > 0, temperature=temperature, with_entropy=with_entropy,
            never_sampled=never_sampled,
        )  # fmt: skip
    else:
        scored_1N = (pos_1N > 0) & score_mask.bool()[valid_BT].unsqueeze(0)
        logp_1N, ent_1N = scores_at(
            model, inputs, ids_1N, scored_1N, temperature, with_entropy, never_sampled
        )
    logp_BT = torch.zeros(valid_BT.shape, dtype=torch.float32, device=input_ids.device)
    logp_BT = logp_BT.masked_scatter(valid_BT, logp_1N[0])
    if ent_1N is None:
        return logp_BT, None
    return logp_BT, torch.zeros_like(logp_BT).masked_scatter(valid_BT, ent_1N[0])


def _valid_columns(mask_BT: torch.Tensor) -> tuple[int, int]:
    """``(lo, hi)``: the columns ``lo:hi`` hold every valid token; ``(0, T)`` when none is valid."""
    cols_T = mask_BT.bool().any(0).nonzero()
    if cols_T.numel() == 0:
        return 0, mask_BT.shape[1]
    return int(cols_T[0]), int(cols_T[-1]) + 1


def trim_padding(
    batch: Mapping[str, torch.Tensor], mask_key: str = C.ATTENTION_MASK
) -> dict[str, torch.Tensor]:
    """Drop columns that are padding in every row (both ends), from every ``[B, T]`` tensor of ``batch``."""
    mask_BT = batch[mask_key]
    T = mask_BT.shape[1]
    lo, hi = _valid_columns(mask_BT)
    if hi - lo == T:
        return dict(batch)
    return {
        k: (v[:, lo:hi] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == T else v)
        for k, v in batch.items()
    }


def split_micro_batches(
    batch: Mapping[str, Any],
    *,
    micro_batch_size: int | None = None,
    max_tokens: int | None = None,
    mask_key: str = C.ATTENTION_MASK,
) -> list[dict[str, Any]]:
    """Split ``batch`` along rows, keeping row order, into micro-batches.

    ``micro_batch_size`` caps rows; ``max_tokens`` caps the *valid* tokens of a micro-batch, filled greedily (a
    single row above the cap gets its own micro-batch); neither gives one micro-batch. Tensors whose first
    dimension is not the batch size are copied to every micro-batch as is.
    """
    if mask_key not in batch:
        raise DataError(
            f"the micro-batch has no {mask_key!r} (its keys: {sorted(batch)}); key its tensors by their "
            "roll.core.columns names (C.INPUT_IDS, C.ATTENTION_MASK ...), as Batch columns are"
        )
    mask_BT = batch[mask_key]
    B = mask_BT.shape[0]
    if micro_batch_size is not None:
        bounds = [(s, min(s + micro_batch_size, B)) for s in range(0, B, micro_batch_size)]
    elif max_tokens is not None:
        bounds = _token_budget_bounds(mask_BT.sum(-1).tolist(), max_tokens)
    else:
        bounds = [(0, B)]
    return [_slice_rows(batch, lo, hi, B) for lo, hi in bounds]


def _token_budget_bounds(lengths: list[int], max_tokens: int) -> list[tuple[int, int]]:
    bounds: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > max_tokens:
            bounds.append((start, i))
            start, used = i, 0
        used += n
    if lengths:
        bounds.append((start, len(lengths)))
    return bounds


def _slice_rows(batch: Mapping[str, Any], lo: int, hi: int, B: int) -> dict[str, Any]:
    """Rows ``lo:hi`` of every ``[B, ...]`` tensor and every per-row list (image columns) of ``batch``."""
    return {
        k: (v[lo:hi] if isinstance(v, torch.Tensor | list) and _rowwise(v) and len(v) == B else v)
        for k, v in batch.items()
    }


def _rowwise(v: torch.Tensor | list[Any]) -> bool:
    return not isinstance(v, torch.Tensor) or v.dim() > 0


def left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into ``(ids_BT, mask_BT)``. Empty prompts are rejected (nothing to condition on)."""
    if any(len(p) == 0 for p in prompts):
        raise DataError("every prompt needs at least one token; got an empty prompt")
    T = max(len(p) for p in prompts)
    ids_BT = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(prompts), T), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids_BT[row, T - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask_BT[row, T - len(p) :] = 1
    return ids_BT.to(device), mask_BT.to(device)
