"""The base class of every role's Ray actor.

A role subclasses :class:`Worker`, takes a :class:`WorkerContext` as the first argument of ``__init__`` (and passes
it to ``super().__init__``), and marks the methods the driver may call with
:func:`~roll.core.cluster.dispatch.register`. The :class:`~roll.core.cluster.cluster.Cluster` builds the actors,
hands each its context, and then fills in the ``torch.distributed`` rendezvous: rank 0 picks its own IP and a free
port, and every rank gets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` in its environment. That happens after ``__init__`` returns (all actors start in parallel, and
rank 0's address is only known once it runs), so call :meth:`Worker.init_process_group` from a registered method,
typically the cluster-wide ``cluster.init_process_group()``, not from ``__init__``.

This module imports no torch; :meth:`Worker.init_process_group` imports it when called.

A role whose module imports torch (every model role) can still be run from a driver that never imports it: name
the class with a :class:`WorkerRef` instead of importing it, and the Cluster starts :class:`DeferredWorker` actors
that import the module in their own process, build the worker there and forward every call to it (the driver
learns the registered methods from the actor). :meth:`Worker.apply` runs a function in an actor's process, for work
that needs what the actor has imported and the driver has not.

A role composes its methods from parts it holds (``parts = {"sender": WeightSender}``, see
:mod:`roll.core.cluster.dispatch`); it subclasses :class:`Worker` directly and no role subclasses another. A Ray
actor has only its class's methods, so the Cluster calls a part's registered method through
:meth:`Worker.roll_call` (``actor.roll_call.remote(name, ...)``), which finds the part holding it; the class's own
methods it calls directly (``actor.name.remote(...)``), and a deferred worker's all through
:meth:`DeferredWorker.roll_call`, which hands them to the same lookup. Dispatch, timeouts and errors are those of
the method, wherever it lives.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import ray

from roll.core.cluster.dispatch import (
    Dispatch,
    MethodSpec,
    declared_parts,
    part_methods,
    register,
    registered_methods,
)

__all__ = ["DeferredWorker", "Worker", "WorkerContext", "WorkerInfo", "WorkerRef"]

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerContext:
    """Who an actor is within its role. Built by the Cluster; a Worker never invents it."""

    role: str
    rank: int
    world_size: int


@dataclass(frozen=True)
class WorkerInfo:
    """What :meth:`Worker.get_info` reports: identity, placement and the torch.distributed rendezvous."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    node_id: str
    node_ip: str
    pid: int
    master_addr: str | None
    master_port: int | None
    gpu_ids: tuple[str, ...]


