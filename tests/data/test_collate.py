"""Collators build exact tensors: SFT rows right-padded with -100 labels, prompts left-padded."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from roll.core import columns as C
from roll.data.collate import collate_prompts, collate_sft

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


def test_prompts_left_padded_with_positions_from_first_real_token() -> None:
    batch = collate_prompts(
        [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [8]}, {"prompt_ids": [1, 2]}], pad_id=PAD
    )
    assert_close(batch[C.INPUT_IDS], t([[5, 6, 7], [0, 0, 8], [0, 1, 2]]))
    assert_close(batch[C.ATTENTION_MASK], t([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    assert_close(batch[C.POSITION_IDS], t([[0, 1, 2], [0, 0, 0], [0, 0, 1]]))
