"""The driver's side of a weight update: :class:`ModelUpdateGroup` picks the transport and drives the workers'
side of it (:mod:`roll.workers.model_update`, which holds the transports themselves and imports torch). This
module imports no torch, so a driver that never runs a model never loads it.

Its two ends are typed by the cluster methods it calls (:class:`WeightSource`, :class:`WeightSink`,
:class:`InProcessUpdate`), Protocols that the generated handles of :mod:`roll.workers.roles.clusters` satisfy
structurally (``TrainCluster`` / ``GenerateCluster``), so mypy checks every call here against the worker methods.
They are Protocols, not the handles, because the handle module imports the roles, which import this one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard

from roll.core.cluster import ClusterMethod, WorkerInfo
from roll.core.config.sections import RoleConfig
from roll.core.errors import WorkerError

__all__ = [
    "InProcessUpdate",
    "Mode",
    "ModelUpdateGroup",
    "UpdateReport",
    "WeightSink",
    "WeightSource",
    "pick_update_mode",
]

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


class _UpdateEnd(Protocol):
    """What both ends are besides their methods: a :class:`~roll.core.cluster.Cluster`'s role and ranks."""

    @property
    def role(self) -> str: ...
    @property
    def role_cfg(self) -> RoleConfig: ...
    @property
    def world_size(self) -> int: ...
    @property
    def infos(self) -> list[WorkerInfo]: ...
    @property
    def methods(self) -> Mapping[str, ClusterMethod[..., Any]]: ...


class WeightSource(_UpdateEnd, Protocol):
    """The sending end: a cluster with the :class:`~roll.workers.roles.sender.WeightSender` part
    (``ActorTrainCluster``, ``HybridActorCluster``)."""

    @property
    def stage_weights(self) -> ClusterMethod[[float, bool], list[int]]: ...
    @property
    def weight_bucket(self) -> ClusterMethod[[int], tuple[Any, int]]: ...
    @property
    def share_weight_bucket(self) -> ClusterMethod[[int], list[tuple[dict[str, Any], Any, int]]]: ...
    @property
    def release_weights(self) -> ClusterMethod[[], list[None]]: ...
    @property
    def update_endpoint(self) -> ClusterMethod[[], tuple[str, int]]: ...
    @property
    def join_update_group(self) -> ClusterMethod[[str, str, int, int, int, str], list[None]]: ...
    @property
    def broadcast_weights(self) -> ClusterMethod[[str, float, int], list[tuple[int, int] | None]]: ...
    @property
    def weights_checksum(self) -> ClusterMethod[..., list[str]]:
        """``(dtype: str | None = None)``: the trainer's weights (``...``: a Protocol cannot state the default)."""
        ...


class _Served(_UpdateEnd, Protocol):
    """What :meth:`ModelUpdateGroup.verify` reads of the receiving end, whichever it is."""

    @property
    def policy_version(self) -> ClusterMethod[[], list[int]]: ...


class WeightSink(_Served, Protocol):
    """The receiving end of an update between two clusters: an :class:`~roll.workers.roles.infer.ActorInferWorker`
    cluster (``ActorInferCluster``)."""

    @property
    def update_weights(self) -> ClusterMethod[[list[Any], int], list[int]]: ...
    @property
    def update_weights_ipc(self) -> ClusterMethod[[dict[str, Any], Any, int], list[int]]: ...
    @property
    def join_update_group(self) -> ClusterMethod[[str, str, int, int, int, str], list[None]]: ...
    @property
    def receive_weights(self) -> ClusterMethod[[str, int], list[int]]: ...
    @property
    def weights_checksum(self) -> ClusterMethod[..., list[str]]:
        """``(dtype: str | None = None)``: the weights each rank serves."""
        ...


