"""Calls on one rank of a Cluster, and waiting on whichever of many calls finishes first.

A cluster call (``cluster.generate(batch)``) spreads one piece of work over every rank and waits for the slowest.
Request-level scheduling wants the opposite: small requests, each sent to *one* rank as soon as that rank is free.
:func:`submit_to_rank` sends a registered method to one rank with the method's timeout and the same error
translation as cluster calls (a failure names role, rank and method); :class:`CallPool` waits on many such calls
at once and hands back each as it finishes, with the caller's tag, so the caller can immediately send that rank
its next request.

Deadlines: every :class:`RankCall` carries its deadline (submit time + the method's timeout). The pool never waits
past the earliest one, and a call still running at its deadline raises its
:class:`~roll.core.errors.WorkerTimeoutError` from :meth:`CallPool.wait_any`: a hung rank is named within its
timeout instead of holding a step forever.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray

from roll.core.cluster import Cluster, PendingCall
from roll.core.cluster.calls import CallTarget
from roll.core.cluster.dispatch import RULES, CallPlan, Dispatch
from roll.core.errors import WorkerTimeoutError

__all__ = ["CallPool", "RankCall", "bounded_wait", "submit_to_rank"]

T = TypeVar("T", bound=Hashable)


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


def submit_to_rank(
    cluster: Cluster, rank: int, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
) -> RankCall:
    """Run registered ``method`` on rank ``rank`` only, with ``args`` as given (no split, no padding).

    The call's timeout is ``timeout_s`` when given, else the one the cluster would use (``@register(timeout_s)``,
    the role's, the cluster's).
    """
    cluster.ready()
    if not 0 <= rank < len(cluster.actors):
        raise IndexError(f"{cluster.role} has {len(cluster.actors)} live ranks; no rank {rank}")
    bound = cluster.methods.get(method)
    if bound is None:
        raise AttributeError(
            f"{cluster.role}: {method!r} is not a registered method; see {sorted(cluster.methods)}"
        )
    ref = cluster.remote_method(rank, method).remote(*args, **kwargs)
    plan = CallPlan((rank,), ((args, kwargs),))
    timeout = timeout_s if timeout_s is not None else bound.timeout_s
    target = CallTarget(cluster.role, method, timeout)
    deadline = time.monotonic() + timeout
    return RankCall(rank, ref, PendingCall(target, plan, RULES[Dispatch.RANK_ZERO], [ref]), deadline)


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
