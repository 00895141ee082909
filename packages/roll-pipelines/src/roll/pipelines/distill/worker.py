"""The distillation student: a policy trainer whose strategy returns logits, and the methods that train on them.

:class:`DistillStudentWorker` holds four parts (see :mod:`roll.core.cluster.dispatch`): a
:class:`~roll.workers.roles.actor.PolicyTrainer` whose strategy runs :data:`~.losses.STUDENT_FORWARD`
(:func:`~.losses.student_forward` under fsdp2, its reader of the vocabulary-parallel logits under megatron), so
:class:`~.losses.DistillLoss` sees logits; :class:`~roll.pipelines.sft.worker.SFTEvaluation` (greedy answers and
held-out NLL); :class:`~roll.workers.roles.topk_receiver.TopkReceiver` (``join_transfer_group``, the receiving end
of the teacher's top-k); and :class:`DistillStudent` (``train_distill``, ``received_topk``, ``eval_distill``). Its
row methods dispatch by model-parallel group (``MP_SPLIT``: under megatron TP/PP peers get the same rows).
:meth:`~DistillStudent.train_distill` takes the teacher's top-k either inside the batch (object store path) or
receives them from the teacher ranks over a transfer group (collective path). The teacher is a plain
:class:`~roll.workers.roles.teacher.TeacherWorker`: each step's ``send_topk`` uses its own store key, so a student
never reads a previous step's request or reply from the group's store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.pipelines.distill.losses import STUDENT_FORWARD, DistillLoss, kd_mask
from roll.pipelines.sft.worker import SFTEvaluation
from roll.workers.roles import _common
from roll.workers.roles.actor import PolicyTrainer
from roll.workers.roles.spec import TrainerSpec
from roll.workers.roles.topk_receiver import TopkReceiver


class DistillStudent:
    """The student's distillation methods over ``trainer`` (built with :data:`STUDENT_FORWARD`), receiving the
    teacher's top-k through ``receiver`` on the collective path; a part of :class:`DistillStudentWorker`."""

    def __init__(self, trainer: PolicyTrainer, receiver: TopkReceiver) -> None:
        self.trainer = trainer
        self.receiver = receiver

    @register(Dispatch.MP_SPLIT)
    def train_distill(
        self, batch: Batch, loss_fn: DistillLoss, receive: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """One optimizer step; ``receive`` (``name``, ``key``, ``num_sources``, ``k``) first fetches this rank's
        top-k rows from the teacher ranks. Returns the strategy's metrics plus the loss's (``kd/...``)."""
        if receive is not None:
            batch = self._with_received_topk(batch, **receive)
        return _common.train_on(self.trainer.strategy, batch, loss_fn, prefix="kd/")

    @register(Dispatch.MP_SPLIT)
    def received_topk(self, batch: Batch, receive: dict[str, Any]) -> Batch:
        """The top-k rows this rank receives for ``batch`` (tests and benchmarks of the collective path)."""
        got = self._with_received_topk(batch, **receive)
        return Batch({name: got.tensors[name] for name in (C.SAMPLE_ID, C.TOPK_VALUES, C.TOPK_INDICES)})

    @register(Dispatch.MP_SPLIT)
    @torch.no_grad()
    def eval_distill(self, batch: Batch, loss_fn: DistillLoss) -> list[dict[str, float]]:
        """Summed divergence to the teacher and distilled-token count of this rank's real rows (``*_sum``)."""
        real = _common.real_rows(batch)
        if len(real) == 0:
            return [{"kd_sum": 0.0, "kd_tokens_sum": 0.0}]
        mb = _common.micro_batch(real)
        out = self.trainer.strategy.forward_only(
            mb[C.INPUT_IDS], mb[C.ATTENTION_MASK], **_common.vision_kwargs(real)
        )
        mb = {k: v.to(out.logp_BT.device) for k, v in mb.items()}
        n_kd = float(kd_mask(mb, distill_prompt=loss_fn.distill_prompt).sum())
        kd_only = replace(loss_fn, kd_weight=1.0).bind(mb)  # the divergence's token mean over these rows
        return [{"kd_sum": float(kd_only(out, mb)[0]) * n_kd, "kd_tokens_sum": n_kd}]

    def _with_received_topk(self, batch: Batch, name: str, key: str, num_sources: int, k: int) -> Batch:
        return batch.union(self.receiver.receive(batch, name=name, num_sources=num_sources, k=k, key=key))


class DistillStudentWorker(Worker):
    """One data-parallel rank of the student (``spec``: what it trains; ``spec.threads``: torch's intra-op
    threads, for CPU runs). Call ``setup`` on the cluster first."""

    parts: ClassVar[Mapping[str, type]] = {
        "trainer": PolicyTrainer,
        "evaluation": SFTEvaluation,
        "transfer": TopkReceiver,
        "student": DistillStudent,
    }

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx)
        self.trainer = PolicyTrainer(self, spec, forward=STUDENT_FORWARD)
        self.evaluation = SFTEvaluation(self.trainer)
        self.transfer = TopkReceiver(self)
        self.student = DistillStudent(self.trainer, self.transfer)
