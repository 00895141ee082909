"""Training weights to inference workers: in buckets, versioned, by object store, in-process or collective.

Three transports, one wire format (named tensors packed into flat ``uint8`` buckets of at most ``bucket_mb``):

- **object store** (colocated roles: the trainer and the inference workers share a node/device group): trainer
  rank 0 gathers the full state dict once (``stage_weights``, collective over the trainer's ranks), then puts *one
  bucket at a time* into Ray's shared-memory object store (``weight_bucket``); inference workers read it with
  ``ray.get``, which on the same node maps the bucket's numpy buffer without copying, load it, and the driver
  drops the ref before asking for the next. Peak extra memory is one bucket in the object store.
- **in process** (one actor hosts both a train and an infer strategy, e.g. a ``HybridActorWorker`` that
  time-shares one GPU): :func:`sync_in_process` feeds the trainer's state dict, bucket by bucket, to the infer
  strategy's ``load_weights``; nothing but tensors is shared.
- **CUDA IPC** (colocated roles on GPUs: trainer and inference ranks share a device): every trainer rank gathers
  the full weights on its GPU, packs one bucket at a time into a flat CUDA tensor and returns its CUDA IPC handle
  (``torch.multiprocessing.reductions.reduce_tensor``, one per tensor) keyed by the GPU's UUID; each inference
  worker opens the handles of its own GPU (vLLM's worker processes open them themselves) and loads the tensors
  without a copy through host memory; the trainer keeps the bucket alive until the driver releases it.
- **collective** (disaggregated roles): a standalone ``torch.distributed`` group of trainer rank 0 plus every
  inference worker, built from its own ``TCPStore`` (hosted by trainer rank 0) and a ``ProcessGroupGloo`` (CPU) or
  ``ProcessGroupNCCL`` (GPU) made directly from that store. It is independent of each role's default process
  group (``new_group`` cannot span two default groups, and ``init_process_group`` may only run once per
  process). The bucket plan (names, dtypes, shapes, version) goes through the store; each bucket is one
  ``broadcast`` from rank 0.

Every update carries a ``policy_version``; inference strategies record it and stamp it on every sample.

LoRA (:mod:`roll.workers.lora`): a trainer with a LoRA adapter sends the adapter alone, ``A`` and ``B`` of each
adapted module (:func:`update_payload`), as one bucket whose :class:`BucketMeta` carries the
:class:`~roll.workers.config.LoraConfig` (``r``, ``alpha``, target modules); the base weights never change, so
they never travel. The inference strategy's ``load_adapter`` applies it (hf merges from pristine base copies,
vLLM serves it as a ``LoRARequest``); :func:`load_payload` picks ``load_weights`` or ``load_adapter`` by the meta.

The driver's side, :class:`~roll.workers.update_group.ModelUpdateGroup` (which transport, in which order), lives in
:mod:`roll.workers.update_group`, which imports no torch; it is re-exported here.
"""

from __future__ import annotations

import hashlib
import pickle
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist

from roll.core.errors import WorkerError
from roll.workers.config import LoraConfig
from roll.workers.types import InferStrategy, TrainStrategy
from roll.workers.update_group import Mode, ModelUpdateGroup, UpdateReport, pick_update_mode

__all__ = [
    "BucketMeta",
    "CollectiveGroup",
    "IPCHandles",
    "LoadsFromIPC",
    "Mode",
    "ModelUpdateGroup",
    "TensorBucket",
    "UpdateReport",
    "free_port",
    "load_payload",
    "open_tensors",
    "pack_bucket",
    "pick_update_mode",
    "plan_buckets",
    "plan_update",
    "receive_weights",
    "send_weights",
    "share_bucket",
    "sync_in_process",
    "unpack_bucket",
    "update_payload",
    "weights_checksum",
]


# ---- buckets -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketMeta:
    """Where each tensor of a packed bucket lives: ``(name, dtype name, shape, byte offset, byte length)``;
    ``lora`` is set when the bucket is a LoRA adapter (wire names of :mod:`roll.workers.lora`)."""

    entries: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    lora: LoraConfig | None = None

    @property
    def nbytes(self) -> int:
        return sum(e[4] for e in self.entries)


class TensorBucket:
    """A packed bucket that travels through Ray as a numpy buffer (stored out of band, read back without copy)."""

    def __init__(self, flat_N: torch.Tensor, meta: BucketMeta) -> None:
        self.flat_N = flat_N
        self.meta = meta

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_bucket, (self.flat_N.numpy(), self.meta))

    def tensors(self) -> dict[str, torch.Tensor]:
        return unpack_bucket(self.flat_N, self.meta)


def _rebuild_bucket(array: np.ndarray, meta: BucketMeta) -> TensorBucket:
    return TensorBucket(torch.from_numpy(array.copy() if not array.flags.writeable else array), meta)


