"""One key vocabulary to the loss, and what a loss asks of the strategy declared, not probed."""

from __future__ import annotations

import pytest
import torch

from roll.core import columns as C
from roll.core.batch import PAD_COLUMN, Batch
from roll.workers.roles._common import ZeroWeight, micro_batch
from roll.workers.types import ForwardOutput, LossDefaults, LossFn, MicroBatch


class _NLL(LossDefaults):
    def __call__(self, output: ForwardOutput, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * mb[C.RESPONSE_MASK]).sum(), {}

    def count_units(self, mb: MicroBatch) -> float:
        return float(mb[C.RESPONSE_MASK].sum())


class _Undeclared:
    """A loss written before the declarations: callable and counting, but saying nothing about the rest."""

    needs_entropy = False

    def __call__(self, output: ForwardOutput, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return output.logp_BT.sum(), {}

    def count_units(self, mb: MicroBatch) -> float:
        return 1.0


def test_micro_batch_is_the_batch_columns_under_their_names() -> None:
    """No alias copies (``input_ids`` beside ``input_ids_BT``): the strategy gets the Batch's own keys, less the
    DP pad column."""
    ids_BT = torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask_BT = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = Batch(
        {C.INPUT_IDS: ids_BT, C.ATTENTION_MASK: mask_BT, C.RESPONSE_MASK: mask_BT, PAD_COLUMN: torch.zeros(2)}
    )
    mb = micro_batch(batch)
    assert set(mb) == {C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK}
    assert torch.equal(mb[C.INPUT_IDS], ids_BT) and torch.equal(mb[C.ATTENTION_MASK], mask_BT)


def test_defaults_declare_nothing_asked_and_complete_the_protocol() -> None:
    loss = _NLL()
    mb = {C.RESPONSE_MASK: torch.ones(2, 3)}
    assert isinstance(loss, LossFn)
    assert (loss.needs_entropy, loss.paired_rows) == (False, False)
    assert loss.score_mask(mb) is None and loss.inert_rows(mb) is None
    assert not isinstance(_Undeclared(), LossFn)  # a missing declaration is caught, not read as "no"


def test_zero_weight_keeps_the_inner_entropy_and_declares_nothing_else() -> None:
    class _Entropic(_NLL):
        needs_entropy = True
        paired_rows = True

    zero = ZeroWeight(_Entropic())
    mb = {C.RESPONSE_MASK: torch.ones(2, 3)}
    assert zero.needs_entropy and not zero.paired_rows and zero.score_mask(mb) is None
    out = ForwardOutput(logp_BT=torch.full((2, 3), -1.0, requires_grad=True))
    loss_sum, metrics = zero(out, mb)
    assert float(loss_sum.detach()) == 0.0 and metrics == {} and zero.count_units(mb) == 0.0


def test_a_loss_without_declarations_or_a_batch_with_old_keys_fails_naming_the_fix() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.core.errors import DataError, WorkerError
    from roll.workers.config import FSDP2Config
    from roll.workers.fsdp2 import FSDP2TrainStrategy

    cfg = Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32)  # fmt: skip
    strategy = FSDP2TrainStrategy(Qwen2ForCausalLM(cfg), FSDP2Config.model_validate({"device": "cpu"}))
    ids_BT = torch.tensor([[5, 6, 7]])
    batch = {
        C.INPUT_IDS: ids_BT,
        C.ATTENTION_MASK: torch.ones_like(ids_BT),
        C.RESPONSE_MASK: torch.ones_like(ids_BT),
    }
    with pytest.raises(WorkerError, match=r"_Undeclared is not a LossFn: it lacks \['paired_rows', 'score_mask', "
                       r"'inert_rows'\]; derive it from roll.workers.types.LossDefaults"):  # fmt: skip
        strategy.train_step(batch, _Undeclared())  # type: ignore[arg-type]
    old = {"input_ids": ids_BT, "attention_mask": torch.ones_like(ids_BT)}
    with pytest.raises(DataError, match=r"has no 'attention_mask_BT'.*roll\.core\.columns names"):
        strategy.train_step(old, _NLL())