class InProcessUpdate(WeightSource, _Served, Protocol):
    """One cluster on both ends (``HybridActorCluster``): each rank copies its trainer's weights into its own
    inference model."""

    @property
    def sync_weights(self) -> ClusterMethod[[int, float], list[int]]: ...
    @property
    def served_checksum(self) -> ClusterMethod[..., list[str]]:
        """``(dtype: str | None = None)``: the weights each rank's inference side serves."""
        ...


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
        train: WeightSource,
        infer: WeightSink | InProcessUpdate,
        *,
        bucket_mb: float = 256.0,
        mode: Mode = "auto",
        backend: str | None = None,
        start_version: int = 0,
    ) -> None:
        self.train, self.infer = train, infer
        self._in_process = train if _one_cluster(train, infer) and _syncs_in_process(train) else None
        self._sink = infer if _receives(infer) else None
        self.bucket_mb = bucket_mb
        self.mode: str = _pick_mode(train, infer) if mode == "auto" else mode
        if (self.mode == "in_process") != _one_cluster(train, infer):
            raise WorkerError(
                f"model update {train.role} -> {infer.role}: mode 'in_process' is for one (hybrid) cluster on "
                f"both ends and the only mode for it; got mode {mode!r}"
            )
        if (self._in_process or self._sink) is None:
            raise WorkerError(
                f"model update {train.role} -> {infer.role}: "
                + (f"{train.role} has no sync_weights: one cluster on both ends must be a HybridActorWorker one"
                   if self.mode == "in_process" else
                   f"{infer.role} cannot load another cluster's weights (no update_weights/receive_weights): "
                   "send them to an ActorInferWorker cluster")
            )  # fmt: skip
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
        if self._in_process is not None:  # mode "in_process" (checked in __init__)
            buckets, nbytes = (
                self._in_process.sync_weights(self.version, self.bucket_mb)[0],
                0,
            )  # nothing leaves
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
        # weights_checksum is the trainer's on both train roles; a hybrid serving both ends of its own update
        # names its served weights' served_checksum, a generator's weights_checksum is what it serves.
        want = self.train.weights_checksum()[0]
        hybrid = self._in_process
        got = hybrid.served_checksum() if hybrid is not None else self._receiver().weights_checksum()
        versions = self.infer.policy_version()
        bad = [r for r, (c, v) in enumerate(zip(got, versions)) if c != want or v != self.version]
        if bad:
            raise WorkerError(
                f"{self.infer.role} ranks {bad} do not serve the trainer's weights at policy version "
                f"{self.version} (versions {versions})"
            )

    def _receiver(self) -> WeightSink:
        """The receiving cluster of an update between two clusters (``__init__`` made sure there is one)."""
        if self._sink is None:
            raise WorkerError(
                f"model update to {self.infer.role}: mode {self.mode!r} needs a receiving cluster"
            )
        return self._sink

    def _sync_object_store(self) -> tuple[int, int]:
        count = self.train.stage_weights(self.bucket_mb, False)[0]
        total = 0
        for i in range(count):
            ref, nbytes = self.train.weight_bucket(i)
            self._receiver().update_weights([ref], self.version)
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
                self._receiver().update_weights_ipc(handles, shared[0][1], self.version)
                total += shared[0][2]
        finally:
            self.train.release_weights()
        return count, total

    def _sync_collective(self) -> tuple[int, int]:
        if not self._joined:
            self._join()
        sending = self.train.broadcast_weights.submit(self._group_name, self.bucket_mb, self.version)
        receiving = self._receiver().receive_weights.submit(self._group_name, self.version)
        receiving.result()
        buckets, nbytes = next(r for r in sending.result() if r is not None)
        return int(buckets), int(nbytes)

    def _join(self) -> None:
        addr, port = self.train.update_endpoint()
        world = 1 + self.infer.world_size
        sender = self.train.join_update_group.submit(self._group_name, addr, port, world, 0, self.backend)
        receivers = self._receiver().join_update_group.submit(
            self._group_name, addr, port, world, 1, self.backend
        )
        sender.result()
        receivers.result()
        self._joined = True


def _one_cluster(train: WeightSource, infer: WeightSink | InProcessUpdate) -> bool:
    """Both ends are one cluster (``is``, spelled with ``id``: mypy deems the two Protocols disjoint)."""
    return id(train) == id(infer)


def _syncs_in_process(end: WeightSource) -> TypeGuard[InProcessUpdate]:
    """``end``'s workers copy their own weights into their inference model (a hybrid cluster)."""
    return "sync_weights" in end.methods


def _receives(end: WeightSink | InProcessUpdate) -> TypeGuard[WeightSink]:
    """``end``'s workers load weights another cluster sends (an inference cluster)."""
    return {"update_weights", "update_weights_ipc", "join_update_group", "receive_weights"} <= set(
        end.methods
    )


def _pick_mode(train: WeightSource, infer: WeightSink | InProcessUpdate) -> str:
    group = train.role_cfg.device_group
    return pick_update_mode(
        same_cluster=_one_cluster(train, infer),
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
