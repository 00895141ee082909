"""Training forwards that run each distinct prompt once: the G samples of a GRPO group share their prompt.

A padded RL micro-batch holds rows ``prompt + response`` (right-padded, :func:`~roll.data.sequences.
to_sequences`), and the rows of one group repeat the same prompt G times. The plain forward runs the model over
every row's prompt again; here the distinct prompts run once (left-padded, ``[U, Lp]``, with a KV cache), the
cache is expanded to the rows (``[B, ...]``, an index select that autograd sums back), and the responses run on
top of it (``[B, Ls]``). The scores are the same function of the weights, so values and gradients equal the plain
forward's up to float rounding (the test checks both); the work drops from ``B * (Lp + Ls)`` token positions to
``U * Lp + B * Ls``. On the quickstart's shapes (16 groups of 8 per micro-batch, prompts ~15 tokens, responses up
to 12) that is about half.

Where it does not apply the caller takes the plain path: images (the vision tower runs per row), rows that are not
right-padded, too little sharing (fewer than 2 rows per distinct prompt on average, or more than
``MAX_WORK_FRACTION`` of the plain forward's token positions: DPO's pairs), or a model whose forward
returns no cache (gradient checkpointing turns the cache off; checked after the prompts' forward, with a warning).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
import torch.nn.functional as F

from roll.workers.logprobs import logprobs_from_logits, position_ids_from_mask, scores_at, with_cache

logger = logging.getLogger(__name__)

MIN_ROWS_PER_PREFIX = 2.0
"""Average rows per distinct prompt below which the plain forward is cheaper than two forwards."""

MAX_WORK_FRACTION = 0.6
"""The shared path runs only when its token positions (``U * Lp + B * Ls``) are at most this fraction of the
plain forward's (``B * T``): its two forwards, the cache's expansion and the attention over a concatenated cache
cost more per position than one forward. ``benchmarks/bench_shared_prefix.py --samples 2,3,4,8`` measures it."""


def prefix_lengths(score_mask_BT: torch.Tensor, length_B: torch.Tensor) -> torch.Tensor:
    """Per row, the first scored column (the prompt ends before it); a row with none scored: its length."""
    scored_BT = score_mask_BT.bool()
    first_B = scored_BT.int().argmax(-1)
    return torch.where(scored_BT.any(-1), first_B, length_B)


def distinct_prefixes(ids_BT: torch.Tensor, prefix_B: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts (in first-seen order) and each row's index into them, ``inverse_B``."""
    index: dict[tuple[int, ...], int] = {}
    rows = ids_BT.tolist()
    inverse = [index.setdefault(tuple(row[: int(p)]), len(index)) for row, p in zip(rows, prefix_B.tolist())]
    return [list(k) for k in index], torch.tensor(inverse, dtype=torch.long, device=ids_BT.device)


def shared_prefix_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(logp_BT, entropy_BT | None)`` at ``score_mask`` (0 elsewhere), each distinct prompt run once; ``None``
    when the batch does not qualify (see the module docstring), so the caller runs the plain forward."""
    B, T = input_ids.shape
    length_B = attention_mask.sum(-1)
    if not _right_padded(attention_mask, length_B):
        return None
    prefix_B = prefix_lengths(score_mask, length_B)
    if bool((prefix_B < 1).any()):
        return None
    prefixes, inverse_B = distinct_prefixes(input_ids, prefix_B)
    if (
        MIN_ROWS_PER_PREFIX * len(prefixes) > B
        or _work(prefixes, prefix_B, length_B) > MAX_WORK_FRACTION * B * T
    ):
        return None
    from transformers import DynamicCache

    cache = DynamicCache(config=getattr(model, "config", None))
    first_UV, pmask_UL = _prefill(model, prefixes, cache, input_ids.device)
    if (
        cache.get_seq_length() != pmask_UL.shape[1]
    ):  # the forward kept no cache: the responses would lose context
        _warn_once(
            f"{type(model).__name__} filled no KV cache; shared_prefix falls back to the plain forward"
        )
        return None
    cache.reorder_cache(
        cast("torch.LongTensor", inverse_B)
    )  # [U, ...] -> [B, ...]; its backward sums the rows' gradients per prompt (index_select: in order)
    # index_select, not ``first_UV[inverse_B]``: the backward of advanced indexing is an accumulating index_put
    # whose CPU kernel adds rows sharing a prompt in thread-timing order, so two identical steps could differ
    # in the last bit (and two runs drift apart); index_select's backward (index_add) sums in index order.
    first_BV = first_UV.index_select(0, inverse_B)
    return _suffix_scores(
        model, input_ids, score_mask.bool(), prefix_B, length_B, first_BV, pmask_UL.index_select(0, inverse_B),
        cache, temperature, with_entropy,
    )  # fmt: skip


def _work(prefixes: list[list[int]], prefix_B: torch.Tensor, length_B: torch.Tensor) -> int:
    """Token positions the shared path embeds: the distinct prompts left-padded, then every row's response."""
    return len(prefixes) * max(len(p) for p in prefixes) + len(prefix_B) * int((length_B - prefix_B).max())


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def _right_padded(mask_BT: torch.Tensor, length_B: torch.Tensor) -> bool:
    cols_T = torch.arange(mask_BT.shape[1], device=mask_BT.device)
    return bool(torch.equal(mask_BT.bool(), cols_T[None] < length_B[:, None]))


