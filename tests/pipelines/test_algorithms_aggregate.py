"""Loss aggregation modes and masked reductions, against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import Aggregation, aggregate_loss, masked_mean, masked_var

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
