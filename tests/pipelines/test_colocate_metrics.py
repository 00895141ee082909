"""The per-step time-sharing metrics of :class:`~roll.pipelines.policy.group.PolicyGroup` (pure reduction)."""

from __future__ import annotations

from roll.pipelines.policy.group import phase_cost_metrics


def test_offload_metrics_take_the_slowest_rank_and_sum_freed_memory() -> None:
    """Two ranks: 0.5 s and 1.5 s, 1 MiB and 3 MiB freed -> the phase waited 1.5 s and 4 MiB came free."""
    per_rank = [{"seconds": 0.5, "freed_bytes": 2.0**20}, {"seconds": 1.5, "freed_bytes": 3 * 2.0**20}]
    assert phase_cost_metrics("actor_train", "offload", per_rank) == {
        "colocate/actor_train_offload_s": 1.5,
        "colocate/actor_train_freed_mib": 4.0,
    }
    reload = phase_cost_metrics("actor_infer", "reload", [{"seconds": 0.25, "freed_bytes": -1.0}])
    assert reload == {"colocate/actor_infer_reload_s": 0.25}
