"""Each training loss's ``score_mask`` covers every position its value reads: with the log-probs (and entropy)
zeroed outside the mask, as the strategy leaves them when it scores only those positions, the loss and its
metrics are unchanged."""

from __future__ import annotations

import torch

from roll.core import columns as C
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.dpo.losses import DPOLoss
from roll.pipelines.sft.losses import SFTLoss
from roll.workers.types import ForwardOutput, LossFn, MicroBatch


def _same_outside_zeroed(loss_fn: LossFn, mb: MicroBatch, with_entropy: bool) -> None:
    g = torch.Generator().manual_seed(0)
    shape = mb[C.INPUT_IDS].shape
    logp_BT, ent_BT = -torch.rand(shape, generator=g), torch.rand(shape, generator=g)
    keep_BT = loss_fn.score_mask(mb)  # type: ignore[attr-defined]
    assert 0 < int(keep_BT.sum()) < keep_BT.numel()  # the mask leaves positions out, so the check can fail
    full = loss_fn(ForwardOutput(logp_BT, ent_BT if with_entropy else None), mb)
    cut = loss_fn(ForwardOutput(logp_BT * keep_BT, ent_BT * keep_BT if with_entropy else None), mb)
    torch.testing.assert_close(cut[0], full[0])
    assert full[1].keys() == cut[1].keys()
    for key in full[1]:
        torch.testing.assert_close(torch.as_tensor(cut[1][key]), torch.as_tensor(full[1][key]))


def _labels(rows: int) -> torch.Tensor:
    """``rows`` of 6 positions: a 2-token prompt (-100), then 2 + row % 3 response tokens, then padding (-100)."""
    labels = torch.full((rows, 6), -100)
    for r in range(rows):
        labels[r, 2 : 4 + r % 3] = 7
    return labels


def test_sft_loss_reads_only_its_score_mask() -> None:
    labels = _labels(3)
    _same_outside_zeroed(
        SFTLoss(), {C.INPUT_IDS: torch.ones(3, 6, dtype=torch.long), C.LABELS: labels}, False
    )


def test_dpo_loss_reads_only_its_score_mask() -> None:
    mb = {C.INPUT_IDS: torch.ones(4, 6, dtype=torch.long), C.LABELS: _labels(4),
          C.REF_SEQ_LOGP: torch.tensor([-3.0, -4.0, -2.0, -5.0])}  # fmt: skip
    _same_outside_zeroed(DPOLoss(beta=0.1), mb, False)


def test_policy_loss_reads_only_its_score_mask() -> None:
    algo = preset_config("grpo", kl_mode="none", kl_coef=0.0, entropy_coef=0.01)
    mb = {C.INPUT_IDS: torch.ones(3, 6, dtype=torch.long), C.RESPONSE_MASK: (_labels(3) != -100).long(),
          C.ADVANTAGES: torch.tensor([[1.0], [-0.5], [0.3]]).expand(3, 6)}  # fmt: skip
    _same_outside_zeroed(PolicyLoss(algo, norm_len=6, use_old_logp=False), mb, True)