def _prefill(
    model: torch.nn.Module, prefixes: list[list[int]], cache: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the distinct prompts left-padded into ``cache``; return the logits after each prompt ``[U, V]`` (they
    predict the first response token) and the prompts' mask ``[U, Lp]``."""
    U, Lp = len(prefixes), max(len(p) for p in prefixes)
    ids_UL = torch.zeros((U, Lp), dtype=torch.long, device=device)
    mask_UL = torch.zeros((U, Lp), dtype=torch.long, device=device)
    for u, p in enumerate(prefixes):
        ids_UL[u, Lp - len(p) :] = torch.tensor(p, dtype=torch.long, device=device)
        mask_UL[u, Lp - len(p) :] = 1
    out = model(
        input_ids=ids_UL,
        attention_mask=mask_UL,
        position_ids=position_ids_from_mask(mask_UL),
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1], mask_UL


def _suffix_scores(
    model: torch.nn.Module,
    ids_BT: torch.Tensor,
    scored_BT: torch.Tensor,
    prefix_B: torch.Tensor,
    length_B: torch.Tensor,
    first_BV: torch.Tensor,
    pmask_BL: torch.Tensor,
    cache: Any,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The responses ``[B, Ls]`` (each row's tokens from its prompt's end) on top of the expanded cache; scores go
    back to the rows' own columns. Token 0 of a row's suffix is scored from ``first_BV``, token ``j`` from the
    suffix forward at ``j - 1``."""
    T = ids_BT.shape[1]
    Ls = int((length_B - prefix_B).max())
    cols_BS = prefix_B[:, None] + torch.arange(Ls, device=ids_BT.device)[None]
    in_row_BS = cols_BS < length_B[:, None]
    cols_BS = cols_BS.clamp(max=T - 1)
    sid_BS = ids_BT.gather(1, cols_BS).masked_fill(~in_row_BS, 0)
    sscored_BS = scored_BT.gather(1, cols_BS) & in_row_BS
    inputs = {
        "input_ids": sid_BS,
        "attention_mask": torch.cat([pmask_BL, in_row_BS.long()], dim=1),
        "position_ids": cols_BS,
        **with_cache(model, cache),
        "use_cache": True,
    }
    rest_BS = sscored_BS.clone()
    rest_BS[:, 0] = False  # column 0 of the suffix is scored from the prompt's last logits
    logp_BS, ent_BS = scores_at(model, inputs, sid_BS, rest_BS, temperature, with_entropy)
    logp0_B, ent0_B = logprobs_from_logits(
        first_BV, sid_BS[:, 0], temperature=temperature, with_entropy=with_entropy
    )
    first_BS = F.pad(sscored_BS[:, :1], (0, Ls - 1))
    logp_BS = torch.where(first_BS, logp0_B[:, None], logp_BS)
    logp_BT = _to_rows(logp_BS, cols_BS, sscored_BS, T)
    if ent_BS is None or ent0_B is None:
        return logp_BT, None
    return logp_BT, _to_rows(torch.where(first_BS, ent0_B[:, None], ent_BS), cols_BS, sscored_BS, T)


def _to_rows(x_BS: torch.Tensor, cols_BS: torch.Tensor, keep_BS: torch.Tensor, T: int) -> torch.Tensor:
    """Scatter suffix values back to their row columns ``[B, T]`` (0 outside the scored positions)."""
    out_BT = torch.zeros((x_BS.shape[0], T), dtype=x_BS.dtype, device=x_BS.device)
    return out_BT.scatter_add(1, cols_BS, x_BS * keep_BS)
