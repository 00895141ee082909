"""DAPO sample shaping: overlong filter, soft overlong punishment, dynamic-sampling group filter."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.dapo import (
    dynamic_sampling_filter,
    dynamic_sampling_rows,
    overlong_filter,
    soft_overlong_penalty,
)


def test_overlong_filter() -> None:
    mask_BT = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = overlong_filter(mask_BT, torch.tensor([False, True]))
    assert_close(got, torch.tensor([[1, 1, 0], [0, 0, 0]]))


def test_soft_overlong_penalty_golden() -> None:
    """max_len 10, cache 4 -> free up to 6 tokens, then linear to -1 at 10, -1 beyond:
    lengths [5, 6, 7, 8, 10, 12] -> [0, 0, -1/4, -1/2, -1, -1]; factor 0.5 halves it."""
    lengths_B = torch.tensor([5, 6, 7, 8, 10, 12])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    assert_close(soft_overlong_penalty(lengths_B, max_len=10, cache_len=4), expected)
    assert_close(soft_overlong_penalty(lengths_B, max_len=10, cache_len=4, penalty_factor=0.5), expected / 2)
    with pytest.raises(ConfigError, match="cache_len"):
        soft_overlong_penalty(lengths_B, max_len=10, cache_len=0)


def test_dynamic_sampling_filter() -> None:
    """Groups [1,1,1,1], [1,0,1,1], [0,0,0,0], [0,1,0,1]: the two all-equal groups go.
    Population stds of the others: sqrt(3)/4 = 0.433 and 0.5; min_std 0.45 also drops the first,
    max_std 0.45 drops the second."""
    rewards_PG = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 1]])
    result = dynamic_sampling_filter(rewards_PG)
    assert result.keep_P.tolist() == [False, True, False, True]
    assert (result.num_kept, result.num_all_equal, result.num_std_out_of_range) == (2, 2, 0)
    result = dynamic_sampling_filter(rewards_PG, min_std=0.45)
    assert result.keep_P.tolist() == [False, False, False, True]
    assert (result.num_kept, result.num_all_equal, result.num_std_out_of_range) == (1, 2, 1)
    result = dynamic_sampling_filter(rewards_PG, max_std=0.45)
    assert result.keep_P.tolist() == [False, True, False, False]
    with pytest.raises(ConfigError, match="min_std"):
        dynamic_sampling_filter(rewards_PG, min_std=0.5, max_std=0.1)


def test_dynamic_sampling_over_ragged_id_groups_matches_the_layout_rule() -> None:
    """Groups by id (agentic: a timed-out env leaves its group short). Group 7 = [1, 1, 1] all equal: dropped;
    group 3 = [0, 1] (std 0.5) kept; group 5 = [0, 0, 0, 1] (std sqrt(3)/4 = 0.433) kept at min_std 0.4 and
    dropped as out of range at min_std 0.45. The rows follow their group wherever they sit in the batch."""
    rewards_B = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    groups_B = torch.tensor([7, 3, 5, 7, 3, 5, 7, 5, 5])
    keep_B, result = dynamic_sampling_rows(rewards_B, groups_B, min_std=0.4)
    assert keep_B.tolist() == [False, True, True, False, True, True, False, True, True]
    assert (result.num_kept, result.num_all_equal, result.num_std_out_of_range) == (2, 1, 0)
    keep_B, result = dynamic_sampling_rows(rewards_B, groups_B, min_std=0.45)
    assert keep_B.tolist() == [False, True, False, False, True, False, False, False, False]
    assert (result.num_kept, result.num_all_equal, result.num_std_out_of_range) == (1, 1, 1)
