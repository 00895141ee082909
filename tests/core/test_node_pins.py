"""Roles pinned to nodes by their ``node`` key: the plan (pure) and its errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roll.core.cluster.resources import check_fits, plan_demand
from roll.core.config.sections import RoleConfig
from roll.core.errors import ResourceError


def test_node_key_pins_the_role_bundles() -> None:
    roles = {"actor_train": RoleConfig(node="trainer"), "actor_infer": RoleConfig(node="rollout")}
    pins = {d.roles: d.pin for d in plan_demand(roles)}
    assert pins == {("actor_train",): "trainer", ("actor_infer",): "rollout"}
    bundle = plan_demand(roles)[0].bundles()[0]
    assert bundle["trainer"] == pytest.approx(0.001)


def test_colocated_roles_on_different_nodes_are_rejected_by_key() -> None:
    roles = {"a": RoleConfig(device_group="g", node="n1"), "b": RoleConfig(device_group="g", node="n2")}
    with pytest.raises(ResourceError, match=r"\('a\.node', 'n1'\), \('b\.node', 'n2'\)"):
        plan_demand(roles)


def test_missing_label_names_the_key_and_the_ray_start_flag() -> None:
    roles = {"actor_infer": RoleConfig(node="rollout", cpus_per_worker=0.5)}
    with pytest.raises(ResourceError, match=r"'rollout' that actor_infer\.node pins to.*--resources"):
        check_fits(roles, plan_demand(roles), {"CPU": 4.0})


def test_node_key_is_strict() -> None:
    with pytest.raises(ValidationError):
        RoleConfig(node="")
    with pytest.raises(ValidationError):
        RoleConfig.model_validate({"nodes": "trainer"})
