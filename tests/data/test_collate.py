"""Collators build exact tensors; token-budget batching never exceeds its budget and covers every index once."""

from __future__ import annotations

import random

import pytest
import torch
from torch.testing import assert_close

from roll.core import columns as C
from roll.core.errors import DataError
from roll.data.collate import (
    TokenBudgetSampler,
    batch_cost,
    collate_packed,
    collate_preference,
    collate_prompts,
    collate_reward_pairs,
    collate_sft,
    count_batches,
    token_budget_batches,
)

X = -100
PAD = 0
ROWS = [
    {"input_ids": [11, 12, 13], "labels": [X, 12, 13]},
    {"input_ids": [21, 22, 23, 24, 25], "labels": [X, X, 23, 24, 25]},
    {"input_ids": [31, 32], "labels": [31, 32]},
]


def t(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def test_sft_right_padding() -> None:
    batch = collate_sft(ROWS, pad_id=PAD)
    assert_close(batch[C.INPUT_IDS], t([[11, 12, 13, 0, 0], [21, 22, 23, 24, 25], [31, 32, 0, 0, 0]]))
    assert_close(batch[C.ATTENTION_MASK], t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]))
    assert_close(batch[C.LABELS], t([[X, 12, 13, X, X], [X, X, 23, 24, 25], [31, 32, X, X, X]]))
    assert collate_sft(ROWS, pad_id=PAD, pad_to_multiple_of=4)[C.INPUT_IDS].shape == (3, 8)


def test_packing_boundaries_are_exact() -> None:
    batch = collate_packed(ROWS, budget=10)
    assert_close(batch[C.INPUT_IDS], t([[11, 12, 13, 21, 22, 23, 24, 25, 31, 32]]))
    assert_close(batch[C.POSITION_IDS], t([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]))
    # The first label of each sequence is masked: 31 would otherwise be learned from 25's position.
    assert_close(batch[C.LABELS], t([[X, 12, 13, X, X, 23, 24, 25, X, 32]]))
    assert_close(batch["cu_seqlens"], torch.tensor([0, 3, 8, 10], dtype=torch.int32))
    assert int(batch["max_seqlen"]) == 5
    with pytest.raises(DataError, match="10 tokens > budget 9"):
        collate_packed(ROWS, budget=9)


def test_preference_stacks_chosen_then_rejected() -> None:
    rows = [
        {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]},
        {"prompt_ids": [6], "chosen_ids": [7, 8, 9], "rejected_ids": [10]},
    ]
    batch = collate_preference(rows, pad_id=PAD)
    assert_close(batch[C.INPUT_IDS], t([[1, 2, 3, 0], [6, 7, 8, 9], [1, 2, 4, 5], [6, 10, 0, 0]]))
    assert_close(batch[C.ATTENTION_MASK], t([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]))
    assert_close(batch[C.LABELS], t([[X, X, 3, X], [X, 7, 8, 9], [X, X, 4, 5], [X, 10, X, X]]))
    assert_close(batch[C.PROMPT_LENGTH], torch.tensor([2, 1, 2, 1]))
    reward = collate_reward_pairs(rows, pad_id=PAD)
    assert_close(reward[C.INPUT_IDS], batch[C.INPUT_IDS])
    assert_close(reward[C.LAST_INDEX], torch.tensor([2, 3, 3, 1]))


def test_prompts_left_padded_with_positions_from_first_real_token() -> None:
    batch = collate_prompts(
        [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [8]}, {"prompt_ids": [1, 2]}], pad_id=PAD
    )
    assert_close(batch[C.INPUT_IDS], t([[5, 6, 7], [0, 0, 8], [0, 1, 2]]))
    assert_close(batch[C.ATTENTION_MASK], t([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    assert_close(batch[C.POSITION_IDS], t([[0, 1, 2], [0, 0, 0], [0, 0, 1]]))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("bucket_size", [None, 16])
def test_token_budget_batches_respect_budget_and_cover_each_index_once(
    packed: bool, bucket_size: int | None
) -> None:
    lengths = [random.Random(i).randint(1, 40) for i in range(200)]
    batches = token_budget_batches(lengths, 64, packed=packed, seed=1, bucket_size=bucket_size)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(batch_cost([lengths[i] for i in b], packed=packed) <= 64 for b in batches)
    assert batches == token_budget_batches(lengths, 64, packed=packed, seed=1, bucket_size=bucket_size)


def test_sorting_within_buckets_reduces_padding() -> None:
    lengths = [random.Random(i).randint(1, 60) for i in range(400)]
    plain = token_budget_batches(lengths, 128, seed=0)
    bucketed = token_budget_batches(lengths, 128, seed=0, bucket_size=64)
    assert len(bucketed) < len(plain)


def test_row_longer_than_budget_raises() -> None:
    with pytest.raises(DataError, match=r"rows \[1\] are longer than the token budget 8"):
        token_budget_batches([3, 9, 2], 8)


def test_count_batches_and_sampler() -> None:
    assert count_batches(5, 2, shuffle=False) == [[0, 1], [2, 3], [4]]
    assert count_batches(5, 2, shuffle=False, drop_last=True) == [[0, 1], [2, 3]]
    assert sorted(i for b in count_batches(7, 3, seed=4) for i in b) == list(range(7))
    sampler = TokenBudgetSampler([5, 5, 5, 5, 5, 5], 10, seed=0, packed=True)
    first = list(sampler)
    assert len(sampler) == 3 and all(len(b) == 2 for b in first)
    sampler.set_epoch(1)
    assert sorted(i for b in sampler for i in b) == list(range(6))
