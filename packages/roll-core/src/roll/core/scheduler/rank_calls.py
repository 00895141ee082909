"""Calls on one rank of a Cluster, and waiting on whichever of many calls finishes first.

A cluster call (``cluster.generate(batch)``) spreads one piece of work over every rank and waits for the slowest.
Request-level scheduling wants the opposite: small requests, each sent to *one* rank as soon as that rank is free.
:func:`submit_to_rank` sends a :class:`~roll.core.cluster.ClusterMethod` (taken from a typed handle, so the type
checker checks its arguments) to one rank with the method's timeout and the same error translation as cluster
calls (a failure names role, rank and method); :class:`CallPool` waits on many such calls at once and hands back
each as it finishes, with the caller's tag, so the caller can immediately send that rank its next request.

A scheduler sends many requests of one kind: rows, plus arguments fixed for the run (sampling parameters). The
driver binds those once, where it builds the scheduler, as a :class:`RankRequest`::

    infer = cast("ActorInferCluster", cluster)
    request = RankRequest.bind(infer.generate, params)   # mypy: params against generate's parameters
    GenerateScheduler(request, feed, options)            # sends request.submit(rank, prompts), rank by rank

``RankRequest[A]`` says what the rows must be (``A``: the method's first parameter), so a scheduler states what
it sends (``RankRequest[Batch]``) and the type checker holds the worker method to it.

Deadlines: every :class:`RankCall` carries its deadline (submit time + the method's timeout). The pool never waits
past the earliest one, and a call still running at its deadline raises its
:class:`~roll.core.errors.WorkerTimeoutError` from :meth:`CallPool.wait_any`: a hung rank is named within its
timeout instead of holding a step forever.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

import ray

from roll.core.cluster import Cluster, ClusterMethod, PendingCall
from roll.core.cluster.calls import CallTarget
from roll.core.cluster.dispatch import RULES, CallPlan, Dispatch
from roll.core.errors import WorkerTimeoutError

__all__ = ["CallPool", "RankCall", "RankRequest", "RowsMethod", "bounded_wait", "submit_to_rank"]

T = TypeVar("T", bound=Hashable)
P = ParamSpec("P")
A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)


@dataclass
class RankCall:
    """A call in flight on one rank: its Ray ref (to wait on) and the :class:`PendingCall` (to read it)."""

    rank: int
    ref: ray.ObjectRef[Any]
    pending: PendingCall[Any]
    deadline: float = float("inf")
    """``time.monotonic()`` by which the call must have answered (submit time + the method's timeout)."""

    def expired(self, now: float | None = None) -> bool:
        """Past the deadline (whether or not the call has answered: check that first)."""
        return (time.monotonic() if now is None else now) >= self.deadline


def submit_to_rank(method: ClusterMethod[P, Any], rank: int, *args: P.args, **kwargs: P.kwargs) -> RankCall:
    """Run ``method`` on rank ``rank`` of its cluster only, with ``args`` as given (no split, no padding).

    The call's timeout is the method's (``@register(timeout_s)``, the role's, the cluster's); pass
    ``method.with_timeout(s)`` for another.
    """
    cluster = method.cluster
    cluster.ready()
    if not 0 <= rank < len(cluster.actors):
        raise IndexError(f"{cluster.role} has {len(cluster.actors)} live ranks; no rank {rank}")
    ref = cluster.remote_method(rank, method.name).remote(*args, **kwargs)
    plan = CallPlan((rank,), ((args, kwargs),))
    target = CallTarget(cluster.role, method.name, method.timeout_s)
    deadline = time.monotonic() + method.timeout_s
    return RankCall(rank, ref, PendingCall(target, plan, RULES[Dispatch.RANK_ZERO], [ref]), deadline)


class RowsMethod(Protocol[A_contra, P]):
    """What :meth:`RankRequest.bind` takes: a :class:`~roll.core.cluster.ClusterMethod` whose first parameter is
    the rows (``A_contra``) and the rest ``P``. Every ClusterMethod is one; the Protocol is how the type checker
    reads the rows' type out of the method's parameters (it cannot from ``ClusterMethod[Concatenate[A, P], R]``)."""

    @property
    def cluster(self) -> Cluster: ...

    def submit(self, rows: A_contra, /, *args: P.args, **kwargs: P.kwargs) -> PendingCall[Any]: ...


class RankRequest(Generic[A_contra]):
    """A cluster method with every argument but its first (the rows, of type ``A_contra``) bound; a scheduler
    sends it rows one rank at a time (:meth:`submit`). Build it with :meth:`bind` (see the module docstring)."""

    def __init__(
        self, method: ClusterMethod[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        self.method = method
        self.args = args
        self.kwargs = dict(kwargs)

    @staticmethod
    def bind(method: RowsMethod[A, P], /, *args: P.args, **kwargs: P.kwargs) -> RankRequest[A]:
        """``method`` (a :class:`~roll.core.cluster.ClusterMethod` from a typed handle) with ``args``/``kwargs``
        after its first parameter, checked by the type checker against the worker method's parameters:
        ``RankRequest.bind(infer.generate, params)``. A timeout other than the method's: bind
        ``method.with_timeout(s)``."""
        if not isinstance(method, ClusterMethod):
            raise TypeError(
                f"RankRequest.bind needs a cluster method (cluster.<name>, from a typed handle), got {method!r}"
            )
        return RankRequest(method, args, kwargs)

    @property
    def cluster(self) -> Cluster:
        """The cluster whose ranks serve the requests (its world size, its roles, :meth:`Cluster.restart_rank`)."""
        return self.method.cluster

    @property
    def name(self) -> str:
        """The method's name (for messages)."""
        return self.method.name

    def submit(self, rank: int, rows: A_contra) -> RankCall:
        """Send ``rows`` (with the bound arguments) to rank ``rank`` only; see :func:`submit_to_rank`."""
        return submit_to_rank(self.method, rank, rows, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        bound = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"<RankRequest {self.cluster.role}.{self.name}(rows, {', '.join(bound)})>"


class CallPool(Generic[T]):
    """Calls in flight, each under a caller-chosen key; :meth:`wait_any` returns finished ones as they come."""

    def __init__(self) -> None:
        self._calls: dict[ray.ObjectRef[Any], tuple[T, RankCall]] = {}

    def add(self, key: T, call: RankCall) -> None:
        self._calls[call.ref] = (key, call)

    def __len__(self) -> int:
        return len(self._calls)

    def keys(self) -> list[T]:
        return [key for key, _ in self._calls.values()]

    def refs(self) -> list[ray.ObjectRef[Any]]:
        return list(self._calls)

    def ranks(self) -> list[int]:
        """The rank of every call in flight (a rank appears once per call)."""
        return [call.rank for _, call in self._calls.values()]

    def earliest_deadline(self) -> float:
        """The first deadline of the calls in flight (``inf`` when none)."""
        return min((call.deadline for _, call in self._calls.values()), default=float("inf"))

    def wait_any(self, timeout_s: float | None = None) -> list[tuple[T, RankCall, Any]]:
        """Block until at least one call finishes (or ``timeout_s`` passes: then ``[]``); return all finished.

        Each entry is ``(key, call, result)``. A failed call raises its :class:`~roll.core.errors.WorkerError`,
        a call past its deadline its :class:`~roll.core.errors.WorkerTimeoutError` (the other calls stay in the
        pool). Never waits past the earliest deadline.
        """
        if not self._calls:
            return []
        refs = list(self._calls)
        ready, _ = ray.wait(refs, num_returns=1, timeout=bounded_wait(timeout_s, self.earliest_deadline()))
        if ready:  # collect every other call that is also done, so one wake-up serves them all
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        now, answered = time.monotonic(), set(ready)
        for ref, (_, call) in list(self._calls.items()):
            if ref not in answered and call.expired(now):  # raises the timeout naming role, rank and method
                del self._calls[ref]
                call.pending.result()
        done = []
        for ref in ready:
            key, call = self._calls.pop(ref)
            done.append((key, call, call.pending.result()))
        return done

    def drain(self, timeout_s: float) -> list[tuple[T, RankCall, Any]]:
        """Wait for every call in the pool (at most ``timeout_s`` in all); return them all."""
        deadline = time.monotonic() + timeout_s
        done: list[tuple[T, RankCall, Any]] = []
        while self._calls:
            left = deadline - time.monotonic()
            if left <= 0:
                keys = self.keys()
                raise WorkerTimeoutError(f"{len(keys)} calls still running after {timeout_s:g}s: {keys[:5]}")
            done += self.wait_any(left)
        return done


def bounded_wait(timeout_s: float | None, deadline: float) -> float | None:
    """How long to wait: ``timeout_s`` (None: no limit), but never past ``deadline`` (a ``time.monotonic()``)."""
    if deadline == float("inf"):
        return timeout_s
    left = max(deadline - time.monotonic(), 0.0)
    return left if timeout_s is None else min(timeout_s, left)
