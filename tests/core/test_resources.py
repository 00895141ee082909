"""ResourceManager: demand arithmetic (pure), the check before anything waits, and bundle sharing on real Ray."""

from __future__ import annotations

import time
from typing import Any

import pytest

from roll.core.cluster import Cluster, ResourceManager, Worker
from roll.core.cluster.resources import check_fits, plan_demand
from roll.core.config.sections import RoleConfig
from roll.core.errors import ResourceError
from roll.core.testing import tiny_role


class Idle(Worker):
    pass


def test_colocated_roles_share_bundles_and_disaggregated_get_their_own() -> None:
    roles = {
        "actor_train": RoleConfig(num_workers=2, cpus_per_worker=0.5, device_group="g"),
        "actor_infer": RoleConfig(num_workers=1, cpus_per_worker=1.0, device_group="g"),
        "reference": RoleConfig(num_workers=1, cpus_per_worker=0.25),
    }
    g, ref = plan_demand(roles)
    # colocated: max(2, 1) bundles of max(0.5, 1.0) CPU; disaggregated reference: its own single bundle.
    assert (g.roles, g.num_bundles, g.cpus_per_bundle, g.total_cpus) == (
        ("actor_train", "actor_infer"),
        2,
        1.0,
        2.0,
    )
    assert (ref.roles, ref.num_bundles, ref.total_cpus) == (("reference",), 1, 0.25)
    assert g.bundles() == [{"CPU": 1.0}, {"CPU": 1.0}]


def test_over_ask_spells_out_the_arithmetic() -> None:
    roles = {
        "actor_train": RoleConfig(num_workers=3, cpus_per_worker=1.5),
        "reward": RoleConfig(cpus_per_worker=0.6),
    }
    with pytest.raises(ResourceError) as info:
        check_fits(roles, plan_demand(roles), {"CPU": 4.0})
    text = str(info.value)
    assert "CPU: roles ask for 5.1 in total, the cluster has 4" in text  # 3 x 1.5 + 1 x 0.6
    assert "actor_train 3 x (1.5 CPU, 0 GPU)" in text and "= 4.5 CPU" in text
    assert "actor_train.cpus_per_worker" in text and "reward.num_workers" in text


def test_fractions_that_exactly_fit_are_accepted() -> None:
    roles = {f"r{i}": RoleConfig(cpus_per_worker=0.1) for i in range(3)}
    check_fits(roles, plan_demand(roles), {"CPU": 0.3})  # 0.1 * 3 != 0.3 in floats; Ray's 1e-4 units agree


def test_colocating_multi_gpu_workers_is_rejected() -> None:
    roles = {
        "a": RoleConfig(gpus_per_worker=2, device_group="g"),
        "b": RoleConfig(gpus_per_worker=2, device_group="g"),
    }
    with pytest.raises(ResourceError, match="at most one GPU"):
        plan_demand(roles)


def test_colocated_roles_must_share_a_pin() -> None:
    roles = {"a": RoleConfig(device_group="g"), "b": RoleConfig(device_group="g")}
    with pytest.raises(ResourceError, match="pinned to the same node"):
        plan_demand(roles, {"a": "node:1.2.3.4"})


def test_over_ask_raises_before_any_wait(ray_local: Any) -> None:
    rm = ResourceManager({"actor_train": tiny_role(num_workers=3, cpus_per_worker=2.0)}, timeout_s=60)
    start = time.monotonic()
    with pytest.raises(ResourceError, match=r"CPU: roles ask for 6 in total, the cluster has 4"):
        rm.allocate()
    assert time.monotonic() - start < 20  # a wait would last the 60 s timeout


def test_unknown_pin_resource_is_reported(ray_local: Any) -> None:
    rm = ResourceManager({"a": tiny_role()}, node_resource={"a": "no_such_node_label"})
    with pytest.raises(ResourceError, match="no node offers the resource 'no_such_node_label'"):
        rm.allocate()


def test_colocated_actors_share_one_bundle_on_ray(ray_local: Any) -> None:
    roles = {
        "actor_train": tiny_role(cpus_per_worker=0.5, device_group="g"),
        "actor_infer": tiny_role(cpus_per_worker=0.5, device_group="g"),
        "reference": tiny_role(cpus_per_worker=0.25),
    }
    with ResourceManager(roles) as rm:
        train, infer, ref = (rm.placement(r) for r in roles)
        assert train.pg.id == infer.pg.id != ref.pg.id
        assert (train.num_cpus, infer.num_cpus, ref.num_cpus) == (0.25, 0.25, 0.25)
        # Both colocated actors fit into the one 0.5-CPU bundle; without the split the second would wait forever.
        with (
            Cluster("actor_train", Idle, roles["actor_train"], rm),
            Cluster("actor_infer", Idle, roles["actor_infer"], rm) as c2,
        ):
            assert c2.ping() == [0]
