"""The distillation roles: a student that trains on its logits, and a teacher whose top-k sends are keyed per step.

- :class:`DistillStudentWorker`: :class:`~roll.pipelines.sft.worker.SFTWorker` (greedy answers and held-out NLL for
  evaluation) whose strategy runs :data:`~.losses.STUDENT_FORWARD` (:func:`~.losses.student_forward` under fsdp2,
  its reader of the vocabulary-parallel logits under megatron), so :class:`~.losses.DistillLoss` sees logits. Its
  row methods dispatch by model-parallel group (``MP_SPLIT``: under megatron TP/PP peers get the same rows). :meth:`~DistillStudentWorker.train_distill` takes the teacher's top-k either inside the batch (object
  store path) or receives them from the teacher ranks over a transfer group (collective path).
- :class:`DistillTeacherWorker`: :class:`~roll.workers.roles.teacher.TeacherWorker` whose collective send uses a
  per-step store key, so a student never reads a previous step's request or reply from the group's store.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, WorkerContext, register
from roll.pipelines.distill.losses import STUDENT_FORWARD, DistillLoss, kd_mask
from roll.pipelines.sft.worker import SFTWorker
from roll.workers.logits_transfer import receive_topk, send_topk
from roll.workers.model_update import CollectiveGroup
from roll.workers.roles import _common
from roll.workers.roles.spec import TrainerSpec
from roll.workers.roles.teacher import TeacherWorker


class DistillStudentWorker(SFTWorker):
    """One data-parallel rank of the student (``spec.threads``: torch's intra-op threads, for CPU runs)."""

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx, spec)
        self._transfer: dict[str, CollectiveGroup] = {}

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        """As :meth:`ActorTrainWorker.setup`, with the strategy's forward replaced by :data:`STUDENT_FORWARD`."""
        self.strategy, self.tokenizer = _common.build_trainer(self, self.spec, forward=STUDENT_FORWARD)

    @register(Dispatch.ONE_TO_ALL)
    def join_transfer_group(
        self, name: str, addr: str, port: int, world_size: int, rank_offset: int, backend: str = "gloo"
    ) -> None:
        """Join logits-transfer group ``name`` as rank ``rank_offset + self.rank`` (teachers come first)."""
        self._transfer[name] = CollectiveGroup(addr, port, rank_offset + self.rank, world_size, backend)

    @register(Dispatch.MP_SPLIT)
    def train_distill(
        self, batch: Batch, loss_fn: DistillLoss, receive: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """One optimizer step; ``receive`` (``name``, ``key``, ``num_sources``, ``k``) first fetches this rank's
        top-k rows from the teacher ranks. Returns the strategy's metrics plus the loss's (``kd/...``)."""
        if receive is not None:
            batch = self._with_received_topk(batch, **receive)
        return _common.train_on(self.strategy, batch, loss_fn, prefix="kd/")

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
        out = self.strategy.forward_only(mb[C.INPUT_IDS], mb[C.ATTENTION_MASK], **_common.vision_kwargs(real))
        mb = {k: v.to(out.logp_BT.device) for k, v in mb.items()}
        n_kd = float(kd_mask(mb, distill_prompt=loss_fn.distill_prompt).sum())
        kd_only = replace(loss_fn, kd_weight=1.0).bind(mb)  # the divergence's token mean over these rows
        return [{"kd_sum": float(kd_only(out, mb)[0]) * n_kd, "kd_tokens_sum": n_kd}]

    def _with_received_topk(self, batch: Batch, name: str, key: str, num_sources: int, k: int) -> Batch:
        ids_B = batch.tensors[C.SAMPLE_ID]
        T = batch.tensors[C.INPUT_IDS].shape[1]
        topk = receive_topk(self._transfer[name], ids_B, num_sources=num_sources, T=T, k=k, key=key)
        return batch.union(topk)


class DistillTeacherWorker(TeacherWorker):
    """:class:`TeacherWorker` with :meth:`send_topk_keyed` (a store key per step)."""

    @register(Dispatch.DP_SPLIT)
    def send_topk_keyed(self, batch: Batch, k: int, name: str, num_sources: int, key: str) -> list[int]:
        """``send_topk`` with store key ``key``: every step must use a new key (the store keeps old ones)."""
        _common.require(batch, C.SAMPLE_ID)
        real = _common.real_rows(batch)
        values_BTK, indices_BTK = self._topk(real, k)
        topk = Batch(
            {C.TOPK_VALUES: values_BTK, C.TOPK_INDICES: indices_BTK, C.SAMPLE_ID: real.tensors[C.SAMPLE_ID]}
        )
        send_topk(self._groups[name], topk, src=self.rank, num_sources=num_sources, key=key)
        return [int(i) for i in real.tensors[C.SAMPLE_ID]]
