"""Distillation as a :class:`~roll.workers.types.LossFn`: :func:`~roll.pipelines.algorithms.divergence.distill_loss`
on micro-batches, exactly equal to it on the whole optimizer step.

The student needs its logits, not only log-probs, so its strategy runs :func:`student_forward`, which returns a
:class:`StudentOutput` with ``logits_BTV`` *aligned like the log-probs*: ``logits_BTV[b, t]`` is the distribution
of token ``t`` given ``ids[b, :t]`` (row ``t - 1`` of the model's output; row 0 is zeros). That is the alignment of
the teacher's ``topk_values_BTK`` (see :mod:`roll.workers.roles.teacher`) and of the unshifted ``labels_BT``, so
all three line up column by column and ``labels_BT[b, t]`` is the cross-entropy target of ``logits_BTV[b, t]``.

Exactness across micro-batches and ranks: the step's loss is ``w * mean_kd(div) + (1 - w) * mean_ce(nll)`` where
the two means run over *different* token sets when prompt tokens are distilled (``distill_prompt``: the
divergence on every predicted token, the cross-entropy on the response only). The pipeline binds the global
token counts of the optimizer step (:meth:`DistillLoss.bind`); each micro-batch returns its share of both means
(the divergence through ``distill_loss`` with ``kd_weight=1``, the cross-entropy through ``sft_cross_entropy``,
each summed and divided by its global count), and :meth:`DistillLoss.count_units` returns the micro-batch's
fraction of the step's distilled tokens, so the strategy's global unit count is 1 and its division is a no-op.
The sum over all micro-batches is then exactly ``distill_loss(..., kd_weight=w, agg=TOKEN_MEAN)`` on the whole
batch when both token sets agree (response-only distillation), and the two separately normalized means otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from roll.core import columns as C
from roll.core.columns import IGNORE_INDEX, LABELS
from roll.core.errors import WorkerError
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.choices import DivergenceName
from roll.pipelines.algorithms.divergence import distill_loss
from roll.workers.logprobs import has_prev_from_mask, position_ids_from_mask
from roll.workers.megatron_heads import ForwardPair, MegatronHead, StageOutput, restore_layout, token_logits
from roll.workers.metrics import LossMetrics
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch
from roll.workers.vision import vision_inputs


@dataclass(frozen=True)
class StudentOutput(ForwardOutput):
    """:class:`ForwardOutput` plus ``logits_BTV``, aligned with ``logp_BT`` (see the module docstring)."""

    logits_BTV: torch.Tensor | None = None


def student_forward(
    model: torch.nn.Module,
    ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    with_entropy: bool,
    temperature: float,
    vision: Mapping[str, Any] | None = None,
) -> StudentOutput:
    """The fsdp2 strategy's ``forward=`` for a distilled student: aligned logits plus ``logp_BT`` (``vision``: the
    rows' images, :mod:`roll.workers.vision`)."""
    inputs = {"input_ids": ids_BT, "attention_mask": mask_BT, "position_ids": position_ids_from_mask(mask_BT)}
    inputs.update(vision_inputs(model, ids_BT, mask_BT, vision))
    logits = model(**inputs, use_cache=False).logits
    logits_BTV = torch.cat([torch.zeros_like(logits[:, :1]), logits[:, :-1]], dim=1)
    logp_BT = token_logprobs(logits_BTV, ids_BT, temperature=temperature) * has_prev_from_mask(mask_BT)
    return StudentOutput(logp_BT=logp_BT, logits_BTV=logits_BTV)


def student_megatron_read(stage: StageOutput, temperature: float, with_entropy: bool) -> StudentOutput:
    """The megatron strategy's reader for a distilled student: :func:`student_forward`'s output from the last
    stage's vocabulary-parallel logits (gathered over TP to the full vocabulary, padded columns dropped)."""
    logits_BTV = token_logits(stage)
    logp_BT = token_logprobs(
        logits_BTV, restore_layout(stage.aligned.ids_BT, stage.aligned), temperature=temperature
    )
    return StudentOutput(logp_BT=logp_BT * has_prev_from_mask(stage.aligned.mask_BT), logits_BTV=logits_BTV)


STUDENT_FORWARD = ForwardPair(hf=student_forward, megatron=MegatronHead("lm", student_megatron_read))
"""The student's ``forward=`` for either train strategy (:mod:`roll.workers.megatron_heads`)."""

CHUNK_TOKENS = 1024
"""Positions per chunk of :func:`token_logprobs` (1024 x a 152k vocabulary: ~0.6 GB of fp32 at a time)."""


def token_logprobs(
    logits_BTV: torch.Tensor, ids_BT: torch.Tensor, *, temperature: float = 1.0, chunk: int = CHUNK_TOKENS
) -> torch.Tensor:
    """``log_softmax(logits_BTV / temperature)[b, t, ids_BT[b, t]]`` in fp32, ``chunk`` positions at a time.

    Equal to the one-shot ``log_softmax(...).gather(...)`` (up to float rounding of the log-sum-exp), without
    its fp32 ``[B, T, V]``: each chunk is ``gather - logsumexp`` under activation checkpointing, so autograd keeps
    only the (view of the) logits chunk and recomputes the fp32 cast in backward.
    """
    B, T, V = logits_BTV.shape
    flat_NV, ids_N = logits_BTV.reshape(B * T, V), ids_BT.reshape(B * T)
    parts = []
    for lo in range(0, B * T, chunk):
        args = (flat_NV[lo : lo + chunk], ids_N[lo : lo + chunk], temperature)
        if torch.is_grad_enabled() and flat_NV.requires_grad:
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args))
    return torch.cat(parts).view(B, T) if parts else logits_BTV.new_zeros(B, T, dtype=torch.float32)


