"""One-token decode attention as two batched matmuls, registered with transformers as ``roll_sdpa``.

Why: at decode (one query per row) on CPU, ``scaled_dot_product_attention``'s flash kernel spends more on its
blocking than on the arithmetic: for 128 rows x 8 heads over ~100 cached positions it took about twice as long as
``softmax(q k^T) v`` written as two matmuls, and in bfloat16 its grouped-query path was 5-10x slower still
(``benchmarks/bench_decode.py --attention`` measures both). Here the ``G`` query heads that share a key/value head
become ``G`` query rows of one matmul against that head's keys (``[B, Hkv, G, D] @ [B, Hkv, D, K]``), so the cache
is read once per key head and never repeated (transformers' ``repeat_kv`` copies it ``G`` times); the softmax runs
in float32, as transformers' eager attention does.

Everything that is not a one-token, dropout-free forward (prefill, scoring, training) goes to transformers' own
function unchanged, with transformers' own masks: ``roll_sdpa`` is ``sdpa`` with a faster decode step (boolean
masks, ``True`` = attend), and ``roll_eager`` is the model's ``eager`` attention with it (additive float masks).
A role that asks for ``eager`` (the compiled CPU trainer runs faster with it) so still decodes fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "roll_sdpa"
EAGER_NAME = "roll_eager"
SWITCHES = {"sdpa": NAME, "eager": EAGER_NAME}
"""The implementation each one switches to (:func:`use_decode_attention`)."""


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
    if not _one_token(module, query, key, dropout, kwargs):
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
    return _decode(query, key, value, attention_mask, scaling)


def eager_decode_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # [B, 1, Q, K] additive float (0 = attend), or None
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``roll_eager``: :func:`decode_attention_forward`'s one-token step, else the model's own ``eager``."""
    if not _one_token(module, query, key, dropout, kwargs):
        eager = _model_eager(module)
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return _decode(query, key, value, attention_mask, scaling)


def _model_eager(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The ``eager_attention_forward`` of the modeling file that defines ``module`` (each model has its own)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise TypeError(f"{type(module).__qualname__}'s module defines no eager_attention_forward")
    return eager  # type: ignore[no-any-return]


def _one_token(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, dropout: float, kwargs: dict[str, Any]
) -> bool:
    """One query per row, no dropout, softcap, attention sinks or gradient: what :func:`_decode` computes."""
    return (
        query.shape[2] == 1
        and not dropout
        and query.shape[1] % key.shape[1] == 0
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and getattr(module, "sinks", None) is None
        and not torch.is_grad_enabled()
    )


def _decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> tuple[torch.Tensor, None]:
    B, H, _, D = query.shape
    Hkv = key.shape[1]
    scale = D**-0.5 if scaling is None else scaling
    q_BKGD = query.reshape(B, Hkv, H // Hkv, D)  # head h reads key head h // G, as repeat_kv maps it
    # keys times queries, not queries times transposed keys: the cache is a view of a preallocated buffer whose
    # transpose bmm would first copy; as the left operand its rows are read in place
    scores_BKTG = torch.matmul(key, q_BKGD.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        mask_B1T1 = attention_mask.transpose(-1, -2)
        if mask_B1T1.dtype == torch.bool:
            scores_BKTG = scores_BKTG.masked_fill(~mask_B1T1, float("-inf"))
        else:  # eager's additive mask: 0 where attended, the dtype's minimum elsewhere
            scores_BKTG = scores_BKTG + mask_B1T1.float()
    probs_BKGT = scores_BKTG.softmax(-2).to(value.dtype).transpose(-1, -2)
    out_BKGD = torch.matmul(probs_BKGT, value)
    return out_BKGD.reshape(B, 1, H, D), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to ``roll_sdpa``, or from ``eager`` to ``roll_eager`` (in place; other
    implementations, and an ``eager`` model whose modeling file has no ``eager_attention_forward``, are left alone).

    Returns whether it switched. The registration is global and idempotent; ``set_attn_implementation`` carries
    the switch to the model's sub-models (a VLM's vision tower, whose attention is never one-token, keeps running
    its own kernel through the fallback).
    """
    config = getattr(model, "config", None)
    switch = getattr(model, "set_attn_implementation", None)
    target = SWITCHES.get(getattr(config, "_attn_implementation", None) or "")
    if target is None or not callable(switch):
        return False
    if target == EAGER_NAME and not hasattr(sys.modules[type(model).__module__], "eager_attention_forward"):
        return False
    ALL_ATTENTION_FUNCTIONS.register(NAME, decode_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    ALL_ATTENTION_FUNCTIONS.register(EAGER_NAME, eager_decode_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(EAGER_NAME, eager_mask)
    switch(target)
    return getattr(config, "_attn_implementation", None) == target
