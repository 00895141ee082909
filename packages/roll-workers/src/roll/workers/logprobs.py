"""Forward helpers shared by every strategy: token log-probs and entropy, micro-batching, packing.

Conventions (see :mod:`roll.workers.types`): ``logp_BT[b, t] = log p(ids[b, t] | ids[b, :t])`` under
``log_softmax(logits / temperature)``; positions without a prediction (padding, a sequence's first token) hold 0.

Memory: the log-softmax is taken over row chunks of the flattened ``[B*T, V]`` logits, so the float temporaries are
``[chunk, V]`` instead of further ``[B, T, V]`` copies next to the logits the model already returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from roll.core.errors import DataError

LOGIT_CHUNK_ROWS = 1024
"""Rows of ``[rows, V]`` logits processed at once by :func:`logprobs_from_logits`."""


def position_ids_from_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    """Positions counting valid tokens from 0 in each row; padding gets 0. Works for left and right padding."""
    return (mask_BT.long().cumsum(-1) - 1).clamp(min=0)


def logprobs_from_logits(
    logits_NV: torch.Tensor, labels_N: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``labels_N`` under ``log_softmax(logits_NV / temperature)``, and optionally the entropy.

    Computed in float32 over chunks of :data:`LOGIT_CHUNK_ROWS` rows; differentiable. ``temperature`` must be > 0
    (greedy decoding reports temperature-1 log-probs, so callers pass 1.0 for it).
    """
    logp_chunks: list[torch.Tensor] = []
    ent_chunks: list[torch.Tensor] = []
    for start in range(0, logits_NV.shape[0], LOGIT_CHUNK_ROWS):
        x_CV = logits_NV[start : start + LOGIT_CHUNK_ROWS].float()
        if temperature != 1.0:
            x_CV = x_CV / temperature
        lse_C = x_CV.logsumexp(-1)
        labels_C = labels_N[start : start + LOGIT_CHUNK_ROWS]
        logp_chunks.append(x_CV.gather(-1, labels_C.unsqueeze(-1)).squeeze(-1) - lse_C)
        if with_entropy:
            p_CV = torch.softmax(x_CV, -1)
            ent_chunks.append(lse_C - (p_CV * x_CV).sum(-1))
    if not logp_chunks:
        empty = logits_NV.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logp_chunks), (torch.cat(ent_chunks) if with_entropy else None)


def shifted_scores(
    logits_BTV: torch.Tensor,
    ids_BT: torch.Tensor,
    has_prev_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Score ``ids[:, t]`` with the logits at ``t - 1``; 0 wherever ``has_prev_BT`` is false.

    The labels are rolled left instead of slicing the logits, so the flattened logits stay a view (no copy).
    """
    B, T, V = logits_BTV.shape
    labels_BT = torch.roll(ids_BT, shifts=-1, dims=1)
    logp_N, ent_N = logprobs_from_logits(
        logits_BTV.reshape(B * T, V),
        labels_BT.reshape(-1),
        temperature=temperature,
        with_entropy=with_entropy,
    )
    keep_BT = has_prev_BT.bool()
    logp_BT = torch.zeros(B, T, dtype=torch.float32, device=logits_BTV.device)
    logp_BT[:, 1:] = logp_N.view(B, T)[:, :-1]
    logp_BT = torch.where(keep_BT, logp_BT, torch.zeros_like(logp_BT))
    if ent_N is None:
        return logp_BT, None
    ent_BT = torch.zeros_like(logp_BT)
    ent_BT[:, 1:] = ent_N.view(B, T)[:, :-1]
    return logp_BT, torch.where(keep_BT, ent_BT, torch.zeros_like(ent_BT))


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``model`` on one padded micro-batch ``[B, T]`` and return ``(logp_BT, entropy_BT | None)``.

    ``packed=True`` removes the padding first: the valid tokens of all rows go into one row ``[1, N]`` whose
    position ids restart at 0 per sequence, which transformers turns into a block-diagonal mask (sdpa) or
    varlen attention (flash-attn); results are scattered back to ``[B, T]``, so both paths agree.
    """
    if packed:
        return _packed_forward_scores(model, input_ids, attention_mask, temperature, with_entropy)
    pos_BT = position_ids_from_mask(attention_mask)
    logits_BTV = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=pos_BT, use_cache=False
    ).logits
    return shifted_scores(
        logits_BTV,
        input_ids,
        has_prev_from_mask(attention_mask),
        temperature=temperature,
        with_entropy=with_entropy,
    )


def _packed_forward_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    valid_BT = attention_mask.bool()
    ids_1N = input_ids[valid_BT].unsqueeze(0)
    pos_1N = position_ids_from_mask(attention_mask)[valid_BT].unsqueeze(0)
    logits_1NV = model(input_ids=ids_1N, position_ids=pos_1N, use_cache=False).logits
    logp_1N, ent_1N = shifted_scores(
        logits_1NV, ids_1N, pos_1N > 0, temperature=temperature, with_entropy=with_entropy
    )
    logp_BT = torch.zeros(valid_BT.shape, dtype=torch.float32, device=input_ids.device)
    logp_BT = logp_BT.masked_scatter(valid_BT, logp_1N[0])
    if ent_1N is None:
        return logp_BT, None
    return logp_BT, torch.zeros_like(logp_BT).masked_scatter(valid_BT, ent_1N[0])


def trim_padding(
    batch: Mapping[str, torch.Tensor], mask_key: str = "attention_mask"
) -> dict[str, torch.Tensor]:
    """Drop columns that are padding in every row (both ends), from every ``[B, T]`` tensor of ``batch``."""
    mask_BT = batch[mask_key]
    cols_T = mask_BT.bool().any(0).nonzero()
    if cols_T.numel() == 0:
        return dict(batch)
    lo, hi = int(cols_T[0]), int(cols_T[-1]) + 1
    T = mask_BT.shape[1]
    return {k: (v[:, lo:hi] if v.dim() >= 2 and v.shape[1] == T else v) for k, v in batch.items()}


def split_micro_batches(
    batch: Mapping[str, Any],
    *,
    micro_batch_size: int | None = None,
    max_tokens: int | None = None,
    mask_key: str = "attention_mask",
) -> list[dict[str, Any]]:
    """Split ``batch`` along rows, keeping row order, into micro-batches.

    ``micro_batch_size`` caps rows; ``max_tokens`` caps the *valid* tokens of a micro-batch, filled greedily (a
    single row above the cap gets its own micro-batch); neither gives one micro-batch. Tensors whose first
    dimension is not the batch size are copied to every micro-batch as is.
    """
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
    return {
        k: (v[lo:hi] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == B else v)
        for k, v in batch.items()
    }


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
