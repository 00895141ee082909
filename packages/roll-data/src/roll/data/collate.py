"""Collators: rows of token ids -> dicts of torch tensors (SFT rows right-padded, generation prompts left-padded).

A collator's tensors are keyed by their :mod:`roll.core.columns` names (``input_ids_BT``, ``attention_mask_BT``,
``labels_BT``, ``position_ids_BT`` ...), so they are a :class:`~roll.core.batch.Batch`'s columns as they are.
Conventions: ``labels_BT`` are *unshifted* (the Hugging Face convention: the model predicts ``labels[t + 1]`` from
position ``t`` and shifts internally) and ``-100`` where no loss is taken. Shapes use B batch, T tokens, P prompt
tokens. Rows are the outputs of :mod:`roll.data.tokenize` (``input_ids``/``labels`` for SFT, ``prompt_ids``
for generation): data fields, not columns, so they keep their plain names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.core import columns as C
from roll.core.columns import IGNORE_INDEX

Row = Mapping[str, Any]


def _pad_right(seqs: Sequence[Sequence[int]], value: int, width: int | None = None) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0) if width is None else width
    out = torch.full((len(seqs), width), value, dtype=torch.long)  # [B, T]
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


def collate_sft(
    rows: Sequence[Row], *, pad_id: int, pad_to_multiple_of: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded SFT batch: ``input_ids_BT``, ``attention_mask_BT``, ``labels_BT`` (-100 on pad)."""
    ids = [r["input_ids"] for r in rows]
    width = _round_up(max(len(s) for s in ids), pad_to_multiple_of)
    input_ids = _pad_right(ids, pad_id, width)  # [B, T]
    attention_mask = _pad_right([[1] * len(s) for s in ids], 0, width)  # [B, T]
    labels = _pad_right([r["labels"] for r in rows], IGNORE_INDEX, width)  # [B, T]
    return {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask, C.LABELS: labels}


def collate_prompts(rows: Sequence[Row], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts for generation, so every prompt ends at the last column where generation starts.

    ``input_ids_BT``, ``attention_mask_BT``, ``position_ids_BT``, each [B, P]: positions are 0 at each row's first
    real token, counting up; pad positions hold 0 (masked anyway).
    """
    ids = [list(r["prompt_ids"]) for r in rows]
    width = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)  # [B, P]
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, P]
    for i, s in enumerate(ids):
        if s:
            input_ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attention_mask[i, width - len(s) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # [B, P]
    return {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask, C.POSITION_IDS: position_ids}