def _chunk_logprobs(logits_NV: torch.Tensor, ids_N: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled_NV = logits_NV.float() if temperature == 1 else logits_NV.float() / temperature
    picked_N = scaled_NV.gather(-1, ids_N.unsqueeze(-1)).squeeze(-1)
    return picked_N - torch.logsumexp(scaled_NV, dim=-1)


def chunked_cross_entropy(
    logits_BTV: torch.Tensor, labels_BT: torch.Tensor, *, agg: Aggregation, chunk: int = CHUNK_TOKENS
) -> torch.Tensor:
    """:func:`~roll.pipelines.algorithms.preference.sft_cross_entropy` (``-log softmax(logits)[label]`` over
    labels other than ``-100``, reduced by ``agg``) through :func:`token_logprobs`: no fp32 ``[B, T, V]``."""
    mask_BT = labels_BT != IGNORE_INDEX
    nll_BT = -token_logprobs(logits_BTV, labels_BT.masked_fill(~mask_BT, 0), chunk=chunk)
    return agg(nll_BT, mask_BT)


def trained_labels(micro_batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``labels_BT`` with ``-100`` also where a token has no prediction (a row's first token)."""
    has_prev_BT = has_prev_from_mask(micro_batch[C.ATTENTION_MASK])
    return micro_batch[LABELS].masked_fill(~has_prev_BT, IGNORE_INDEX)


def kd_mask(micro_batch: Mapping[str, torch.Tensor], *, distill_prompt: bool) -> torch.Tensor:
    """Positions distilled: the trained (label) tokens, or with ``distill_prompt`` every predicted token."""
    if distill_prompt:
        return has_prev_from_mask(micro_batch[C.ATTENTION_MASK])
    return trained_labels(micro_batch) != IGNORE_INDEX


@dataclass
class DistillLoss(LossDefaults):
    """``kd_weight * divergence + (1 - kd_weight) * cross-entropy`` on the teacher's top-k (see module docstring).

    Reads ``topk_values_BTK``, ``topk_indices_BTK``, ``labels_BT`` and ``attention_mask``; needs a
    :class:`StudentOutput`. Call :meth:`bind` with the optimizer step's batch before training on it.
    """

    divergence: DivergenceName = "forward_kl"
    kd_weight: float = 1.0
    student_temperature: float = 1.0
    teacher_temperature: float = 1.0
    alpha: float = 0.1
    beta: float = 0.5
    mu: float = 0.5
    distill_prompt: bool = False
    num_kd_tokens: float | None = None
    num_ce_tokens: float | None = None

    def bind(self, batch: Mapping[str, torch.Tensor]) -> DistillLoss:
        """A copy that knows the global token counts of ``batch`` (the whole optimizer step, all ranks)."""
        n_kd = float(kd_mask(batch, distill_prompt=self.distill_prompt).sum())
        n_ce = float((trained_labels(batch) != IGNORE_INDEX).sum())
        return replace(self, num_kd_tokens=max(n_kd, 1.0), num_ce_tokens=max(n_ce, 1.0))

    def count_units(self, micro_batch: MicroBatch) -> float:
        n_kd = float(kd_mask(micro_batch, distill_prompt=self.distill_prompt).sum())
        return n_kd / self._counts()[0]

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        logits_BTV = getattr(output, "logits_BTV", None)
        if logits_BTV is None:
            raise WorkerError(
                "DistillLoss needs the student's logits: train it with DistillStudentWorker "
                "(its strategy runs roll.pipelines.distill.losses.student_forward)"
            )
        n_kd, n_ce = self._counts()
        device = logits_BTV.device
        mask_BT = kd_mask(micro_batch, distill_prompt=self.distill_prompt).to(device)
        kd, metrics = distill_loss(
            logits_BTV,
            micro_batch[C.TOPK_VALUES].to(device),
            micro_batch[C.TOPK_INDICES].to(device),
            mask_BT,
            divergence=self.divergence,
            student_temperature=self.student_temperature,
            teacher_temperature=self.teacher_temperature,
            alpha=self.alpha,
            beta=self.beta,
            mu=self.mu,
            agg=Aggregation("token-mean", num_global_tokens=n_kd),
        )
        loss = kd if self.kd_weight == 1 else self.kd_weight * kd
        if self.kd_weight < 1:
            ce = chunked_cross_entropy(
                logits_BTV, trained_labels(micro_batch).to(device), agg=Aggregation(num_global_tokens=n_ce)
            )
            loss = loss + (1 - self.kd_weight) * ce
            metrics = {**metrics, "ce_sum": ce.detach() * n_ce}
        return loss, self._local_metrics(metrics, micro_batch)

    def _counts(self) -> tuple[float, float]:
        if self.num_kd_tokens is None or self.num_ce_tokens is None:
            raise WorkerError(
                "DistillLoss has no global token counts: call loss.bind(batch) before train_step"
            )
        return self.num_kd_tokens, self.num_ce_tokens

    def _local_metrics(
        self, metrics: Mapping[str, torch.Tensor], micro_batch: MicroBatch
    ) -> dict[str, torch.Tensor]:
        out = {"kd_mean": metrics["kd_mean"]}
        if "ce_sum" in metrics:  # per trained token of this micro-batch
            n_ce = float((trained_labels(micro_batch) != IGNORE_INDEX).sum())
            out["ce_mean"] = metrics["ce_sum"] / max(n_ce, 1.0)
        return out
