"""``EnvWorker``: a Ray actor running many envs, and :class:`ClusterEnvPool`, the manager's view of a Cluster
of them.

Slot ``s`` of the pool lives on rank ``s // slots_per_worker``. Both registered methods are ``DP_SPLIT`` over a
list with one entry per slot (None for idle slots), so the dispatcher's equal split hands every rank exactly its
own slots; the pool's size is a multiple of the worker count, so no padding ever shifts a slot to another rank.

Deadlines at two levels: inside a worker every env call of a batch shares ``timeout_s`` (:mod:`.slots`: a hung
env is cut off, its episode ends as a timeout); around it, :class:`ClusterEnvPool` sends each rank its slots
itself with a deadline of ``timeout_s`` plus a margin, so a worker that does not answer at all (an env that holds
the GIL in C code, or kills its process) is restarted (:meth:`Cluster.restart_rank`) and every env it held ends
as a timeout (or error) with the reason, instead of the whole step failing or waiting out the role's call
timeout. Before each rollout's reset, a worker still running cut-off env threads is restarted too (they cannot be
stopped otherwise, and a spinning one steals a core from every later step).

The actor imports no torch (envs are plain Python), so it starts in a second or two.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from roll.agentic.env_manager.config import EnvEntryConfig
from roll.agentic.env_manager.slots import (
    EnvFactory,
    EnvSlots,
    ResetOutcome,
    ResetRequest,
    StepOutcome,
    StepRequest,
    factory_for,
)
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.cluster.cluster import ClusterMethod, on_cluster
from roll.core.errors import WorkerError
from roll.core.scheduler.rank_calls import submit_to_rank

__all__ = ["ClusterEnvPool", "EnvWorker"]

log = logging.getLogger(__name__)

CALL_MARGIN_S = 30.0
"""Beyond the in-worker ``timeout_s``: how long a worker may take to answer a batch (queueing, pickling) before
it counts as frozen."""

Outcome = TypeVar("Outcome", ResetOutcome, StepOutcome)
Request = TypeVar("Request", ResetRequest, StepRequest)


class EnvWorker(Worker):
    """``slots`` env slots of the env mix ``envs``; each reset/step batch shares a ``timeout_s`` deadline.

    ``factory`` replaces the entry-point factory (tests pass envs that are not installed plugins).
    """

    def __init__(
        self,
        ctx: WorkerContext,
        envs: Sequence[EnvEntryConfig],
        slots: int,
        timeout_s: float,
        factory: EnvFactory | None = None,
    ) -> None:
        super().__init__(ctx)
        self.slots = EnvSlots(slots, factory or factory_for(envs), timeout_s)

    @register(Dispatch.DP_SPLIT)
    def reset(self, requests: list[ResetRequest | None]) -> list[ResetOutcome | None]:
        return self.slots.reset(requests)

    @register(Dispatch.DP_SPLIT)
    def step(self, requests: list[StepRequest | None]) -> list[StepOutcome | None]:
        return self.slots.step(requests)

    @register(Dispatch.ONE_TO_ALL)
    def close(self) -> None:
        self.slots.close()

    @register(Dispatch.ONE_TO_ALL)
    def leaked(self) -> int:
        """Cut-off env calls whose threads still run (see :meth:`EnvSlots.leaked`)."""
        return self.slots.leaked()


class EnvCluster(Cluster):
    """The driver's typed view of an :class:`EnvWorker` cluster (a type: never built, see ``on_cluster``)."""

    reset = on_cluster(EnvWorker.reset)
    step = on_cluster(EnvWorker.step)
    leaked = on_cluster(EnvWorker.leaked)
    close = on_cluster(EnvWorker.close)


class ClusterEnvPool:
    """An :class:`~roll.agentic.env_manager.manager.EnvPool` over a Cluster of :class:`EnvWorker` (see the module
    docstring for its deadlines). ``call_timeout_s``: how long a rank may take to answer a batch (default: the
    env role's call timeout); ``restarts`` counts the workers restarted."""

    def __init__(self, cluster: Cluster, slots_per_worker: int, call_timeout_s: float | None = None) -> None:
        self.cluster = cast(EnvCluster, cluster)
        self.slots_per_worker = slots_per_worker
        self._num_slots = slots_per_worker * cluster.world_size
        self.call_timeout_s = call_timeout_s
        self.restarts = 0

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def reset(self, requests: Sequence[ResetRequest | None]) -> list[ResetOutcome | None]:
        self._restart_leaking()
        return self._call(self.cluster.reset, requests, ResetOutcome)

    def step(self, requests: Sequence[StepRequest | None]) -> list[StepOutcome | None]:
        return self._call(self.cluster.step, requests, StepOutcome)

    def _call(
        self,
        method: ClusterMethod[[list[Request | None]], list[Outcome | None]],
        requests: Sequence[Request | None],
        outcome: type[Outcome],
    ) -> list[Outcome | None]:
        """Each rank gets its own slots' requests; a rank that fails to answer in time loses its envs."""
        n = self.slots_per_worker
        shares = [list(requests[r * n : (r + 1) * n]) for r in range(self.cluster.world_size)]
        timed = method if self.call_timeout_s is None else method.with_timeout(self.call_timeout_s)
        calls = {
            rank: submit_to_rank(timed, rank, share)
            for rank, share in enumerate(shares)
            if any(request is not None for request in share)
        }
        out: list[Outcome | None] = [None] * len(requests)
        for rank, call in calls.items():
            try:
                out[rank * n : (rank + 1) * n] = call.pending.result()
            except WorkerError as exc:  # hung or dead: the restart ends whatever it was stuck in
                reason = self._restart(rank, method.name, exc)
                failed = [outcome(error=reason) if r is not None else None for r in shares[rank]]
                out[rank * n : (rank + 1) * n] = failed
        return out

    def _restart(self, rank: int, method: str, exc: WorkerError) -> str:
        timed_out = isinstance(exc, TimeoutError)
        what = "did not answer in time" if timed_out else "failed"
        reason = (
            f"{'timeout' if timed_out else 'error'}: env worker rank {rank} {what} during {method} "
            f"({str(exc).splitlines()[0][:200]}); restarted, its envs lost"
        )
        log.warning("%s", reason)
        self.cluster.restart_rank(rank)
        self.restarts += 1
        return reason

    def _restart_leaking(self) -> None:
        """Before a rollout (no env is live then): restart every worker still running cut-off env threads."""
        for rank, leaked in enumerate(self.cluster.leaked()):
            if leaked:
                log.warning(
                    "env worker rank %d still runs %d cut-off env calls; restarting it before the next rollout",
                    rank, leaked,
                )  # fmt: skip
                self.cluster.restart_rank(rank)
                self.restarts += 1

    def close(self) -> None:
        self.cluster.close()


def slots_per_worker(total_envs: int, num_workers: int) -> int:
    """Slots each worker needs so that ``total_envs`` fit (ceil division)."""
    return max(1, -(-total_envs // num_workers))


def pool_call_timeout_s(timeout_s: float) -> float:
    """The deadline of one rank's batch: the in-worker ``timeout_s`` plus :data:`CALL_MARGIN_S`."""
    return timeout_s + CALL_MARGIN_S


def worker_kwargs(
    envs: Sequence[EnvEntryConfig], total_envs: int, num_workers: int, timeout_s: float
) -> dict[str, Any]:
    """The ``init_kwargs`` of an EnvWorker cluster holding ``total_envs`` envs."""
    return {"envs": list(envs), "slots": slots_per_worker(total_envs, num_workers), "timeout_s": timeout_s}
