"""``WeightSender``: the sending end of a cross-process model update, a part of any role that holds a trainer.

:class:`~roll.workers.model_update.ModelUpdateGroup` drives these methods on its ``train`` cluster when the
receiving cluster is another process (object store, CUDA IPC or a collective; see :mod:`roll.workers.model_update`).
:class:`~roll.workers.roles.actor.ActorTrainWorker` sends to the generators this way, and
:class:`~roll.workers.roles.hybrid.HybridActorWorker` (which syncs its own generator in process) sends its warmed-up
trainer weights to a separate reference with the same methods. A role holds one as a part (see
:mod:`roll.core.cluster.dispatch`): ``parts = {"sender": WeightSender}`` and, in ``__init__``,
``self.sender = WeightSender(self, lambda: <the train strategy>)``; the cluster then has its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
import torch

from roll.core.cluster import Dispatch, Worker, register
from roll.workers.config import LoraConfig
from roll.workers.model_update import (
    BucketMeta,
    CollectiveGroup,
    IPCHandles,
    free_port,
    pack_bucket,
    plan_update,
    send_weights,
    share_bucket,
    update_payload,
)
from roll.workers.types import TrainStrategy


class WeightSender:
    """Stage, bucket and send the trainer's weights (its adapter alone under LoRA). See the module docstring.

    ``worker``: the role holding this part (its rank and node address); ``strategy``: returns the role's train
    strategy, which its ``setup`` builds after this part exists.
    """

    def __init__(self, worker: Worker, strategy: Callable[[], TrainStrategy]) -> None:
        self._worker = worker
        self._strategy = strategy
        self._groups: dict[str, CollectiveGroup] = {}
        self._staged: dict[str, torch.Tensor] = {}
        self._staged_lora: LoraConfig | None = None
        self._bucket_names: list[list[str]] = []
        self._shared: list[torch.Tensor] = []  # CUDA IPC buckets, alive until release_weights

    @property
    def rank(self) -> int:
        return self._worker.rank

    @register(Dispatch.ONE_TO_ALL)
    def stage_weights(self, bucket_mb: float, all_ranks: bool = False) -> int:
        """Gather what to send (collective: the full weights, or the adapter alone under LoRA) and plan buckets;
        returns the bucket count (0 off rank 0 unless ``all_ranks``: CUDA IPC, where each rank serves its GPU)."""
        named, self._staged_lora = update_payload(self._strategy(), all_ranks=all_ranks)
        self._staged = named if self.rank == 0 or all_ranks else {}
        self._bucket_names = plan_update(self._staged, bucket_mb, self._staged_lora)
        return len(self._bucket_names)

    @register(Dispatch.ONE_TO_ALL)
    def share_weight_bucket(self, index: int) -> tuple[IPCHandles, BucketMeta, int]:
        """Bucket ``index`` of the staged weights on this rank's GPU, as CUDA IPC handles (one per tensor) keyed by
        GPU UUID, with its layout and size; the bucket stays alive until :meth:`release_weights`."""
        bucket = pack_bucket({n: self._staged[n] for n in self._bucket_names[index]}, lora=self._staged_lora)
        handles, flat_N = share_bucket(bucket)
        self._shared.append(flat_N)
        return handles, bucket.meta, bucket.meta.nbytes

    @register(Dispatch.RANK_ZERO)
    def weight_bucket(self, index: int) -> tuple[Any, int]:
        """Bucket ``index`` of the staged weights, put into the object store: ``(ObjectRef, bytes)``."""
        bucket = pack_bucket({n: self._staged[n] for n in self._bucket_names[index]}, lora=self._staged_lora)
        return ray.put(bucket), bucket.meta.nbytes

    @register(Dispatch.ONE_TO_ALL)
    def release_weights(self) -> None:
        self._staged, self._bucket_names, self._staged_lora, self._shared = {}, [], None, []

    @register(Dispatch.RANK_ZERO)
    def update_endpoint(self) -> tuple[str, int]:
        """Address and a free port for a collective update group hosted by this rank."""
        return self._worker.node_ip, free_port()

    @register(Dispatch.ONE_TO_ALL)
    def join_update_group(
        self, name: str, addr: str, port: int, world_size: int, rank_offset: int, backend: str
    ) -> None:
        """Rank 0 joins the update group ``name`` as its rank ``rank_offset``; other ranks only send via it."""
        if self.rank == 0:
            self._groups[name] = CollectiveGroup(addr, port, rank_offset, world_size, backend)

    @register(Dispatch.ONE_TO_ALL)
    def broadcast_weights(self, name: str, bucket_mb: float, policy_version: int) -> tuple[int, int] | None:
        """Broadcast the weights (the adapter alone under LoRA) over group ``name`` (collective over this role
        too). Rank 0: (buckets, bytes)."""
        named, lora = update_payload(self._strategy())
        if self.rank != 0:
            return None
        return send_weights(self._groups[name], named, bucket_mb, policy_version, lora=lora)
