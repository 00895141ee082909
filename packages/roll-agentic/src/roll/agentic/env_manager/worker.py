"""``EnvWorker``: a Ray actor running many envs, and :class:`ClusterEnvPool`, the manager's view of a Cluster
of them.

Slot ``s`` of the pool lives on rank ``s // slots_per_worker``. Both registered methods are ``DP_SPLIT`` over a
list with one entry per slot (None for idle slots), so the dispatcher's equal split hands every rank exactly its
own slots; the pool's size is a multiple of the worker count, so no padding ever shifts a slot to another rank.

The actor imports no torch (envs are plain Python), so it starts in a second or two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

__all__ = ["ClusterEnvPool", "EnvWorker"]


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


class ClusterEnvPool:
    """An :class:`~roll.agentic.env_manager.manager.EnvPool` over a Cluster of :class:`EnvWorker`."""

    def __init__(self, cluster: Cluster, slots_per_worker: int) -> None:
        self.cluster = cluster
        self._num_slots = slots_per_worker * cluster.world_size

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def reset(self, requests: Sequence[ResetRequest | None]) -> list[ResetOutcome | None]:
        out: list[ResetOutcome | None] = self.cluster.reset(list(requests))
        return out

    def step(self, requests: Sequence[StepRequest | None]) -> list[StepOutcome | None]:
        out: list[StepOutcome | None] = self.cluster.step(list(requests))
        return out

    def close(self) -> None:
        self.cluster.close()


def slots_per_worker(total_envs: int, num_workers: int) -> int:
    """Slots each worker needs so that ``total_envs`` fit (ceil division)."""
    return max(1, -(-total_envs // num_workers))


def worker_kwargs(
    envs: Sequence[EnvEntryConfig], total_envs: int, num_workers: int, timeout_s: float
) -> dict[str, Any]:
    """The ``init_kwargs`` of an EnvWorker cluster holding ``total_envs`` envs."""
    return {"envs": list(envs), "slots": slots_per_worker(total_envs, num_workers), "timeout_s": timeout_s}
