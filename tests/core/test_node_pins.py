"""Roles pinned to nodes by their ``node`` key: the plan (pure) and its errors."""

from __future__ import annotations

import sys

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


def test_startup_check_compares_pins_with_the_local_ray_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``roll validate`` (and ``roll train`` before Ray) knows the labels only of the Ray the run starts itself:
    one node offering ``node:<this machine's IP>``. A label is then a problem naming ``<role>.node``; a pin to
    this machine is not; with ``ray.address`` or ``RAY_ADDRESS`` the cluster's labels are the run's to check."""
    from roll.core.smoke import SmokeConfig
    from roll.core.startup import node_pin_issues

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # as in a fresh `roll validate` process: no Ray up here (another test's shared Ray would be the one used)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    pinned = SmokeConfig.model_validate({"pipeline": "smoke", "workers": {"node": "trainer"}})
    (issue,) = node_pin_issues(pinned)
    assert issue.path == "workers.node" and "no machine offers 'trainer'" in issue.message
    assert "--resources" in (issue.hint or "")
    here = SmokeConfig.model_validate({"pipeline": "smoke", "workers": {"node": "node:127.0.0.1"}})
    assert node_pin_issues(here) == []
    remote = pinned.model_copy(update={"ray": pinned.ray.model_copy(update={"address": "10.0.0.1:6379"})})
    assert node_pin_issues(remote) == []
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert node_pin_issues(pinned) == []
