"""DAPO's sample shaping (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"):
overlong filtering, soft overlong punishment, and the dynamic-sampling group filter.

Clip-higher and the token-level loss, DAPO's other two ingredients, live in :mod:`.policy_loss`
(``clip_high``) and :mod:`.aggregate` (``token-mean``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from roll.core.errors import ConfigError


def overlong_filter(mask_BT: torch.Tensor, truncated_B: torch.Tensor) -> torch.Tensor:
    """Overlong filtering: a copy of ``mask_BT`` with every truncated sample's row zeroed, so a response cut off
    by the length limit (whose reward is noise) contributes no gradient."""
    return mask_BT * (~truncated_B.bool()).to(mask_BT.dtype).unsqueeze(-1)


def soft_overlong_penalty(
    lengths_B: torch.Tensor, *, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment (DAPO eq. 13), to add to the outcome reward. With ``L = max_len``,
    ``C = cache_len`` and response length ``y``::

        0                      if y <= L - C
        ((L - C) - y) / C      if L - C < y <= L   (linear from 0 down to -1)
        -1                     if y > L

    times ``penalty_factor``. ``lengths_B`` are response lengths in tokens.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ConfigError(f"overlong cache_len must be in (0, max_len={max_len}], got {cache_len}")
    expected = max_len - cache_len
    lengths = lengths_B.to(torch.float32)
    penalty_B = ((expected - lengths) / cache_len).clamp(min=-1.0, max=0.0)
    return penalty_factor * penalty_B


@dataclass(frozen=True)
class GroupFilterResult:
    """Which groups dynamic sampling keeps: ``keep_P`` (bool per prompt) and counts for logging."""

    keep_P: torch.Tensor
    num_kept: int
    num_all_equal: int
    num_std_out_of_range: int


def dynamic_sampling_filter(
    rewards_PG: torch.Tensor,
    *,
    drop_all_equal: bool = True,
    min_std: float = 0.0,
    max_std: float = math.inf,
) -> GroupFilterResult:
    """DAPO dynamic sampling: keep groups whose rewards carry a learning signal.

    A group whose rewards are all equal (all right or all wrong) has zero group-normalized advantage and only
    dilutes the batch; with ``drop_all_equal`` it is dropped. The std bounds (population std over ``G``) keep
    groups with ``min_std <= std <= max_std``. A group that fails both is counted once, as all-equal.
    """
    if min_std < 0 or min_std > max_std:
        raise ConfigError(
            f"dynamic sampling needs 0 <= min_std <= max_std, got min_std={min_std}, max_std={max_std}"
        )
    all_equal_P = (rewards_PG == rewards_PG[:, :1]).all(dim=-1)
    std_P = rewards_PG.to(torch.float64).std(dim=-1, correction=0)
    in_range_P = (std_P >= min_std) & (std_P <= max_std)
    drop_equal_P = all_equal_P if drop_all_equal else torch.zeros_like(all_equal_P)
    keep_P = ~drop_equal_P & in_range_P
    return GroupFilterResult(
        keep_P=keep_P,
        num_kept=int(keep_P.sum()),
        num_all_equal=int(drop_equal_P.sum()),
        num_std_out_of_range=int((~drop_equal_P & ~in_range_P).sum()),
    )


def dynamic_sampling_rows(
    rewards_B: torch.Tensor, group_ids_B: torch.Tensor, *, min_std: float = 0.0, max_std: float = math.inf
) -> tuple[torch.Tensor, GroupFilterResult]:
    """:func:`dynamic_sampling_filter` over groups given by ids instead of a ``[P, G]`` layout (agentic groups
    may be ragged: an env that timed out leaves its group a member short). Returns ``keep_B`` (the rows of kept
    groups) and the counts, per group, as :func:`dynamic_sampling_filter` gives them."""
    keep_B = torch.zeros_like(group_ids_B, dtype=torch.bool)
    kept = equal = out_of_range = 0
    for group in torch.unique(group_ids_B):
        rows_B = group_ids_B == group
        result = dynamic_sampling_filter(rewards_B[rows_B][None, :], min_std=min_std, max_std=max_std)
        keep_B[rows_B] = bool(result.keep_P[0])
        kept, equal = kept + result.num_kept, equal + result.num_all_equal
        out_of_range += result.num_std_out_of_range
    return keep_B, GroupFilterResult(keep_B.new_tensor([]), kept, equal, out_of_range)
