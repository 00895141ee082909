"""roll's Ray runtime: start/attach Ray, place roles on bundles, run a role as a Cluster of Worker actors.

- :mod:`.runtime`: :func:`init_ray` / :func:`shutdown_ray`.
- :mod:`.resources`: :class:`ResourceManager` (demand per device group, checked before anything waits).
- :mod:`.worker`: :class:`Worker`, the base class of a role's actors, and torch.distributed rendezvous.
- :mod:`.dispatch`: :func:`register` and the :class:`Dispatch` modes.
- :mod:`.cluster`: :class:`Cluster`, registered worker methods callable on the whole group.
- :mod:`.calls`: :class:`PendingCall` and the translation of Ray failures into :class:`WorkerError`.
"""

from roll.core.cluster.calls import PendingCall
from roll.core.cluster.cluster import Cluster, ClusterMethod
from roll.core.cluster.dispatch import Dispatch, Mesh, register
from roll.core.cluster.resources import ResourceManager, RolePlacement
from roll.core.cluster.runtime import RayHandle, init_ray, shutdown_ray
from roll.core.cluster.worker import Worker, WorkerContext, WorkerInfo, WorkerRef

__all__ = [
    "Cluster",
    "ClusterMethod",
    "Dispatch",
    "Mesh",
    "PendingCall",
    "RayHandle",
    "ResourceManager",
    "RolePlacement",
    "Worker",
    "WorkerContext",
    "WorkerInfo",
    "WorkerRef",
    "init_ray",
    "register",
    "shutdown_ray",
]
