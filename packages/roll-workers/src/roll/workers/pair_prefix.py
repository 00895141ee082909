"""One row per preference pair: the chosen and rejected sequences' common prefix runs once.

A DPO micro-batch holds pairs interleaved (row ``2i`` chosen, ``2i + 1`` rejected) that share their prompt. The
plain forward runs ``2P`` rows of ``prompt + response``; here each pair is one row ``[prefix, suffix_a, suffix_b]``
(``prefix`` the two sequences' longest common prefix of tokens, the suffixes what follows it in each), with
position ids ``0 .. La - 1`` then ``c .. Lb - 1`` (``c`` the prefix length), and a 4-D attention mask in which a
token of ``suffix_b`` sees the prefix and the earlier tokens of ``suffix_b`` but not ``suffix_a``. Each token then
has the same keys, values and positions as in its own row, so its hidden states and scores are the same function
of the weights: values and gradients equal the plain forward's up to float rounding (the tests check both). The
scores are gathered from the hidden states that predict each scored token (the first token of ``suffix_b`` is
predicted by the prefix's last one, like ``suffix_a``'s), so only those rows reach the output projection.

The work drops from ``2P * T`` token positions (prompt twice) to ``P * L`` (``L = max(La + Lb - c)``): about 0.65
on the built-in preference task. One forward, no KV cache (unlike :mod:`roll.workers.shared_prefix`, whose two
forwards and cache expansion did not pay for pairs), so gradient checkpointing composes with it. The attention
runs with an explicit mask instead of ``is_causal``; at these lengths attention is a small part of the step.

Where it does not apply the caller takes the plain path (``None``): an odd row count, a model without a separate
output projection or with an attention implementation that takes no 4-D mask (flash-attn, flex), or too little
sharing (more than :data:`MAX_WORK_FRACTION` of the plain forward's positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll.workers.logprobs import logprobs_from_logits

MAX_WORK_FRACTION = 0.85
"""The pair path runs only when its token positions ``P * L`` are at most this fraction of the plain forward's
(``2P`` rows trimmed to their longest): below that, the masked attention's extra cost is not repaid."""

MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take a custom 4-D mask as is."""


@dataclass(frozen=True)
class PairLayout:
    """Where each pair's tokens sit in its merged row, and which hidden state scores each scored token.

    ``ids_PL``/``pos_PL``/``mask_P1LL`` are the merged rows' inputs; ``rows_M``/``cols_M`` the scored tokens in the
    original ``[2P, T]`` layout, ``src_pair_M``/``src_col_M`` the merged position whose hidden state predicts each
    (the token before it in its own sequence), ``labels_M`` the token ids.
    """

    ids_PL: torch.Tensor
    pos_PL: torch.Tensor
    mask_P1LL: torch.Tensor
    rows_M: torch.Tensor
    cols_M: torch.Tensor
    src_pair_M: torch.Tensor
    src_col_M: torch.Tensor
    labels_M: torch.Tensor


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def pair_layout(
    ids_BT: torch.Tensor, mask_BT: torch.Tensor, score_BT: torch.Tensor, pad_id: int = 0
) -> PairLayout | None:
    """The merged layout of interleaved pairs, or None when it saves too little (see the module docstring).

    Each row's valid tokens must be one contiguous block (left or right padding); scored positions outside it or
    at its first token (no previous token) are not scored, as in the plain forward.
    """
    B = ids_BT.shape[0]
    if B % 2 or B == 0:
        return None
    valid = mask_BT.bool().cpu()
    ids_rows = ids_BT.cpu().tolist()
    scored = (score_BT.bool().cpu() & valid).tolist()
    cols = [torch.nonzero(valid[r]).flatten().tolist() for r in range(B)]
    if any(c and c[-1] - c[0] + 1 != len(c) for c in cols):
        return None
    seqs = [[ids_rows[r][t] for t in cols[r]] for r in range(B)]
    prefix = [_common_prefix(seqs[2 * p], seqs[2 * p + 1]) for p in range(B // 2)]
    lengths = [len(seqs[2 * p]) + len(seqs[2 * p + 1]) - prefix[p] for p in range(B // 2)]
    L = max(max(lengths), 1)
    width = max((c[-1] + 1 for c in cols if c), default=0) - min((c[0] for c in cols if c), default=0)
    if MAX_WORK_FRACTION * B * width < B // 2 * L:
        return None
    return _build(seqs, cols, scored, prefix, L, pad_id, ids_BT.device)


def _build(
    seqs: list[list[int]],
    cols: list[list[int]],
    scored: list[list[bool]],
    prefix: list[int],
    L: int,
    pad_id: int,
    device: torch.device,
) -> PairLayout:
    P = len(prefix)
    ids = [[pad_id] * L for _ in range(P)]
    pos = [[0] * L for _ in range(P)]
    segment = torch.full((P, L), -1, dtype=torch.long)  # -1 padding, 0 prefix, 1 suffix a, 2 suffix b
    gather: list[list[int]] = [[], [], [], [], []]  # rows, cols, src_pair, src_col, labels
    for p in range(P):
        a, b, c = seqs[2 * p], seqs[2 * p + 1], prefix[p]
        merged = a + b[c:]
        ids[p][: len(merged)] = merged
        pos[p][: len(merged)] = list(range(len(a))) + list(range(c, len(b)))
        segment[p, :c], segment[p, c : len(a)], segment[p, len(a) : len(merged)] = 0, 1, 2
        for side in (0, 1):
            r = 2 * p + side
            for k, t, src in _scored(seqs[r], cols[r], scored[r], c, len(a) if side else 0):
                for dest, v in zip(gather, (r, t, p, src, seqs[r][k]), strict=True):
                    dest.append(v)
    mask = _attention_mask(segment)
    rows_M, cols_M, src_pair_M, src_col_M, labels_M = (
        torch.tensor(g, dtype=torch.long, device=device) for g in gather
    )
    return PairLayout(
        torch.tensor(ids, dtype=torch.long, device=device),
        torch.tensor(pos, dtype=torch.long, device=device),
        mask.to(device),
        rows_M, cols_M, src_pair_M, src_col_M, labels_M,
    )  # fmt: skip


def _scored(
    seq: list[int], cols: list[int], scored: list[bool], c: int, offset: int
) -> list[tuple[int, int, int]]:
    """``(k, column, src)`` for each scored token ``k >= 1`` of one side: its column in the original row and the
    merged index of the token before it. ``offset``: 0 for the first side (merged index = own index), ``La`` for the
    second, whose tokens past the prefix follow the first side's (merged ``La + k - c``)."""

    def merged(k: int) -> int:
        return k if offset == 0 or k < c else offset + k - c

    return [(k, cols[k], merged(k - 1)) for k in range(1, len(seq)) if scored[cols[k]]]


