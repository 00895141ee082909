"""Collators (rows of token ids -> dicts of torch tensors) and batch samplers (by count or by token budget).

A collator's tensors are keyed by their :mod:`roll.core.columns` names (``input_ids_BT``, ``attention_mask_BT``,
``labels_BT``, ``position_ids_BT`` ...), so they are a :class:`~roll.core.batch.Batch`'s columns as they are.
Conventions: ``labels_BT`` are *unshifted* (the Hugging Face convention: the model predicts ``labels[t + 1]`` from
position ``t`` and shifts internally) and ``-100`` where no loss is taken. Shapes use B batch, T tokens, N packed
sequences. Rows are the outputs of :mod:`roll.data.tokenize` (``input_ids``/``labels`` for SFT,
``prompt_ids``/``chosen_ids``/``rejected_ids`` for pairs, ``prompt_ids`` for generation): data fields, not
columns, so they keep their plain names.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from roll.core import columns as C
from roll.core.columns import IGNORE_INDEX
from roll.core.errors import DataError

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


def collate_packed(rows: Sequence[Row], *, budget: int | None = None) -> dict[str, torch.Tensor]:
    """Padding-free SFT batch: every row concatenated into one row of length T = sum of lengths (<= ``budget``).

    Returns ``input_ids_BT`` [1, T], ``position_ids_BT`` [1, T] (restart at 0 for each sequence), ``labels_BT``
    [1, T] with the first token of every sequence set to -100 (so the last token of one sequence never learns to
    predict the first of the next), and the flash-attention varlen arguments under the kernel's own names:
    ``cu_seqlens`` [N + 1] int32 boundaries and ``max_seqlen`` (a 0-d tensor).
    """
    lengths = [len(r["input_ids"]) for r in rows]
    if budget is not None and sum(lengths) > budget:
        raise DataError(
            f"packed rows hold {sum(lengths)} tokens > budget {budget}; batch with token_budget_batches"
        )
    input_ids = torch.tensor([t for r in rows for t in r["input_ids"]], dtype=torch.long)  # [T]
    position_ids = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])  # [T]
    labels = torch.tensor([t for r in rows for t in r["labels"]], dtype=torch.long)  # [T]
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)  # [N + 1]
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    labels[cu_seqlens[:-1].long()] = IGNORE_INDEX
    return {
        C.INPUT_IDS: input_ids[None],
        C.POSITION_IDS: position_ids[None],
        C.LABELS: labels[None],
        "cu_seqlens": cu_seqlens,
        "max_seqlen": torch.tensor(max(lengths), dtype=torch.int32),
    }


def _pair_rows(rows: Sequence[Row]) -> tuple[list[list[int]], list[int]]:
    """Chosen sequences then rejected sequences (2B of them), and each one's prompt length."""
    seqs = [list(r["prompt_ids"]) + list(r["chosen_ids"]) for r in rows]
    seqs += [list(r["prompt_ids"]) + list(r["rejected_ids"]) for r in rows]
    prompt_lengths = [len(r["prompt_ids"]) for r in rows] * 2
    return seqs, prompt_lengths


def collate_preference(rows: Sequence[Row], *, pad_id: int) -> dict[str, torch.Tensor]:
    """DPO batch: chosen rows 0..B-1 and rejected rows B..2B-1, right-padded.

    ``input_ids_BT``, ``attention_mask_BT``, ``labels_BT`` (-100 on the prompt and on pad, so a summed label
    log-prob is the continuation's), ``prompt_length_B``; B here is 2 x the pairs.
    """
    seqs, prompt_lengths = _pair_rows(rows)
    labels = [[IGNORE_INDEX] * p + s[p:] for s, p in zip(seqs, prompt_lengths)]
    return {
        C.INPUT_IDS: _pad_right(seqs, pad_id),  # [2B, T]
        C.ATTENTION_MASK: _pad_right([[1] * len(s) for s in seqs], 0),  # [2B, T]
        C.LABELS: _pad_right(labels, IGNORE_INDEX),  # [2B, T]
        C.PROMPT_LENGTH: torch.tensor(prompt_lengths, dtype=torch.long),  # [2B]
    }


def collate_reward_pairs(rows: Sequence[Row], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Reward-model batch: chosen rows 0..B-1, rejected B..2B-1, right-padded.

    ``input_ids_BT``, ``attention_mask_BT``, ``last_index_B`` (position of each sequence's last real token, where
    the scalar reward is read), ``prompt_length_B``; B here is 2 x the pairs.
    """
    seqs, prompt_lengths = _pair_rows(rows)
    return {
        C.INPUT_IDS: _pad_right(seqs, pad_id),  # [2B, T]
        C.ATTENTION_MASK: _pad_right([[1] * len(s) for s in seqs], 0),  # [2B, T]
        C.LAST_INDEX: torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long),  # [2B]
        C.PROMPT_LENGTH: torch.tensor(prompt_lengths, dtype=torch.long),  # [2B]
    }


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


# -------------------------------------------------------------------------------------------------- samplers


def count_batches(
    n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> list[list[int]]:
    """Index lists of ``batch_size`` rows (the last one shorter unless ``drop_last``), shuffled by seed."""
    order = list(range(n))
    if shuffle:
        random.Random(seed).shuffle(order)
    batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in batches if len(b) == batch_size] if drop_last else batches


def batch_cost(lengths: Sequence[int], *, packed: bool) -> int:
    """Tokens a batch occupies: the sum when packed, ``rows * longest`` when padded."""
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def token_budget_batches(
    lengths: Sequence[int],
    budget: int,
    *,
    packed: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    bucket_size: int | None = None,
) -> list[list[int]]:
    """Dynamic batching: index lists whose :func:`batch_cost` is at most ``budget``; every index exactly once.

    Indices are shuffled by seed; with ``bucket_size``, each run of ``bucket_size`` shuffled indices is sorted by
    length so a batch holds similar lengths (less padding) while the data order stays random at bucket scale.
    Batches are filled greedily in that order, then shuffled so long batches are not all at the end. A row
    longer than the budget raises (it could never fit).
    """
    too_long = [i for i, n in enumerate(lengths) if n > budget]
    if too_long:
        raise DataError(
            f"rows {too_long[:10]} are longer than the token budget {budget}; raise it or truncate"
        )
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)
    if bucket_size:
        order = [
            i
            for s in range(0, len(order), bucket_size)
            for i in sorted(order[s : s + bucket_size], key=lambda j: lengths[j])
        ]
    batches = _greedy(order, lengths, budget, packed)
    if shuffle:
        rng.shuffle(batches)
    return batches


def _greedy(order: Sequence[int], lengths: Sequence[int], budget: int, packed: bool) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    total = longest = 0
    for i in order:
        n = lengths[i]
        cost = total + n if packed else (len(current) + 1) * max(longest, n)
        if current and cost > budget:
            batches.append(current)
            current, total, longest = [], 0, 0
        current.append(i)
        total, longest = total + n, max(longest, n)
    return [*batches, current] if current else batches


class TokenBudgetSampler:
    """A ``batch_sampler`` for ``torch.utils.data.DataLoader`` built on :func:`token_budget_batches`.

    ``set_epoch(e)`` reseeds (``seed + e``) so each epoch sees a new order, reproducibly.
    """

    def __init__(self, lengths: Sequence[int], budget: int, *, seed: int = 0, **options: Any) -> None:
        self.lengths, self.budget, self.seed, self.options = list(lengths), budget, seed, options
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        return token_budget_batches(self.lengths, self.budget, seed=self.seed + self.epoch, **self.options)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())
