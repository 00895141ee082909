"""The driver's side of a weight update: :class:`ModelUpdateGroup` picks the transport and drives the workers'
side of it (:mod:`roll.workers.model_update`, which holds the transports themselves and imports torch). This
module imports no torch, so a driver that never runs a model never loads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from roll.core.errors import WorkerError

__all__ = ["Mode", "ModelUpdateGroup", "UpdateReport", "pick_update_mode"]

Mode = Literal["auto", "object_store", "collective", "in_process", "cuda_ipc"]


@dataclass(frozen=True)
class UpdateReport:
    """What one :meth:`ModelUpdateGroup.sync` did."""

    policy_version: int
    mode: str
    buckets: int
    bytes: int
    """Bytes sent between processes (0 in process: the tensors are handed over where they are)."""
    seconds: float


class ModelUpdateGroup:
    """Pushes ``train`` (an :class:`~roll.workers.roles.ActorTrainWorker` or hybrid Cluster: any
    :class:`~roll.workers.roles.sender.WeightSender`) weights to ``infer`` (an
    :class:`~roll.workers.roles.ActorInferWorker` Cluster); see the module docstring for the transports.

    ``mode="auto"`` picks ``in_process`` when ``train`` and ``infer`` are one cluster (a
    :class:`~roll.workers.roles.hybrid.HybridActorWorker` cluster: each rank copies its trainer's weights into its
    own inference model, ``sync_weights``), ``object_store`` when both roles name the same ``device_group``
    (colocated) or all actors share one node, and ``collective`` otherwise. ``backend`` (collective only): ``None`` = nccl when the
    trainer has GPUs, else gloo. Versions count up from ``start_version`` unless :meth:`sync` is given one.
    """

    def __init__(
        self,
        train: Any,
        infer: Any,
        *,
        bucket_mb: float = 256.0,
        mode: Mode = "auto",
        backend: str | None = None,
        start_version: int = 0,
    ) -> None:
        self.train, self.infer = train, infer
        self.bucket_mb = bucket_mb
        self.mode: str = _pick_mode(train, infer) if mode == "auto" else mode
        if (self.mode == "in_process") != (train is infer):
            raise WorkerError(
                f"model update {train.role} -> {infer.role}: mode 'in_process' is for one (hybrid) cluster on "
                f"both ends and the only mode for it; got mode {mode!r}"
            )
        gpus = train.role_cfg.gpus_per_worker > 0
        self.backend = backend or ("nccl" if gpus else "gloo")
        self.version = start_version
        self._group_name = f"update-{id(self)}"
        self._joined = False

    def sync(self, policy_version: int | None = None) -> UpdateReport:
        """Send the trainer's current weights to every inference worker, tagged ``policy_version`` (default:
        the last version + 1). Blocks until every inference worker has loaded them."""
        self.version = self.version + 1 if policy_version is None else policy_version
        start = time.monotonic()
        if self.mode == "in_process":
            buckets, nbytes = self.train.sync_weights(self.version, self.bucket_mb)[0], 0  # nothing leaves
        elif self.mode == "object_store":
            buckets, nbytes = self._sync_object_store()
        elif self.mode == "cuda_ipc":
            buckets, nbytes = self._sync_cuda_ipc()
        else:
            buckets, nbytes = self._sync_collective()
        return UpdateReport(self.version, self.mode, buckets, nbytes, time.monotonic() - start)

    def verify(self) -> None:
        """Raise :class:`WorkerError` unless every inference worker serves ``self.version`` with weights
        bit-identical to the trainer's."""
        # A trainer's weights_checksum is its trainer's, a hybrid's too (as a sender to another process it is those
        # the receivers must hold); a hybrid serving both ends of its own update names its served weights'.
        want = self.train.weights_checksum()[0]
        got = self.infer.served_checksum() if self.mode == "in_process" else self.infer.weights_checksum()
        versions = self.infer.policy_version()
        bad = [r for r, (c, v) in enumerate(zip(got, versions)) if c != want or v != self.version]
        if bad:
            raise WorkerError(
                f"{self.infer.role} ranks {bad} do not serve the trainer's weights at policy version "
                f"{self.version} (versions {versions})"
            )

    def _sync_object_store(self) -> tuple[int, int]:
        count = self.train.stage_weights(self.bucket_mb)[0]
        total = 0
        for i in range(count):
            ref, nbytes = self.train.weight_bucket(i)
            self.infer.update_weights([ref], self.version)
            total += nbytes
            del ref  # the bucket leaves the object store before the next one is put
        self.train.release_weights()
        return count, total

    def _sync_cuda_ipc(self) -> tuple[int, int]:
        count = self.train.stage_weights(self.bucket_mb, True)[0]
        total = 0
        try:
            for i in range(count):
                shared = self.train.share_weight_bucket(
                    i
                )  # per trainer rank: ({gpu uuid: handle}, meta, bytes)
                handles = {uuid: h for per_rank, _, _ in shared for uuid, h in per_rank.items()}
                self.infer.update_weights_ipc(handles, shared[0][1], self.version)
                total += shared[0][2]
        finally:
            self.train.release_weights()
        return count, total

    def _sync_collective(self) -> tuple[int, int]:
        if not self._joined:
            self._join()
        sending = self.train.broadcast_weights.submit(self._group_name, self.bucket_mb, self.version)
        receiving = self.infer.receive_weights.submit(self._group_name, self.version)
        receiving.result()
        buckets, nbytes = next(r for r in sending.result() if r is not None)
        return int(buckets), int(nbytes)

    def _join(self) -> None:
        addr, port = self.train.update_endpoint()
        world = 1 + self.infer.world_size
        sender = self.train.join_update_group.submit(self._group_name, addr, port, world, 0, self.backend)
        receivers = self.infer.join_update_group.submit(self._group_name, addr, port, world, 1, self.backend)
        sender.result()
        receivers.result()
        self._joined = True


def _pick_mode(train: Any, infer: Any) -> str:
    group = train.role_cfg.device_group
    return pick_update_mode(
        same_cluster=train is infer,
        colocated=group is not None and group == infer.role_cfg.device_group,
        gpus=train.role_cfg.gpus_per_worker > 0 and infer.role_cfg.gpus_per_worker > 0,
        one_node=len({info.node_id for info in [*train.infos, *infer.infos]}) == 1,
    )


def pick_update_mode(*, same_cluster: bool, colocated: bool, gpus: bool, one_node: bool) -> str:
    """The cheapest transport that exists: ``in_process`` for one (hybrid) cluster; ``cuda_ipc`` when the roles
    share GPUs (one device group); ``collective`` (NCCL broadcast) between GPUs they do not share; and on CPU
    the ``object_store`` on one node (shared memory), ``collective`` (gloo) across nodes."""
    if same_cluster:
        return "in_process"
    if gpus:
        return "cuda_ipc" if colocated else "collective"
    return "object_store" if colocated or one_node else "collective"
