"""Loss metrics come back from the strategy, unit-weighted over micro-batches (no side channel)."""

from __future__ import annotations

import pytest
import torch
from test_fsdp2 import config, tiny_model

from roll.core import columns as C
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.metrics import UnitWeightedMeans
from roll.workers.roles._common import ZeroWeight
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch


class TagMeanNLL(LossDefaults):
    """NLL on ``response_mask_BT``; its metric ``tag`` is the mean of ``tag_BT`` over the micro-batch's loss tokens."""

    def __call__(
        self, output: ForwardOutput, micro_batch: MicroBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask_BT = micro_batch[C.RESPONSE_MASK].float()
        tag = float((micro_batch["tag_BT"] * mask_BT).sum() / mask_BT.sum())
        return -(output.logp_BT * mask_BT).sum(), {"tag": tag}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def test_accumulator_weights_by_units_and_skips_zero_weight() -> None:
    """(1.0 * 3 + 5.0 * 1) / (3 + 1) = 2.0; a name seen only with 0 units is absent; ``b`` only in the second."""
    acc = UnitWeightedMeans()
    acc.add({"a": torch.tensor(1.0)}, 3.0)
    acc.add({"a": 5.0, "b": 7.0}, 1.0)
    acc.add({"a": 100.0, "c": 1.0}, 0.0)
    assert acc.means() == {"a": pytest.approx(2.0), "b": pytest.approx(7.0)}


def test_two_micro_batches_are_unit_weighted_exactly() -> None:
    """Rows 0-1 (micro-batch 1) have ``tag`` 1 and 3 loss tokens; rows 2-3 (micro-batch 2) ``tag`` 5 and 1 loss
    token. The step's ``tag`` is (1 * 3 + 5 * 1) / 4 = 2.0, not the micro-batch mean (1 + 5) / 2 = 3.0."""
    ids = torch.arange(1, 17).reshape(4, 4)
    loss_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    tag = torch.tensor([1.0, 1.0, 5.0, 5.0])[:, None].expand(4, 4)
    batch = {C.INPUT_IDS: ids, C.ATTENTION_MASK: torch.ones(4, 4, dtype=torch.long), C.RESPONSE_MASK: loss_mask,
             "tag_BT": tag}  # fmt: skip
    strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=2))
    result = strategy.train_step(batch, TagMeanNLL())
    assert result.num_micro_batches == 2 and result.num_units == 4.0
    assert result.metrics == {"tag": pytest.approx(2.0)}


def test_zero_weight_reports_no_metrics() -> None:
    """A padding-only rank trains with ZeroWeight: 0 units and no metrics, so it cannot skew the rank mean."""
    mb = {C.RESPONSE_MASK: torch.ones(1, 2), "tag_BT": torch.ones(1, 2)}
    loss, metrics = ZeroWeight(TagMeanNLL())(ForwardOutput(logp_BT=torch.ones(1, 2)), mb)
    assert float(loss) == 0.0 and metrics == {} and ZeroWeight(TagMeanNLL()).count_units(mb) == 0.0