def plan_buckets(named: Mapping[str, torch.Tensor], bucket_mb: float) -> list[list[str]]:
    """Names grouped in order into buckets of at most ``bucket_mb`` MiB; a larger tensor gets a bucket alone."""
    limit = max(1, int(bucket_mb * 2**20))
    buckets: list[list[str]] = [[]]
    used = 0
    for name, tensor in named.items():
        size = tensor.numel() * tensor.element_size()
        if buckets[-1] and used + size > limit:
            buckets.append([])
            used = 0
        buckets[-1].append(name)
        used += size
    return [b for b in buckets if b]


def pack_bucket(
    named: Mapping[str, torch.Tensor], device: torch.device | None = None, lora: LoraConfig | None = None
) -> TensorBucket:
    """Concatenate the tensors' bytes into one flat ``uint8`` tensor (any dtypes mixed); ``lora`` marks an
    adapter bucket."""
    entries, parts, offset = [], [], 0
    for name, tensor in named.items():
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        entries.append(
            (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, raw.numel())
        )
        parts.append(raw.to(device) if device is not None else raw)
        offset += raw.numel()
    flat_N = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    return TensorBucket(flat_N, BucketMeta(tuple(entries), lora))


def unpack_bucket(flat_N: torch.Tensor, meta: BucketMeta) -> dict[str, torch.Tensor]:
    """Views into ``flat_N`` with the original names, dtypes and shapes."""
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape, offset, length in meta.entries:
        out[name] = flat_N[offset : offset + length].view(getattr(torch, dtype)).reshape(shape)
    return out


def weights_checksum(named: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> str:
    """SHA-256 over names, dtypes, shapes and bytes in name order: equal iff the weights are bit-identical.

    ``dtype`` casts first, to compare an fp32 trainer with a bf16 inference copy.
    """
    digest = hashlib.sha256()
    for name in sorted(named):
        t = named[name].detach().cpu()
        t = t.to(dtype) if dtype is not None else t
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def update_payload(
    train_strategy: TrainStrategy, all_ranks: bool = False
) -> tuple[dict[str, torch.Tensor], LoraConfig | None]:
    """What a model update sends: the LoRA adapter alone (and its config) when the strategy trains one
    (``lora_config`` is not None), else the full weights and ``None``.

    Collective over the trainer's ranks (every rank must call it); the tensors are on rank 0, ``{}`` elsewhere,
    unless ``all_ranks`` (every rank gets them).
    """
    lora = train_strategy.lora_config
    if lora is not None:
        return train_strategy.lora_state_dict(all_ranks=all_ranks), lora
    return train_strategy.state_dict(all_ranks=all_ranks), None


def plan_update(
    named: Mapping[str, torch.Tensor], bucket_mb: float, lora: LoraConfig | None
) -> list[list[str]]:
    """Buckets of an update: an adapter always travels whole, as one bucket (it is small, and vLLM loads an
    adapter from one folder); full weights in buckets of at most ``bucket_mb`` MiB."""
    if lora is not None:
        return [list(named)] if named else []
    return plan_buckets(named, bucket_mb)


def load_payload(
    infer_strategy: InferStrategy,
    named: Mapping[str, torch.Tensor],
    lora: LoraConfig | None,
    policy_version: int,
) -> None:
    """Apply one bucket to an inference strategy: ``load_adapter`` for an adapter, ``load_weights`` otherwise."""
    if lora is None:
        infer_strategy.load_weights(named, policy_version)
    else:
        infer_strategy.load_adapter(named, lora, policy_version)


def sync_in_process(
    train_strategy: TrainStrategy,
    infer_strategy: InferStrategy,
    policy_version: int,
    bucket_mb: float = 256.0,
    all_ranks: bool = False,
) -> int:
    """Load the trainer's weights (its adapter alone, under LoRA) into an infer strategy of the same process,
    bucket by bucket: the tensors are handed over as they are, no copy through a buffer or the object store.

    For one actor holding both strategies (time-sharing a device; a ``HybridActorWorker``). Collective over the
    trainer's ranks; with several ranks pass ``all_ranks`` so that each rank's infer strategy gets the full
    weights. Returns the number of buckets.
    """
    named, lora = update_payload(train_strategy, all_ranks)
    plan = plan_update(named, bucket_mb, lora)
    for names in plan:
        load_payload(infer_strategy, {n: named[n] for n in names}, lora, policy_version)
    return len(plan)


# ---- the CUDA IPC transport -------------------------------------------------------------------------------------


IPCHandles = dict[str, list[tuple[str, Any]]]
"""CUDA IPC handles of named tensors, keyed by the UUID of the GPU that holds them: ``{uuid: [(name, handle)]}``
(the form ``VLLMInferStrategy.load_weights_from_ipc`` takes)."""


@runtime_checkable
class LoadsFromIPC(Protocol):
    """An inference strategy whose own processes open CUDA IPC handles (vLLM's workers), so no tensor passes
    through the role's actor."""

    def load_weights_from_ipc(
        self, handles: Mapping[str, list[tuple[str, Any]]], policy_version: int
    ) -> None: ...


def share_bucket(bucket: TensorBucket) -> tuple[IPCHandles, torch.Tensor]:
    """The bucket's bytes on this process's GPU (one allocation) and a CUDA IPC handle per tensor in it. Keep the
    returned flat tensor alive until every receiver has loaded the bucket (receivers map its memory)."""
    from torch.multiprocessing.reductions import reduce_tensor

    flat_N = bucket.flat_N if bucket.flat_N.is_cuda else bucket.flat_N.cuda()
    views = unpack_bucket(flat_N, bucket.meta)
    handles = [(name, reduce_tensor(t)) for name, t in views.items()]  # type: ignore[no-untyped-call]
    return {_gpu_uuid(flat_N.device): handles}, flat_N


def open_tensors(handles: Mapping[str, list[tuple[str, Any]]], where: str) -> dict[str, torch.Tensor]:
    """The tensors a process on this GPU shared with :func:`share_bucket` (matched by GPU UUID)."""
    device = torch.device("cuda", torch.cuda.current_device())
    uuid = _gpu_uuid(device)
    if uuid not in handles:
        raise WorkerError(
            f"{where}: no trainer rank shares this GPU ({uuid}); CUDA IPC needs colocated roles (one "
            f"device_group) on the same GPUs. GPUs offered: {sorted(handles)}"
        )
    out = {}
    for name, (func, args) in handles[uuid]:
        args = list(args)
        args[6] = (
            device.index
        )  # the sender's device index may differ (each process has its own visible devices)
        out[name] = func(*args)
    return out


def _gpu_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


# ---- the collective transport ------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual race is acceptable: the store fails loudly on a clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class CollectiveGroup:
    """A process group of its own: a ``TCPStore`` plus a gloo/NCCL backend built directly from it.

    Rank 0 hosts the store at ``(addr, port)``. Works next to (and independently of) the default group a role
    may have joined. ``store`` also carries small metadata (bucket plans) as pickles, which keeps the data path
    a plain tensor broadcast.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 300.0,
    ) -> None:
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            addr, port, world_size, rank == 0, timeout=timeout
        )
        if backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.pg: Any = dist.ProcessGroupNCCL(self.store, rank, world_size)  # type: ignore[call-arg]
        else:
            self.device = torch.device("cpu")
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        self._rounds: dict[str, int] = {}

    def next_round(self, channel: str) -> int:
        """This rank's next sequence number on ``channel`` (0, 1, ...): ranks that take part in every round of a
        channel agree on it without talking, so store keys that carry it are never reused."""
        seq = self._rounds.get(channel, 0)
        self._rounds[channel] = seq + 1
        return seq

    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """In-place broadcast of ``tensor`` (on :attr:`device`) from rank ``src``; returns it."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()
        return tensor

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, pickle.dumps(value))  # type: ignore[arg-type]  # bytes work; the stub says str

    def delete(self, key: str) -> None:
        """Remove ``key`` from the store (absent keys are fine)."""
        self.store.delete_key(key)

    def get(self, key: str) -> Any:
        """The value ``put`` under ``key`` (blocks until some rank puts it, up to the store's timeout)."""
        return pickle.loads(self.store.get(key))  # written by our own ranks only


