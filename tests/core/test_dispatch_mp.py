"""``Dispatch.MP_SPLIT`` and :class:`Mesh`: the model-parallel layout (pure) and the split/collect on real actors.

The Ray test runs one 4-rank cluster of torch-free actors (DP 2 x TP 2) on the shared local Ray.
"""

from __future__ import annotations

from typing import Any

import pytest

from roll.core.cluster import Cluster, Dispatch, Mesh, Worker, WorkerContext, register
from roll.core.cluster.dispatch import RULES
from roll.core.errors import ConfigError
from roll.core.testing import tiny_role


def test_mesh_megatron_order() -> None:
    """rank = tp + tp*(cp + cp*(dp + dp_size*pp)). World 8, tp 2, pp 2 -> dp 2: rank 5 = tp 1, dp 0, pp 1
    (5 = 1 + 2*(0 + 2*1)); the last stage is ranks 4..7, so one rank per DP group there is 4 (dp 0), 6 (dp 1)."""
    mesh = Mesh(8, tp=2, pp=2)
    assert mesh.dp == 2
    assert mesh.coords(5) == (1, 0, 0, 1)
    assert [mesh.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert mesh.collect_ranks() == (4, 6)
    assert all(mesh.rank_of(tp=t, cp=c, dp=d, pp=p) == r for r in range(8) for t, c, d, p in [mesh.coords(r)])
    assert Mesh(4, tp=2).collect_ranks() == (0, 2)
    assert Mesh(3).collect_ranks() == (0, 1, 2)


def test_mesh_rejects_indivisible_world() -> None:
    with pytest.raises(ConfigError, match=r"2 x 2 x 1 = 4 ranks.*tensor_parallel_size"):
        Mesh(6, tp=2, pp=2)
    with pytest.raises(ConfigError, match="integers >= 1"):
        Mesh(4, tp=0)


def test_mp_split_plan_without_ray() -> None:
    """7 rows over DP 2: padded with the last row to 8, shards [0..3] and [4, 5, 6, 6]; TP peers share a shard;
    collecting from positions (0, 2) and dropping the pad gives the 7 rows back."""
    rule = RULES[Dispatch.MP_SPLIT]
    plan = rule.split((list(range(7)), "x"), {"k": 1}, Mesh(4, tp=2))
    shards = [a[0] for a, _ in plan.args]
    assert shards == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 6], [4, 5, 6, 6]]
    assert all(a[1:] == ("x",) and kw == {"k": 1} for a, kw in plan.args)
    assert plan.collect_from == (0, 2) and plan.pad == 1
    per_rank = [[f"r{r}:{x}" for x in shard] for r, shard in enumerate(shards)]
    assert rule.collect(per_rank, plan) == [f"r0:{x}" for x in range(4)] + ["r2:4", "r2:5", "r2:6"]


def test_mp_split_trivial_mesh_equals_dp_split() -> None:
    data = list(range(5))
    mp = RULES[Dispatch.MP_SPLIT].split((data,), {}, Mesh(2))
    dp = RULES[Dispatch.DP_SPLIT].split((data,), {}, Mesh(2))
    assert mp.args == dp.args and mp.pad == dp.pad and mp.collect_from == (0, 1)


class MeshProbe(Worker):
    """Remembers what each rank received; answers with its rank beside every row it got."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.received: list[Any] = []

    @register(Dispatch.MP_SPLIT)
    def tag(self, rows: list[int], scale: int = 1) -> list[tuple[int, int]]:
        self.received = list(rows)
        return [(self.rank, x * scale) for x in rows]

    @register(Dispatch.MP_SPLIT)
    def summary(self, rows: list[int]) -> dict[str, int]:
        return {"rank": self.rank, "rows": len(rows)}

    @register(Dispatch.ONE_TO_ALL)
    def last_received(self) -> list[Any]:
        return self.received


@pytest.fixture(scope="module")
def dp2_tp2(ray_local: Any) -> Any:
    with Cluster(
        "mesh", MeshProbe, tiny_role(num_workers=4, cpus_per_worker=0.25), mesh=Mesh(4, tp=2)
    ) as cluster:
        yield cluster


def test_mp_split_on_actors_calls_every_rank_collects_one_per_dp(dp2_tp2: Any) -> None:
    """World 4 = DP 2 x TP 2: ranks 0, 1 get rows [0, 1, 2], ranks 2, 3 get [3, 4, 5]; the result comes from
    ranks 0 and 2 only (one per DP group), in DP order, with the extra argument applied (x10)."""
    out = dp2_tp2.tag(list(range(6)), scale=10)
    assert out == [(0, 0), (0, 10), (0, 20), (2, 30), (2, 40), (2, 50)]
    assert dp2_tp2.last_received() == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]


def test_mp_split_on_actors_pads_and_returns_per_dp_results(dp2_tp2: Any) -> None:
    """5 rows: DP 1 gets [3, 4, 4] (padded), the pad is dropped from the joined list; a non-list result comes back
    as one entry per DP group (ranks 0 and 2), not per rank."""
    assert [x for _, x in dp2_tp2.tag(list(range(5)))] == [0, 1, 2, 3, 4]
    assert dp2_tp2.last_received()[3] == [3, 4, 4]
    assert dp2_tp2.summary(list(range(4))) == [{"rank": 0, "rows": 2}, {"rank": 2, "rows": 2}]


def test_cluster_rejects_mesh_of_other_size(ray_local: Any) -> None:
    with pytest.raises(ValueError, match=r"mesh of 4 ranks for m\.num_workers = 2"):
        Cluster("m", MeshProbe, tiny_role(num_workers=2), mesh=Mesh(4, tp=2))
