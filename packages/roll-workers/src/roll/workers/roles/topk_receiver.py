"""``TopkReceiver``: the receiving end of the teacher -> student logits transfer, a part of a distillation student.

A student role holds one (``parts = {"transfer": TopkReceiver}``, see :mod:`roll.core.cluster.dispatch`): its
cluster then joins a transfer group with the teacher ranks (``join_transfer_group``) and receives the teacher's
top-k rows for its own rows (``receive_topk``); other parts of the role receive through :meth:`TopkReceiver.receive`
(roll-pipelines' distillation student does, in ``train_distill``). The protocol is
:mod:`roll.workers.logits_transfer`'s; :class:`~roll.workers.roles.teacher.TeacherWorker` is the sending end.
"""

from __future__ import annotations

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, register
from roll.workers import logits_transfer
from roll.workers.model_update import CollectiveGroup
from roll.workers.roles import _common


class TopkReceiver:
    """Join logits-transfer groups and receive top-k rows from the teacher ranks. See the module docstring."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._groups: dict[str, CollectiveGroup] = {}

    @register(Dispatch.ONE_TO_ALL)
    def join_transfer_group(
        self, name: str, addr: str, port: int, world_size: int, rank_offset: int, backend: str = "gloo"
    ) -> None:
        """Join the logits-transfer group ``name`` as rank ``rank_offset + rank`` (after the teachers)."""
        rank = rank_offset + self._worker.rank
        self._groups[name] = CollectiveGroup(addr, port, rank, world_size, backend)

    @register(Dispatch.DP_SPLIT)
    def receive_topk(self, batch: Batch, name: str, num_sources: int, k: int, key: str = "topk") -> Batch:
        """Receive the teacher's top-k rows for this rank's ``sample_id_B`` (teachers run ``send_topk`` with the
        same ``key`` at the same time); returns them in this rank's row order (``topk_values_BTK``,
        ``topk_indices_BTK``, ``sample_id_B``). Each call is one round (see :mod:`roll.workers.logits_transfer`)."""
        return self.receive(batch, name=name, num_sources=num_sources, k=k, key=key)

    def receive(self, batch: Batch, *, name: str, num_sources: int, k: int, key: str) -> Batch:
        """:meth:`receive_topk` for another part of the role, on the rows it holds."""
        _common.require(batch, C.SAMPLE_ID, C.INPUT_IDS)
        if name not in self._groups:
            raise RuntimeError(
                f"{self._worker.role} rank {self._worker.rank}: no logits-transfer group {name!r}; call "
                f"join_transfer_group({name!r}, ...) on the cluster first (joined: {sorted(self._groups)})"
            )
        T = batch.tensors[C.INPUT_IDS].shape[1]
        return logits_transfer.receive_topk(
            self._groups[name], batch.tensors[C.SAMPLE_ID], num_sources=num_sources, T=T, k=k, key=key
        )
