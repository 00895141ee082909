"""Loss aggregation modes and masked reductions, against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import Aggregation, aggregate_loss, masked_mean, masked_var
from roll.pipelines.algorithms.choices import LossAggMode

LOSS_BT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK_BT = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),
        ("seq-mean-token-sum", 3.5),
        ("seq-mean-token-mean", 2.75),
        ("seq-mean-token-sum-norm", 0.875),
    ],
)
def test_modes_golden(mode: str, expected: float) -> None:
    """loss [[1,2,3],[4,5,6]], mask [[1,1,0],[1,0,0]] (the 3, 5, 6 are padding):

    - token-mean: (1 + 2 + 4) / 3 tokens = 7/3
    - seq-mean-token-sum: per-seq sums 3 and 4 -> (3 + 4) / 2 = 3.5
    - seq-mean-token-mean: per-seq means 1.5 and 4 -> (1.5 + 4) / 2 = 2.75
    - seq-mean-token-sum-norm (norm_len 4): (3/4 + 4/4) / 2 = 0.875
    """
    got = aggregate_loss(LOSS_BT, MASK_BT, mode=mode, norm_len=4)  # type: ignore[arg-type]
    assert_close(got, torch.tensor(expected))


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_micro_batches_sum_to_global(mode: str) -> None:
    """Splitting a batch of 6 into 3 micro-batches, with the global token (or sequence) count passed to each,
    gives losses that *sum* to the full-batch value; the same holds for the gradients."""
    torch.manual_seed(0)
    loss_BT = torch.randn(6, 5, requires_grad=True)
    mask_BT = (torch.rand(6, 5) > 0.3).long()
    mask_BT[0] = 0  # an empty row still counts as a sequence
    full = aggregate_loss(loss_BT, mask_BT, mode=mode, norm_len=8)  # type: ignore[arg-type]
    (full_grad,) = torch.autograd.grad(full, loss_BT)
    agg = Aggregation(mode, num_global_tokens=int(mask_BT.sum()), num_global_seqs=6, norm_len=8)  # type: ignore[arg-type]
    parts = [agg(loss_BT[i : i + 2], mask_BT[i : i + 2]) for i in range(0, 6, 2)]
    total = torch.stack(parts).sum()
    (micro_grad,) = torch.autograd.grad(total, loss_BT)
    assert_close(total, full)
    assert_close(micro_grad, full_grad)


def test_empty_mask_is_zero_not_nan() -> None:
    zeros_BT = torch.zeros(2, 3)
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert_close(aggregate_loss(LOSS_BT, zeros_BT, mode=mode), torch.tensor(0.0))


def test_norm_len_required_and_unknown_mode() -> None:
    with pytest.raises(ConfigError, match="norm_len"):
        aggregate_loss(LOSS_BT, MASK_BT, mode="seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="token-mean"):
        aggregate_loss(LOSS_BT, MASK_BT, mode="sum")  # type: ignore[arg-type]


def test_masked_mean_and_var() -> None:
    """x [1, 2, 3, 100] with the 100 masked: mean 2; Bessel var (1 + 0 + 1) / 2 = 1; population 2/3."""
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    assert_close(masked_mean(x, mask), torch.tensor(2.0))
    assert_close(masked_var(x, mask), torch.tensor(1.0))
    assert_close(masked_var(x, mask, unbiased=False), torch.tensor(2 / 3))


# A trajectory A split by a chat template into two segment rows, next to an unsplit trajectory B (9: padding).
UNSPLIT_BT = torch.tensor([[1.0, 2.0, 3.0, 6.0], [4.0, 0.0, 9.0, 9.0]])
UNSPLIT_MASK_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
SPLIT_BT = torch.tensor([[1.0, 9.0, 9.0, 9.0], [9.0, 2.0, 3.0, 6.0], [4.0, 0.0, 9.0, 9.0]])
SPLIT_MASK_BT = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 0]])
SHARES_B = torch.tensor([0.5, 0.5, 1.0])  # seq_units_B: A's two rows are half a sequence each
TOKENS_B = torch.tensor([4.0, 4.0, 2.0])  # seq_tokens_B: A has 4 trained tokens over its rows, B 2


@pytest.mark.parametrize(
    ("mode", "expected", "as_rows"),
    [
        ("seq-mean-token-sum", 8.0, 16 / 3),
        ("seq-mean-token-mean", 2.5, (1 + 11 / 3 + 2) / 3),
        ("seq-mean-token-sum-norm", 2.0, 4 / 3),
    ],
)
def test_a_split_trajectory_weighs_as_one_sequence(
    mode: LossAggMode, expected: float, as_rows: float
) -> None:
    """Unsplit, A's tokens are 1, 2, 3, 6 (sum 12, mean 3) and B's 4, 0 (sum 4, mean 2):

    - seq-mean-token-sum: (12 + 4) / 2 = 8; seq-mean-token-mean: (3 + 2) / 2 = 2.5;
      seq-mean-token-sum-norm (L = 4): (12/4 + 4/4) / 2 = 2.

    Split into rows [1] and [2, 3, 6] with shares 1/2 and A's 4 tokens: token-sum (1 + 11 + 4) / (1/2 + 1/2 + 1)
    = 8; token-mean (1/4 + 11/4 + 4/2) / 2 = 2.5; sum-norm (1/4 + 11/4 + 4/4) / 2 = 2: the unsplit values.
    Row by row (no shares) A would weigh twice: 16/3, (1 + 11/3 + 2)/3 = 2.2222, 4/3. The same holds when the
    two segments land in different micro-batches, each summed with the global count bound to 1 and the step
    divided by the global units (the shares' sum, 2), as the strategies do.
    """
    unsplit = aggregate_loss(UNSPLIT_BT, UNSPLIT_MASK_BT, mode=mode, norm_len=4)
    shares = {"seq_units_B": SHARES_B, "seq_tokens_B": TOKENS_B}
    split = aggregate_loss(SPLIT_BT, SPLIT_MASK_BT, mode=mode, norm_len=4, **shares)
    as_rows_got = aggregate_loss(SPLIT_BT, SPLIT_MASK_BT, mode=mode, norm_len=4)
    assert_close(unsplit, torch.tensor(expected))
    assert_close(split, torch.tensor(expected))
    assert_close(as_rows_got, torch.tensor(as_rows))
    agg = Aggregation(mode, num_global_seqs=1.0, norm_len=4)
    parts = [
        agg.for_rows(SHARES_B[rows], TOKENS_B[rows])(SPLIT_BT[rows], SPLIT_MASK_BT[rows])
        for rows in ([0, 2], [1])
    ]
    assert_close(sum(parts) / SHARES_B.sum(), torch.tensor(expected))


def test_shares_leave_token_mean_alone_and_an_unbound_aggregation_unchanged() -> None:
    """token-mean weighs tokens, split or not: (1 + 2 + 3 + 6 + 4 + 0) / 6 = 8/3 with or without shares; and
    for_rows(None, None) is the aggregation itself (an unsplit batch aggregates exactly as before)."""
    got = aggregate_loss(SPLIT_BT, SPLIT_MASK_BT, seq_units_B=SHARES_B, seq_tokens_B=TOKENS_B)
    assert_close(got, torch.tensor(8 / 3))
    agg = Aggregation("seq-mean-token-mean")
    assert agg.for_rows(None, None) is agg