def _attention_mask(segment_PL: torch.Tensor) -> torch.Tensor:
    """``[P, 1, L, L]`` bool: query ``i`` sees key ``j <= i`` of the prefix or of its own segment. A padding
    position sees itself only, so no softmax row is empty (an empty one would put NaN into the backward)."""
    L = segment_PL.shape[1]
    seg_q, seg_k = segment_PL[:, :, None], segment_PL[:, None, :]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    sees = causal & (seg_k >= 0) & ((seg_k == 0) | (seg_k == seg_q))
    return (sees | torch.eye(L, dtype=torch.bool)).unsqueeze(1)


def pair_prefix_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(logp_BT, entropy_BT | None)`` of interleaved pairs through merged rows, 0 off ``score_mask``; None where
    the pair path does not apply (the caller runs the plain forward)."""
    head = _output_head(model)
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if head is None or implementation not in MASKED_ATTENTION:
        return None
    pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
    layout = pair_layout(input_ids, attention_mask, score_mask, pad_id)
    if layout is None:
        return None
    logits_1MV = _selected_logits(model, head, layout, implementation)
    logp_M, ent_M = logprobs_from_logits(
        logits_1MV[0], layout.labels_M, temperature=temperature, with_entropy=with_entropy
    )
    index = (layout.rows_M, layout.cols_M)
    zeros_BT = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp_BT = zeros_BT.index_put(index, logp_M)
    return logp_BT, (None if ent_M is None else zeros_BT.index_put(index, ent_M))


def _selected_logits(
    model: torch.nn.Module, head: torch.nn.Module, layout: PairLayout, implementation: str
) -> torch.Tensor:
    """The merged rows' forward, the output projection run on the predicting hidden states alone ``[1, M, V]``."""

    def select(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden_PLH = args[0]
        return (hidden_PLH[layout.src_pair_M, layout.src_col_M].unsqueeze(0), *args[1:])

    dtype = next(model.parameters()).dtype
    mask = layout.mask_P1LL
    if implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min
        )
    handle = head.register_forward_pre_hook(select)
    try:
        return model(  # type: ignore[no-any-return]
            input_ids=layout.ids_PL, attention_mask=mask, position_ids=layout.pos_PL, use_cache=False
        ).logits
    finally:
        handle.remove()


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    return head if isinstance(head, torch.nn.Module) else None