def send_weights(
    group: CollectiveGroup,
    named: Mapping[str, torch.Tensor],
    bucket_mb: float,
    policy_version: int,
    lora: LoraConfig | None = None,
) -> tuple[int, int]:
    """Rank 0 of ``group``: publish the bucket plan, then broadcast each bucket. Returns ``(buckets, bytes)``.

    ``lora``: ``named`` is an adapter (see :func:`update_payload`), sent as one bucket."""
    plan = plan_update(named, bucket_mb, lora)
    buckets = [pack_bucket({n: named[n] for n in names}, lora=lora) for names in plan]
    group.put(f"weights/{policy_version}", [b.meta for b in buckets])
    for bucket in buckets:
        group.broadcast(bucket.flat_N.to(group.device), src=0)
    return len(buckets), sum(b.meta.nbytes for b in buckets)


def receive_weights(group: CollectiveGroup, policy_version: int, infer_strategy: InferStrategy) -> int:
    """A receiving rank: read the plan of ``policy_version``, receive each bucket and load it into
    ``infer_strategy`` (:func:`load_payload`). Returns the bucket count."""
    metas: list[BucketMeta] = group.get(f"weights/{policy_version}")
    for meta in metas:
        flat_N = torch.empty(meta.nbytes, dtype=torch.uint8, device=group.device)
        group.broadcast(flat_N, src=0)
        load_payload(infer_strategy, unpack_bucket(flat_N, meta), meta.lora, policy_version)
    return len(metas)


# ---- the driver-side orchestrator --------------------------------------------------------------------------------