class Worker:
    """Base class for the actors of one role. See the module docstring for the life cycle, and
    :mod:`roll.core.cluster.dispatch` for ``parts``."""

    parts: ClassVar[Mapping[str, type]] = {}
    """The objects this worker holds whose registered methods are its cluster methods too: attribute -> class."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registered_methods(cls)  # a bad parts declaration or a name clash fails where the class is defined

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._node_id = _node_id()
        self._node_ip = _node_ip()
        self._local_rank = 0
        self._master: tuple[str, int] | None = None
        os.environ["RANK"] = str(ctx.rank)
        os.environ["WORLD_SIZE"] = str(ctx.world_size)

    @property
    def role(self) -> str:
        return self._ctx.role

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def world_size(self) -> int:
        return self._ctx.world_size

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def node_ip(self) -> str:
        return self._node_ip

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        """Answer with this worker's rank; the cheapest proof that the actor is alive and not busy."""
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def get_info(self) -> WorkerInfo:
        """Identity, node and rendezvous of this worker."""
        master_addr, master_port = self._master if self._master else (None, None)
        return WorkerInfo(
            role=self.role,
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self._local_rank,
            node_id=self._node_id,
            node_ip=self._node_ip,
            pid=os.getpid(),
            master_addr=master_addr,
            master_port=master_port,
            gpu_ids=_gpu_ids(),
        )

    @register(Dispatch.RANK_ZERO)
    def apply(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` run in rank 0's process, its result sent back. For work that needs what the
        actor has imported (torch) and the driver has not: ``fn`` is pickled by reference, so it must live in a
        module the driver can import cheaply, and import its heavy dependencies in its body."""
        return fn(*args, **kwargs)

    @register(Dispatch.ONE_TO_ALL)
    def init_process_group(self, backend: str | None = None, timeout_s: float = 300.0) -> str:
        """Join this role's ``torch.distributed`` default group; returns the backend used.

        ``backend=None`` picks ``nccl`` when CUDA is available and ``gloo`` otherwise. Every rank must call it at
        the same time (the cluster-wide ONE_TO_ALL call does), and it needs the rendezvous the Cluster set up.
        """
        import torch.distributed as dist

        if self._master is None:
            raise RuntimeError(
                f"{self.role} rank {self.rank}: no torch.distributed rendezvous yet; create workers through "
                "a Cluster and call init_process_group after it is built, not from __init__"
            )
        if dist.is_initialized():
            return str(dist.get_backend())
        backend = backend or _default_backend()
        addr, port = self._master
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{_host_for_url(addr)}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return backend

    @register(Dispatch.ONE_TO_ALL)
    def destroy_process_group(self) -> None:
        """Leave the default process group if this worker joined one."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # The methods below are the Cluster's side channels (a part's method, the rendezvous); they are not
    # registered, so they are not exposed as cluster methods.

    def roll_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run registered method ``name``: this worker's own, or that of the part holding it (see the module
        docstring). The Cluster calls a part's methods, and every method of a deferred worker, through this."""
        return self.roll_method(name)(*args, **kwargs)

    def roll_method(self, name: str) -> Callable[..., Any]:
        """The bound method that runs registered method ``name`` (:meth:`roll_call` without the call)."""
        part = part_methods(type(self)).get(name)
        method: Callable[..., Any] = getattr(self if part is None else self._part(part), name)
        return method

    def _part(self, attr: str) -> object:
        held, cls = getattr(self, attr, None), declared_parts(type(self))[attr]
        if not isinstance(held, cls):
            raise TypeError(
                f"{self.role} rank {self.rank}: {type(self).__name__} declares part {attr!r} ({cls.__name__}) but "
                f"self.{attr} is {held!r}; set self.{attr} to a {cls.__name__} in __init__"
            )
        return held

    def roll_master_endpoint(self) -> tuple[str, int]:
        """Rank 0 only: this node's IP and a port that was free a moment ago, for MASTER_ADDR/MASTER_PORT."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return self._node_ip, port

    def roll_set_rendezvous(
        self, master_addr: str, master_port: int, local_rank: int, local_world_size: int
    ) -> None:
        """Record the rendezvous and export it in the environment variables torch.distributed reads."""
        self._master = (master_addr, master_port)
        self._local_rank = local_rank
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world_size),
        )


@dataclass(frozen=True)
class WorkerRef:
    """A :class:`Worker` subclass named by its module and class name, imported only where it runs (see the module
    docstring): ``WorkerRef("roll.workers.roles.actor", "ActorTrainWorker")``."""

    module: str
    name: str

    def load(self) -> type[Worker]:
        """Import the class; a name that is not a Worker subclass raises, naming it."""
        cls = getattr(importlib.import_module(self.module), self.name, None)
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{self} is not a Worker subclass (got {cls!r})")
        return cls

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"


class DeferredWorker:
    """The Ray actor of a Cluster built from a :class:`WorkerRef`: builds the named worker in this process and
    forwards to it. The Cluster calls registered methods through :meth:`roll_call`; the rendezvous side channel
    and :meth:`get_info` reach the worker as they would a plain actor."""

    def __init__(self, ctx: WorkerContext, ref: WorkerRef, *args: Any, **kwargs: Any) -> None:
        self._worker = ref.load()(ctx, *args, **kwargs)

    @classmethod
    def named(cls, ref: WorkerRef) -> type[DeferredWorker]:
        """A subclass named like the worker it builds, so that Ray's process titles and log prefixes say
        ``HybridActorWorker``, not ``DeferredWorker`` (Ray pickles it by value: nothing to import)."""
        return type(ref.name, (cls,), {"__qualname__": ref.name, "__doc__": f"{ref}, built in the actor"})

    def roll_methods(self) -> dict[str, MethodSpec]:
        """The worker's registered methods, for the driver that never imported its class."""
        return registered_methods(type(self._worker))

    def roll_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._worker.roll_method(name)(*args, **kwargs)  # one frame to the method, not two

    def ping(self) -> int:
        return self._worker.ping()

    def get_info(self) -> WorkerInfo:
        return self._worker.get_info()

    def roll_master_endpoint(self) -> tuple[str, int]:
        return self._worker.roll_master_endpoint()

    def roll_set_rendezvous(
        self, master_addr: str, master_port: int, local_rank: int, local_world_size: int
    ) -> None:
        self._worker.roll_set_rendezvous(master_addr, master_port, local_rank, local_world_size)


def _node_id() -> str:
    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


def _node_ip() -> str:
    if not ray.is_initialized():
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _gpu_ids() -> tuple[str, ...]:
    if not ray.is_initialized():
        return ()
    ids: dict[str, Any] = ray.get_runtime_context().get_accelerator_ids()
    return tuple(str(i) for i in ids.get("GPU", []))


def _default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _host_for_url(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
