"""roll's preference losses against TRL's own loss code on identical batches, to 1e-6.

TRL (in the lock, the ``bench`` group) computes DPO and KTO inside ``DPOTrainer._compute_loss`` /
``KTOTrainer._compute_loss`` and SimPO in ``CPOTrainer.cpo_loss``. They are called unbound, on a minimal ``self``
holding only the attributes they read, so no trainer, dataset or optimizer is built. The ``model`` they call is
TRL's fused-LM-head interface (``model(..., labels=..., fused_lm_head=True).log_probs``): here an object returning
fixed per-token log-probs for each input, so both sides read exactly the same numbers and the comparison is of the
losses alone. roll's side gets the same per-token log-probs summed (or averaged) over the completion tokens.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms.preference import (
    dpo_loss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    sequence_logp,
    simpo_loss,
)

trl = pytest.importorskip("trl", reason="TRL is in the bench group (uv sync installs it by default)")
CPOTrainer = pytest.importorskip("trl.experimental.cpo").CPOTrainer

ATOL = RTOL = 1e-6


class FixedLogProbs:
    """TRL's fused-LM-head model interface, answering each ``input_ids`` tensor with its preset per-token log-probs
    (shape ``[B, T - 1]``: position ``t`` scores token ``t + 1``)."""

    training = True

    def __init__(self) -> None:
        self.table: dict[int, torch.Tensor] = {}

    def add(self, input_ids: torch.Tensor, log_probs: torch.Tensor) -> None:
        self.table[input_ids.data_ptr()] = log_probs

    def __call__(self, *, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        lp = self.table[input_ids.data_ptr()]
        zeros = torch.zeros_like(lp)
        return SimpleNamespace(
            log_probs=lp, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool(), log_sum_sq_probs=zeros
        )


def _self(model: FixedLogProbs, **attrs: Any) -> SimpleNamespace:
    accelerator = SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    base = dict(model=model, accelerator=accelerator, aux_loss_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
                _total_train_tokens=0, _tp_size=1, precompute_ref_logps=True)  # fmt: skip
    return SimpleNamespace(**{**base, **attrs})


def _sequences(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids [rows, width]``, a completion mask (2-token prompt, completions of varied length, right
    padding) and per-token log-probs ``[rows, width - 1]`` already zero outside the completion (TRL's fused head
    returns 0 at ignored labels)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 50, (rows, width), generator=g)
    lengths = torch.randint(1, width - 2, (rows,), generator=g)
    pos = torch.arange(width)[None, :]
    completion_mask = ((pos >= 2) & (pos < 2 + lengths[:, None])).long()
    log_probs = -torch.rand(rows, width - 1, generator=g) * 3 * completion_mask[:, 1:]
    return input_ids, completion_mask, log_probs


def _roll_logp(
    log_probs: torch.Tensor, completion_mask: torch.Tensor, *, average: bool = False
) -> torch.Tensor:
    return sequence_logp(log_probs, completion_mask[:, 1:], average=average)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_match_trl(loss_type: str) -> None:
    """TRL's batch is [chosen rows, rejected rows]; its IPO divides each side's log-ratio by the completion length
    (roll's ``average_logp``, the default for IPO)."""
    input_ids, completion_mask, log_probs = _sequences(8, 9, seed=0)
    ref = torch.randn(8) - 4.0
    model = FixedLogProbs()
    model.add(input_ids, log_probs)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion_mask,
              "ref_chosen_logps": ref[:4], "ref_rejected_logps": ref[4:]}  # fmt: skip
    me = _self(model, ld_alpha=None, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
               beta=0.3, use_weighting=False)  # fmt: skip
    theirs = trl.DPOTrainer._compute_loss(me, model, inputs, False)
    logp = _roll_logp(log_probs, completion_mask)
    if loss_type == "sigmoid":
        ours = dpo_loss(logp[:4], logp[4:], ref[:4], ref[4:], beta=0.3).loss
    else:  # average the log-ratio, as TRL does: (logp - ref) / n == mean logp - ref / n
        n = completion_mask.sum(-1).float()
        ours = ipo_loss(logp[:4] / n[:4], logp[4:] / n[4:], ref[:4] / n[:4], ref[4:] / n[4:], beta=0.3).loss
    assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


