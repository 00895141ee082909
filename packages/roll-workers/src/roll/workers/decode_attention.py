"""One-token decode attention as two batched matmuls, registered with transformers as ``roll_sdpa``.

Why: at decode (one query per row) on CPU, ``scaled_dot_product_attention``'s flash kernel spends more on its
blocking than on the arithmetic: for 128 rows x 8 heads over ~100 cached positions it took about twice as long as
``softmax(q k^T) v`` written as two matmuls, and in bfloat16 its grouped-query path was 5-10x slower still
(``benchmarks/bench_decode.py --attention`` measures both). Here the ``G`` query heads that share a key/value head
become ``G`` query rows of one matmul against that head's keys (``[B, Hkv, G, D] @ [B, Hkv, D, K]``), so the cache
is read once per key head and never repeated (transformers' ``repeat_kv`` copies it ``G`` times); the softmax runs
in float32, as transformers' eager attention does.

Everything that is not a one-token, mask-or-no-mask, dropout-free forward (prefill, scoring, training) goes to
transformers' own ``sdpa`` function unchanged, and the mask is built by transformers' ``sdpa_mask`` (boolean,
``True`` = attend), so ``roll_sdpa`` is ``sdpa`` with a faster decode step.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "roll_sdpa"


def decode_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Q, D]
    key: torch.Tensor,  # [B, Hkv, K, D]
    value: torch.Tensor,  # [B, Hkv, K, D]
    attention_mask: torch.Tensor | None,  # [B, 1, Q, K] bool, True = attend; or None
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ``([B, Q, H, D], None)`` like ``sdpa``."""
    B, H, Q, D = query.shape
    Hkv = key.shape[1]
    plain = attention_mask is None or attention_mask.dtype == torch.bool
    if (
        Q != 1
        or dropout
        or not plain
        or H % Hkv
        or kwargs.get("softcap") is not None
        or torch.is_grad_enabled()
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    scale = D**-0.5 if scaling is None else scaling
    q_BKGD = query.reshape(B, Hkv, H // Hkv, D)  # head h reads key head h // G, as repeat_kv maps it
    # keys times queries, not queries times transposed keys: the cache is a view of a preallocated buffer whose
    # transpose bmm would first copy; as the left operand its rows are read in place
    scores_BKTG = torch.matmul(key, q_BKGD.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        scores_BKTG = scores_BKTG.masked_fill(
            ~attention_mask.transpose(-1, -2), float("-inf")
        )  # [B, 1, T, 1]
    probs_BKGT = scores_BKTG.softmax(-2).to(value.dtype).transpose(-1, -2)
    out_BKGD = torch.matmul(probs_BKGT, value)
    return out_BKGD.reshape(B, 1, H, D), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to ``roll_sdpa`` (in place; other implementations are left alone).

    Returns whether it switched. The registration is global and idempotent; ``set_attn_implementation`` carries
    the switch to the model's sub-models (a VLM's vision tower, whose attention is never one-token, keeps running
    ``sdpa`` through the fallback).
    """
    config = getattr(model, "config", None)
    switch = getattr(model, "set_attn_implementation", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not callable(switch):
        return False
    ALL_ATTENTION_FUNCTIONS.register(NAME, decode_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    switch(NAME)
    return getattr(config, "_attn_implementation", None) == NAME
