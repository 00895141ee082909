"""A Cluster: N Ray actors of one role, whose registered methods are called like plain methods.

::

    class Actor(Worker):
        @register(Dispatch.DP_SPLIT)
        def compute_logp(self, batch: Batch) -> Batch: ...

    with Cluster("actor_train", Actor, role_cfg, resources=rm, call_timeout_s=cfg.ray.call_timeout_s) as actors:
        logp = actors.compute_logp(batch)              # blocks; DP-split over ranks, concatenated back
        pending = actors.compute_logp.submit(batch)     # returns a PendingCall at once
        logp = pending.result()                         # ... or `await pending` inside asyncio

Every method of the worker class marked with :func:`~roll.core.cluster.dispatch.register`, its own or one of its
parts' (``parts = {"sender": WeightSender}``, see :mod:`~roll.core.cluster.dispatch`), is found when the
Cluster is built (by inspecting the class, no names to bind) and is reachable as ``cluster.<name>``, a
:class:`ClusterMethod`; ``cluster.method(Actor.compute_logp)`` gives the same object from a function reference
(``cluster.method(WeightSender.stage_weights)`` for a part's). A part's method is called on each actor through
:meth:`~roll.core.cluster.worker.Worker.roll_call`, with the same dispatch, timeout and errors as the class's own.
A name that is not registered raises ``AttributeError`` listing the ones that are.

Timeouts: a call's timeout is the method's own (``@register(timeout_s=...)``), else the role's
``RoleConfig.call_timeout_s``, else the Cluster's ``call_timeout_s`` (pass ``RayConfig.call_timeout_s``);
``cluster.m.with_timeout(s)`` overrides it for one call site. Building the Cluster waits for every actor's
``__init__`` at most ``start_timeout_s`` (default: the role's call timeout).

Model parallelism: ``mesh=Mesh(world_size, tp=2)`` tells ``MP_SPLIT`` methods how the ranks form TP/PP/DP groups
(default: :meth:`Mesh.for_role`, from the role's strategy config; every rank its own DP rank unless the strategy
is model-parallel). Each DP shard goes into the object store once, however many TP/PP ranks
read it.

Starting many clusters at once: with ``wait=False`` the constructor only launches the actors and returns; the
wait for their ``__init__`` and the rendezvous happen on the first call (or :meth:`ready`, or ``infos``), with
the same errors. A worker's ``__init__`` usually imports torch and a model library (10-18 s on a small CPU box),
so a pipeline that launches all its roles before waiting on any pays that once, not once per role
(``RunHost.make_cluster`` does).

A driver that must not import torch names the worker class with a :class:`~roll.core.cluster.worker.WorkerRef`
(its module is imported in the actors only, see :class:`~roll.core.cluster.worker.DeferredWorker`): the methods of
the base :class:`Worker` are known at once, the role's own ones when the first of them is looked up (which waits
for rank 0 to be up and asks it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import ray

from roll.core.cluster.calls import CallTarget, PendingCall
from roll.core.cluster.dispatch import (
    RULES,
    CallPlan,
    Dispatch,
    Mesh,
    MethodSpec,
    OnAllRanks,
    OnRankZero,
    OnShards,
    Shardable,
    get_spec,
    part_methods,
    registered_methods,
)
from roll.core.cluster.resources import ResourceManager, RolePlacement
from roll.core.cluster.worker import DeferredWorker, Worker, WorkerContext, WorkerInfo, WorkerRef
from roll.core.config.sections import RoleConfig

__all__ = ["Cluster", "ClusterMethod", "on_cluster", "registered_methods"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
S = TypeVar("S", bound=Shardable)
T = TypeVar("T")


class ClusterMethod(Generic[P, R_co]):
    """One registered worker method, bound to a Cluster: called with the method's parameters ``P``, it returns the
    collected ``R_co``. Calling it blocks; :meth:`submit` does not."""

    def __init__(self, cluster: Cluster, name: str, spec: MethodSpec, timeout_s: float) -> None:
        self._cluster = cluster
        self.name = name
        self.spec = spec
        self.timeout_s = timeout_s

    @property
    def cluster(self) -> Cluster:
        """The cluster whose ranks run this method (a scheduler sends requests to them one rank at a time)."""
        return self._cluster

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Run on the ranks the dispatch mode picks and return the collected result."""
        return self.submit(*args, **kwargs).result()

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> PendingCall[R_co]:
        """Start the call and return at once; the deadline starts now."""
        return self._cluster._submit(self, args, kwargs)

    def with_timeout(self, timeout_s: float) -> ClusterMethod[P, R_co]:
        """The same method with another timeout, e.g. ``cluster.generate.with_timeout(3600)(batch)``."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        return ClusterMethod(self._cluster, self.name, self.spec, timeout_s)

    def __repr__(self) -> str:
        return f"<ClusterMethod {self._cluster.role}.{self.name} {self.spec.mode.name} timeout={self.timeout_s:g}s>"


AnyMethod = ClusterMethod[..., Any]
"""A cluster method whose signature the type checker does not know (found by name at run time)."""


@overload
def on_cluster(fn: OnAllRanks[Any, P, R]) -> ClusterMethod[P, list[R]]: ...
@overload
def on_cluster(fn: OnRankZero[Any, P, R]) -> ClusterMethod[P, R]: ...
@overload
def on_cluster(fn: OnShards[Any, P, S]) -> ClusterMethod[P, S]: ...
@overload
def on_cluster(fn: OnShards[Any, P, list[T]]) -> ClusterMethod[P, list[T]]: ...
@overload
def on_cluster(fn: OnShards[Any, P, R]) -> ClusterMethod[P, list[R]]: ...
def on_cluster(fn: Any) -> Any:
    """Declare a typed cluster handle's member from the worker method it calls::

        class ActorCluster(Cluster):
            train_step = on_cluster(ActorTrainWorker.train_step)

    The type checker reads the member as a :class:`ClusterMethod` with the worker method's parameters and the
    result of its dispatch mode (``ONE_TO_ALL``: ``list[R]``; ``RANK_ZERO``: ``R``; ``DP_SPLIT`` / ``MP_SPLIT``: a
    Shardable or list ``R`` joined, anything else ``list[R]``). A handle is a type, never built: a driver casts the
    :class:`Cluster` it made to it (``cast("ActorCluster", cluster)``), and the cluster answers by name as before.
    At run time this returns ``fn``, so a test can check a handle against its worker class."""
    if get_spec(fn) is None:
        raise TypeError(f"on_cluster({fn!r}): not a method marked with @register")
    return fn


class Cluster:
    """N Ray actors of ``worker_cls`` for ``role``, placed on the role's bundles. See the module docstring.

    ``resources`` is a :class:`ResourceManager` managing this role, a :class:`RolePlacement`, or None (the Cluster
    then reserves bundles for this role alone and frees them in :meth:`shutdown`). Each actor is built as
    ``worker_cls(WorkerContext(role, rank, num_workers), *init_args, **init_kwargs)``.
    """

    if TYPE_CHECKING:  # the registered methods every Worker has, typed; a role's own come with its handle
        ping = on_cluster(Worker.ping)
        get_info = on_cluster(Worker.get_info)
        apply = on_cluster(Worker.apply)
        init_process_group = on_cluster(Worker.init_process_group)
        destroy_process_group = on_cluster(Worker.destroy_process_group)

    def __init__(
        self,
        role: str,
        worker_cls: type[Worker] | WorkerRef,
        role_cfg: RoleConfig,
        resources: ResourceManager | RolePlacement | None = None,
        *,
        init_args: tuple[Any, ...] = (),
        init_kwargs: Mapping[str, Any] | None = None,
        call_timeout_s: float = 600.0,
        start_timeout_s: float | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        mesh: Mesh | None = None,
        wait: bool = True,
    ) -> None:
        deferred = isinstance(worker_cls, WorkerRef)
        if not deferred and not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(
                f"Cluster({role!r}, ...) needs a Worker subclass or a WorkerRef, got {worker_cls!r}"
            )
        self._ref = worker_cls if isinstance(worker_cls, WorkerRef) else None
        self._forwarded = frozenset(() if isinstance(worker_cls, WorkerRef) else part_methods(worker_cls))
        self.role = role
        self.role_cfg = role_cfg
        self.world_size = role_cfg.num_workers
        self.mesh = mesh or Mesh.for_role(role_cfg)
        if self.mesh.world_size != self.world_size:
            raise ValueError(
                f"Cluster({role!r}): mesh of {self.mesh.world_size} ranks for {role}.num_workers = {self.world_size}"
            )
        self._default_timeout = role_cfg.call_timeout_s or call_timeout_s
        known = registered_methods(Worker if isinstance(worker_cls, WorkerRef) else worker_cls)
        self._methods = {name: self._bind(name, spec) for name, spec in known.items()}
        self._owned_rm: ResourceManager | None = None
        self._placement = self._resolve_placement(resources)
        self.actors: list[Any] = []
        self._infos: list[WorkerInfo] | None = None
        self._joining = False  # the rendezvous is running (its own calls must not wait for it)
        self._start_timeout_s = start_timeout_s or self._default_timeout
        try:
            self._start(worker_cls, init_args, dict(init_kwargs or {}), runtime_env)
        except BaseException:
            self.shutdown()
            raise
        if wait:
            self.ready()

    @property
    def infos(self) -> list[WorkerInfo]:
        """Every rank's :class:`WorkerInfo` (waits for the actors, see :meth:`ready`)."""
        return self.ready()

    def ready(self) -> list[WorkerInfo]:
        """Wait (once) for every actor's ``__init__`` and give the ranks their rendezvous; the infos. A failed
        start shuts the cluster down and raises the worker's error."""
        if self._infos is None:
            self._joining = True
            try:
                self._infos = self._rendezvous(self._start_timeout_s)
            except BaseException:
                self.shutdown()
                raise
            finally:
                self._joining = False
        return self._infos

    @property
    def methods(self) -> Mapping[str, AnyMethod]:
        """Every registered method of the worker class, by name."""
        self._learn_methods()
        return dict(self._methods)

    @overload
    def method(self, fn: OnAllRanks[Any, P, R]) -> ClusterMethod[P, list[R]]: ...
    @overload
    def method(self, fn: OnRankZero[Any, P, R]) -> ClusterMethod[P, R]: ...
    @overload
    def method(self, fn: OnShards[Any, P, S]) -> ClusterMethod[P, S]: ...
    @overload
    def method(self, fn: OnShards[Any, P, list[T]]) -> ClusterMethod[P, list[T]]: ...
    @overload
    def method(self, fn: OnShards[Any, P, R]) -> ClusterMethod[P, list[R]]: ...
    def method(self, fn: object) -> AnyMethod:
        """The cluster method for a function reference: ``cluster.method(MyWorker.train_step)``, typed like
        :func:`on_cluster` (its arguments checked against the worker method's, its result by dispatch mode)."""
        name = getattr(fn, "__name__", "")
        self._learn_methods()
        if get_spec(fn) is None or name not in self._methods:
            raise AttributeError(f"{fn!r} is not a registered method of {self.role}'s worker class")
        return self._methods[name]

    def remote_method(self, rank: int, name: str) -> Any:
        """Rank ``rank``'s Ray method ``name`` (``.remote(...)`` it); through ``roll_call`` for a method of one of
        the worker's parts and for every method of a deferred worker."""
        actor = self.actors[rank]
        if self._ref is None and name not in self._forwarded:
            return getattr(actor, name)
        return _Forwarded(actor, name)

    def _learn_methods(self) -> None:
        """A :class:`WorkerRef` cluster: ask rank 0 for its worker's registered methods, once."""
        if self.__dict__.get("_ref") is None or self.__dict__.get("_learned"):
            return
        self.ready()
        specs: dict[str, MethodSpec] = self._call_one(0, "roll_methods", (), self._start_timeout_s)
        self._methods.update({name: self._bind(name, spec) for name, spec in specs.items()})
        self._learned = True

    if not TYPE_CHECKING:  # hidden from the type checker: a driver calls through a typed handle (on_cluster)

        def __getattr__(self, name: str) -> AnyMethod:
            methods: dict[str, AnyMethod] | None = self.__dict__.get("_methods")
            if methods is not None and name not in methods and not name.startswith("__"):
                self._learn_methods()
            if methods is not None and name in methods:
                return methods[name]
            known = ", ".join(sorted(methods or {}))
            raise AttributeError(
                f"cluster {self.__dict__.get('role', '?')!r} has no registered method {name!r}; registered: "
                f"{known}. Mark worker methods with @register(Dispatch...) to call them on the cluster"
            )

    def restart_rank(self, rank: int, timeout_s: float | None = None) -> None:
        """Replace rank ``rank``'s actor (dead or alive) with a fresh one built the same way, waiting for it at
        most ``timeout_s`` (default: the cluster's ``start_timeout_s``).

        For roles whose ranks never join a collective together (reward workers, environments): the new actor gets
        the rendezvous the old one had, but no process group is rebuilt. A role that trains in a process group
        recovers by rebuilding the whole cluster instead (:class:`~roll.core.run.Run` does, from a checkpoint).
        """
        if not 0 <= rank < len(self.actors):
            raise IndexError(f"{self.role} has {len(self.actors)} ranks; no rank {rank}")
        old = self.infos[rank]
        with contextlib.suppress(Exception):  # already dead: nothing to kill
            ray.kill(self.actors[rank], no_restart=True)
        options = {**self._placement.actor_options(rank), **self._extra_options}
        ctx = WorkerContext(self.role, rank, self.world_size)
        self.actors[rank] = self._remote_cls.options(**options).remote(
            ctx, *self._init_args, **self._init_kwargs
        )
        timeout = (
            timeout_s or self._start_timeout_s
        )  # a fresh actor's start, not a call: same budget as at first
        if old.master_addr is not None and old.master_port is not None:
            args = (old.master_addr, old.master_port, old.local_rank, _local_world(self.infos, old.node_id))
            self._call_one(rank, "roll_set_rendezvous", args, timeout)
        self.infos[rank] = self._call_one(rank, "get_info", (), timeout)

    def shutdown(self) -> None:
        """Kill every actor and free bundles this Cluster reserved itself. Safe to call twice."""
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already dead, or Ray is gone: nothing left to kill
                ray.kill(actor, no_restart=True)
        self.actors = []
        if self._owned_rm is not None:
            self._owned_rm.release()
            self._owned_rm = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<Cluster {self.role} x{self.world_size} methods={sorted(self._methods)}>"

    def _bind(self, name: str, spec: MethodSpec) -> AnyMethod:
        return ClusterMethod(self, name, spec, spec.timeout_s or self._default_timeout)

    def _resolve_placement(self, resources: ResourceManager | RolePlacement | None) -> RolePlacement:
        if isinstance(resources, RolePlacement):
            return resources
        if resources is None:
            self._owned_rm = resources = ResourceManager({self.role: self.role_cfg})
        return resources.placement(self.role)

    def _start(
        self,
        worker_cls: type[Worker] | WorkerRef,
        init_args: tuple[Any, ...],
        init_kwargs: dict[str, Any],
        runtime_env: Mapping[str, Any] | None,
    ) -> None:
        if isinstance(worker_cls, WorkerRef):
            init_args = (worker_cls, *init_args)
        self._remote_cls = remote_cls = ray.remote(
            DeferredWorker.named(worker_cls) if isinstance(worker_cls, WorkerRef) else worker_cls
        )
        self._extra_options = extra = {"runtime_env": dict(runtime_env)} if runtime_env else {}
        self._init_args, self._init_kwargs = init_args, init_kwargs  # kept for restart_rank
        for rank in range(self.world_size):
            options = {**self._placement.actor_options(rank), **extra}
            ctx = WorkerContext(self.role, rank, self.world_size)
            self.actors.append(remote_cls.options(**options).remote(ctx, *init_args, **init_kwargs))

    def _rendezvous(self, timeout_s: float) -> list[WorkerInfo]:
        """Wait for every actor, then give all ranks rank 0's address and their local rank on their node."""
        infos: list[WorkerInfo] = self.get_info.with_timeout(timeout_s)()
        addr, port = self._call_one(0, "roll_master_endpoint", (), timeout_s)
        by_node: dict[str, list[int]] = {}
        for info in infos:
            by_node.setdefault(info.node_id, []).append(info.rank)
        refs = []
        for info in infos:
            peers = by_node[info.node_id]
            args = (addr, port, peers.index(info.rank), len(peers))
            refs.append(self.actors[info.rank].roll_set_rendezvous.remote(*args))
        self._wait(refs, "roll_set_rendezvous", timeout_s)
        result: list[WorkerInfo] = self.get_info.with_timeout(timeout_s)()
        return result

    def _call_one(self, rank: int, name: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        ref = getattr(self.actors[rank], name).remote(*args)
        return self._wait([ref], name, timeout_s, ranks=(rank,))[0]

    def _wait(
        self,
        refs: list[ray.ObjectRef[Any]],
        name: str,
        timeout_s: float,
        ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        """Block on internal calls with the same timeout and error translation as user calls."""
        plan_ranks = ranks if ranks is not None else tuple(range(len(refs)))
        plan = CallPlan(plan_ranks, tuple(((), {}) for _ in refs))
        pending: PendingCall[list[Any]] = PendingCall(
            CallTarget(self.role, name, timeout_s), plan, RULES[Dispatch.ONE_TO_ALL], refs
        )
        result: list[Any] = pending.result()
        return result

    def _submit(
        self, method: ClusterMethod[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> PendingCall[R]:
        if not self.actors:
            raise RuntimeError(f"cluster {self.role!r} is shut down; cannot call {method.name}")
        if not self._joining:
            self.ready()
        rule = RULES[method.spec.mode]
        plan = rule.split(args, kwargs, self.mesh)
        if method.spec.mode is Dispatch.ONE_TO_ALL and len(plan.ranks) > 1:
            plan = _share_arguments(plan)
        elif method.spec.mode is Dispatch.MP_SPLIT and self.mesh.dp < self.world_size:
            plan = _share_shards(plan)
        refs = [
            self.remote_method(rank, method.name).remote(*a, **kw)
            for rank, (a, kw) in zip(plan.ranks, plan.args)
        ]
        return PendingCall(CallTarget(self.role, method.name, method.timeout_s), plan, rule, refs)


class _Forwarded:
    """``actor.roll_call.remote(name, ...)`` spelled ``_Forwarded(actor, name).remote(...)``."""

    def __init__(self, actor: Any, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._actor.roll_call.remote(self._name, *args, **kwargs)


def _local_world(infos: list[WorkerInfo], node_id: str) -> int:
    return sum(1 for info in infos if info.node_id == node_id)


def _share_arguments(plan: CallPlan) -> CallPlan:
    """Put each argument into the object store once; Ray resolves top-level refs, so ranks share one copy."""
    args, kwargs = plan.args[0]
    shared = (tuple(_put(a) for a in args), {k: _put(v) for k, v in kwargs.items()})
    return CallPlan(plan.ranks, tuple(shared for _ in plan.ranks), plan.pad, plan.padded_len)


def _share_shards(plan: CallPlan) -> CallPlan:
    """Put each distinct shard (the first argument; TP/PP peers hold the same object) into the object store once."""
    refs: dict[int, Any] = {}
    args = []
    for a, kw in plan.args:
        shard = a[0]
        ref = refs.setdefault(id(shard), _put(shard))
        args.append(((ref, *a[1:]), kw))
    return CallPlan(plan.ranks, tuple(args), plan.pad, plan.padded_len, plan.collect_from)


def _put(value: Any) -> Any:
    # A ref the caller passed stays as it is: wrapping it would hand the worker a ref instead of the value.
    return value if isinstance(value, ray.ObjectRef) else ray.put(value)
