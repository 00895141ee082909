"""Time-sharing in :class:`~roll.pipelines.policy.group.PolicyGroup`: the per-step metrics (pure reduction) and
the phases on real (torch-free) actors of two colocated roles, on the shared local Ray."""

from __future__ import annotations

from typing import Any

from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.config.batch import BatchConfig
from roll.pipelines.policy.group import PolicyGroup, PolicySpec, phase_cost_metrics
from roll.workers.roles.config import InferRoleConfig, TrainRoleConfig


def test_offload_metrics_take_the_slowest_rank_and_sum_freed_memory() -> None:
    """Two ranks: 0.5 s and 1.5 s, 1 MiB and 3 MiB freed -> the phase waited 1.5 s and 4 MiB came free."""
    per_rank = [{"seconds": 0.5, "freed_bytes": 2.0**20}, {"seconds": 1.5, "freed_bytes": 3 * 2.0**20}]
    assert phase_cost_metrics("actor_train", "offload", per_rank) == {
        "colocate/actor_train_offload_s": 1.5,
        "colocate/actor_train_freed_mib": 4.0,
    }
    reload = phase_cost_metrics("actor_infer", "reload", [{"seconds": 0.25, "freed_bytes": -1.0}])
    assert reload == {"colocate/actor_infer_reload_s": 0.25}


def _phased_worker() -> type[Worker]:
    """The worker class, made inside a function so Ray pickles it by value: the actor then never imports this
    module (which imports torch through roll.pipelines), and starts in a second."""

    class Phased(Worker):
        """A torch-free stand-in for a role's actor: offload/reload flip a flag and report a cost like the roles do."""

        def __init__(self, ctx: WorkerContext) -> None:
            super().__init__(ctx)
            self.offloaded = False

        @register(Dispatch.ONE_TO_ALL)
        def offload(self) -> dict[str, float]:
            self.offloaded = True
            return {"seconds": 0.5 + self.rank, "freed_bytes": float(2**20)}

        @register(Dispatch.ONE_TO_ALL)
        def reload(self) -> dict[str, float]:
            self.offloaded = False
            return {"seconds": 0.25, "freed_bytes": -float(2**20)}

        @register(Dispatch.ONE_TO_ALL)
        def is_offloaded(self) -> bool:
            return self.offloaded

    return Phased


def test_phase_offloads_the_idle_side_and_logs_its_cost(ray_local: Any) -> None:
    """One device group: while generating, the trainer (2 ranks) is offloaded and the generator is not; while
    training, the reverse. Costs: slowest trainer rank 1.5 s, 2 x 1 MiB freed; the generator 0.5 s, 1 MiB."""
    role = {"num_workers": 2, "cpus_per_worker": 0.25, "device_group": "g"}
    spec = PolicySpec(
        actor=TrainRoleConfig.model_validate(role),
        infer=InferRoleConfig.model_validate({**role, "num_workers": 1}),
        batch=BatchConfig(prompts_per_step=2, micro_batch_samples=1),
        total_steps=1,
    )
    group = PolicyGroup(spec, make_cluster=Cluster)
    Phased = _phased_worker()
    with (
        Cluster("actor_train", Phased, spec.actor) as group.actor,
        Cluster("actor_infer", Phased, spec.infer) as group.infer,
    ):
        with group.phase("generate"):
            assert group.actor.is_offloaded() == [True, True] and group.infer.is_offloaded() == [False]
        with group.phase("train"):
            assert group.actor.is_offloaded() == [False, False] and group.infer.is_offloaded() == [True]
        assert group.pop_phase_metrics() == {
            "colocate/actor_train_offload_s": 1.5,
            "colocate/actor_train_freed_mib": 2.0,
            "colocate/actor_train_reload_s": 0.25,
            "colocate/actor_infer_offload_s": 0.5,
            "colocate/actor_infer_freed_mib": 1.0,
            "colocate/actor_infer_reload_s": 0.25,
        }
        assert group.pop_phase_metrics() == {}