def _cpo_self(loss_type: str, beta: float, gamma: float, label_smoothing: float) -> SimpleNamespace:
    return SimpleNamespace(alpha=0.0, loss_type=loss_type, beta=beta, simpo_gamma=gamma,
                           label_smoothing=label_smoothing, accelerator=SimpleNamespace(device="cpu"))  # fmt: skip


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_simpo_matches_trl_cpo_trainer(label_smoothing: float) -> None:
    """TRL's SimPO is ``CPOTrainer(loss_type="simpo")``; its ``cpo_loss`` takes the length-averaged log-probs
    (``average_log_prob=True`` for simpo). Its NLL term (``cpo_alpha``) is outside ``cpo_loss`` and not SimPO."""
    _, completion_mask, log_probs = _sequences(8, 9, seed=1)
    avg = _roll_logp(log_probs, completion_mask, average=True)
    losses, chosen_r, rejected_r = CPOTrainer.cpo_loss(
        _cpo_self("simpo", 2.0, 1.2, label_smoothing), avg[:4], avg[4:]
    )
    ours = simpo_loss(avg[:4], avg[4:], beta=2.0, gamma=1.2, label_smoothing=label_smoothing)
    assert_close(ours.loss, losses.mean(), atol=ATOL, rtol=RTOL)
    assert_close(ours.chosen_rewards_B, chosen_r, atol=ATOL, rtol=RTOL)
    assert_close(ours.rejected_rewards_B, rejected_r, atol=ATOL, rtol=RTOL)


def test_cdpo_matches_trl_sigmoid_with_label_smoothing() -> None:
    """TRL 1.x's DPOTrainer dropped cDPO's ``label_smoothing`` from ``sigmoid``; CPOTrainer's ``sigmoid`` keeps the
    formula. Fed the log-ratios ``logp - ref`` as its "log-probs", it is cDPO exactly."""
    g = torch.Generator().manual_seed(2)
    pc, pr, rc, rr = (-torch.rand(6, generator=g) * 10 for _ in range(4))
    losses, _, _ = CPOTrainer.cpo_loss(_cpo_self("sigmoid", 0.4, 0.0, 0.15), pc - rc, pr - rr)
    assert_close(
        dpo_loss(pc, pr, rc, rr, beta=0.4, label_smoothing=0.15).loss, losses.mean(), atol=ATOL, rtol=RTOL
    )


@pytest.mark.parametrize(("seed", "weights"), [(3, (1.0, 1.0)), (4, (1.0, 1.33)), (5, (0.7, 1.0))])
def test_kto_matches_trl(seed: int, weights: tuple[float, float]) -> None:
    """Unpaired rows with labels; TRL's KL rows are the batch's completions rotated by one,
    ``(x_i, y_{i-1})``, scored by the policy (``KL_input_ids``) and the reference (``ref_KL_logps``)."""
    input_ids, completion_mask, log_probs = _sequences(6, 8, seed=seed)
    kl_ids, kl_mask, kl_log_probs = _sequences(6, 8, seed=seed + 100)
    g = torch.Generator().manual_seed(seed)
    label = torch.tensor([True, False, True, True, False, False])
    ref, ref_kl = torch.randn(6, generator=g) - 5.0, torch.randn(6, generator=g) - 6.0
    model = FixedLogProbs()
    model.add(input_ids, log_probs)
    model.add(kl_ids, kl_log_probs)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion_mask,
             "KL_input_ids": kl_ids, "KL_attention_mask": torch.ones_like(kl_ids), "KL_completion_mask": kl_mask,
             "label": label, "ref_logps": ref, "ref_KL_logps": ref_kl}  # fmt: skip
    me = _self(model, calculate_KL=True, loss_type="kto", beta=0.2, desirable_weight=weights[0],
               undesirable_weight=weights[1])  # fmt: skip
    me._compute_kl_logps = lambda m, b: trl.KTOTrainer._compute_kl_logps(me, m, b)
    theirs = trl.KTOTrainer._compute_loss(me, model, batch, False)
    z0 = kto_reference_point(_roll_logp(kl_log_probs, kl_mask), ref_kl)
    ours = kto_loss(_roll_logp(log_probs, completion_mask), ref, label, kl=z0, beta=0.2,
                    desirable_weight=weights[0], undesirable_weight=weights[1])  # fmt: skip
    assert_close(ours.loss, theirs, atol=ATOL, rtol=RTOL)
    assert_close(ours.metrics["kl"], torch.tensor(me._metrics["train"]["kl"][-1]), atol=ATOL, rtol=RTOL)
    assert_close(ours.metrics["chosen_reward"], torch.tensor(me._metrics["train"]["rewards/chosen"][-1]))
    assert float(z0) > 0  # the KL term is exercised, not clamped away
