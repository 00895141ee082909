"""From role configs to Ray placement groups, with the arithmetic checked before anything waits.

Roles that name the same ``device_group`` are colocated: they time-share one set of bundles (the group's bundle
``i`` holds rank ``i`` of every role in the group). Roles with another group or none are disaggregated: their own
bundles. A device group asks for ``max(num_workers)`` bundles of ``max(cpus_per_worker)`` CPUs and
``max(gpus_per_worker)`` GPUs each, one placement group per device group.

Ray only lets actors into a bundle while their requests fit in it, so each of the ``k`` colocated roles asks for
``1/k`` of its bundle (rounded down to Ray's 1e-4 resource unit). With fractional GPUs Ray then gives all of them
the same device, which is what time-sharing means. Ray cannot split a bundle of several whole GPUs that way, so
colocating roles with ``gpus_per_worker > 1`` is rejected.

Why check first: a placement group or actor that asks for more than the cluster has is not an error in Ray, it is
a wait that never ends (fractional CPUs make this easy to hit). :meth:`ResourceManager.allocate` compares the
demand with ``ray.cluster_resources()`` and ``ray.available_resources()`` and raises :class:`ResourceError` with the
arithmetic instead; the wait for the placement groups themselves has a timeout too.

Pinning: a role's ``node`` key (or ``node_resource={"actor_train": "node:10.0.0.2"}``, which wins) adds ``0.001`` of that resource to each of the role's
bundles, so they land only on nodes that have it: every node has ``node:<its ip>``, and ``ray start --resources``
or ``ray.cluster_utils.Cluster.add_node(resources=...)`` can give nodes labels of your own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from roll.core.config.sections import RoleConfig
from roll.core.errors import ResourceError

__all__ = ["DeviceGroupDemand", "ResourceManager", "RolePlacement", "check_fits", "plan_demand"]

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
_PIN_AMOUNT = 0.001
_RESOURCE_UNIT = 1e-4


@dataclass(frozen=True)
class DeviceGroupDemand:
    """One placement group's worth of demand: its roles, bundle count and per-bundle size."""

    name: str
    roles: tuple[str, ...]
    num_bundles: int
    cpus_per_bundle: float
    gpus_per_bundle: float
    pin: str | None = None

    @property
    def total_cpus(self) -> float:
        return self.num_bundles * self.cpus_per_bundle

    @property
    def total_gpus(self) -> float:
        return self.num_bundles * self.gpus_per_bundle

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"CPU": self.cpus_per_bundle}
        if self.gpus_per_bundle > 0:
            bundle["GPU"] = self.gpus_per_bundle
        if self.pin:
            bundle[self.pin] = _PIN_AMOUNT
        return [dict(bundle) for _ in range(self.num_bundles)]


@dataclass(frozen=True)
class RolePlacement:
    """Where a role's actors go: rank ``r`` asks for ``num_cpus``/``num_gpus`` from ``pg`` bundle
    ``bundle_indices[r]``."""

    role: str
    pg: PlacementGroup
    bundle_indices: tuple[int, ...]
    num_cpus: float
    num_gpus: float

    def actor_options(self, rank: int) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options`` of rank ``rank``."""
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.pg,
            placement_group_bundle_index=self.bundle_indices[rank],
            placement_group_capture_child_tasks=True,
        )
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "scheduling_strategy": strategy}


def plan_demand(
    roles: Mapping[str, RoleConfig], node_resource: Mapping[str, str] | None = None
) -> list[DeviceGroupDemand]:
    """Group roles by device group and size each group's bundles. Pure: no Ray calls."""
    pins = {name: cfg.node for name, cfg in roles.items() if cfg.node is not None}
    pins.update(node_resource or {})
    unknown = sorted(set(pins) - set(roles))
    if unknown:
        raise ResourceError(f"node_resource names unknown roles {unknown}; roles are {sorted(roles)}")
    groups: dict[str, list[str]] = {}
    for name, cfg in roles.items():
        groups.setdefault(cfg.device_group or f"role:{name}", []).append(name)
    return [_group_demand(key, members, roles, pins) for key, members in groups.items()]


def _group_demand(
    key: str, members: list[str], roles: Mapping[str, RoleConfig], pins: Mapping[str, str]
) -> DeviceGroupDemand:
    cfgs = [roles[m] for m in members]
    pinned = {m: pins[m] for m in members if m in pins}
    if pinned and (len(set(pinned.values())) > 1 or len(pinned) != len(members)):
        raise ResourceError(
            f"device group {key!r} shares bundles between {members}, so they must be pinned to the same node; "
            f"the pins are {[(m + '.node', pins.get(m)) for m in members]}: give them all the same node"
        )
    gpus = max(c.gpus_per_worker for c in cfgs)
    if len(members) > 1 and gpus > 1:
        raise ResourceError(
            f"device group {key!r} colocates {members} with up to {gpus:g} GPUs per worker; Ray can only share "
            "a bundle of at most one GPU between actors. Use gpus_per_worker <= 1 for colocated roles, or give "
            f"them different device_group values ({', '.join(m + '.device_group' for m in members)})"
        )
    return DeviceGroupDemand(
        name=key,
        roles=tuple(members),
        num_bundles=max(c.num_workers for c in cfgs),
        cpus_per_bundle=max(c.cpus_per_worker for c in cfgs),
        gpus_per_bundle=gpus,
        pin=next(iter(pinned.values()), None),
    )


def check_fits(
    roles: Mapping[str, RoleConfig],
    demand: list[DeviceGroupDemand],
    total: Mapping[str, float],
    available: Mapping[str, float] | None = None,
) -> None:
    """Raise :class:`ResourceError` with the arithmetic if ``demand`` exceeds ``total`` (or ``available``)."""
    problems = _shortfalls(demand, total, "the cluster has")
    if not problems and available is not None:
        problems = _shortfalls(demand, available, "is free now (other jobs hold the rest)")
    problems += [
        f"no node offers the resource {d.pin!r} that {', '.join(r + '.node' for r in d.roles)} pins to; nodes "
        f"get labels with `ray start --resources='{{\"{d.pin}\": 1}}'` (every node has node:<its ip>)"
        for d in demand
        if d.pin and d.pin not in total
    ]
    if problems:
        raise ResourceError(_explain(roles, demand, total, available, problems))


def _shortfalls(demand: list[DeviceGroupDemand], have: Mapping[str, float], label: str) -> list[str]:
    out = []
    for key, need in (("CPU", sum(d.total_cpus for d in demand)), ("GPU", sum(d.total_gpus for d in demand))):
        # Ray counts resources in units of 1e-4; compare in those units so 0.1 * 3 == 0.3 holds.
        if need > 0 and round(need / _RESOURCE_UNIT) > round(have.get(key, 0.0) / _RESOURCE_UNIT):
            out.append(f"{key}: roles ask for {need:g} in total, {label} {have.get(key, 0.0):g}")
    return out


def _explain(
    roles: Mapping[str, RoleConfig],
    demand: list[DeviceGroupDemand],
    total: Mapping[str, float],
    available: Mapping[str, float] | None,
    problems: list[str],
) -> str:
    lines = ["the roles ask for more than the Ray cluster has:", *(f"  - {p}" for p in problems), "demand:"]
    for d in demand:
        asks = ", ".join(
            f"{r} {roles[r].num_workers} x ({roles[r].cpus_per_worker:g} CPU, {roles[r].gpus_per_worker:g} GPU)"
            for r in d.roles
        )
        shared = " (colocated: max of each)" if len(d.roles) > 1 else ""
        lines.append(
            f"  {d.name}: {asks}{shared} -> {d.num_bundles} bundles x ({d.cpus_per_bundle:g} CPU, "
            f"{d.gpus_per_bundle:g} GPU) = {d.total_cpus:g} CPU, {d.total_gpus:g} GPU"
        )
    lines.append(f"cluster total: {_fmt(total)}" + (f"; available: {_fmt(available)}" if available else ""))
    keys = ", ".join(f"{r}.cpus_per_worker / {r}.num_workers / {r}.gpus_per_worker" for r in roles)
    lines.append(f"hint: lower {keys}, share devices with device_group, or add nodes / ray.num_cpus")
    return "\n".join(lines)


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={res.get(k, 0.0):g}" for k in ("CPU", "GPU"))


class ResourceManager:
    """Reserves placement groups for a set of roles and tells each Cluster its bundles.

    ``ResourceManager(roles)`` only plans (no Ray calls; bad combinations raise here). :meth:`allocate` checks the
    plan against the running Ray and creates the placement groups, waiting at most ``timeout_s``;
    :meth:`placement` allocates on first use. :meth:`release` removes the groups; the manager is a context manager.
    """

    def __init__(
        self,
        roles: Mapping[str, RoleConfig],
        *,
        strategy: Strategy = "PACK",
        node_resource: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        if not roles:
            raise ResourceError("ResourceManager needs at least one role")
        self.roles: dict[str, RoleConfig] = dict(roles)
        self.strategy: Strategy = strategy
        self.timeout_s = timeout_s
        self.demand = plan_demand(self.roles, node_resource)
        self._pgs: dict[str, PlacementGroup] = {}

    def allocate(self) -> None:
        """Check the totals against Ray, then create and wait for every placement group. Idempotent."""
        if self._pgs:
            return
        check_fits(self.roles, self.demand, _cluster_resources(), _available_resources())
        try:
            for d in self.demand:
                self._pgs[d.name] = placement_group(d.bundles(), strategy=self.strategy, name="")
            self._wait_ready()
        except BaseException:
            self.release()
            raise

    def _wait_ready(self) -> None:
        pending = {name: pg.ready() for name, pg in self._pgs.items()}
        _, not_ready = ray.wait(list(pending.values()), num_returns=len(pending), timeout=self.timeout_s)
        if not_ready:
            late = [name for name, ref in pending.items() if ref in not_ready]
            raise ResourceError(
                f"placement groups {late} were not ready within {self.timeout_s:g}s although the totals fit; "
                f"no single node may have room for a bundle (strategy {self.strategy}), or a pinned node is "
                f"missing. cluster resources: {_fmt(_cluster_resources())}. hint: use strategy='SPREAD', "
                "smaller cpus_per_worker, or check `ray status`"
            )

    def placement(self, role: str) -> RolePlacement:
        """The bundles and per-actor request of ``role``; allocates the placement groups on first use."""
        if role not in self.roles:
            raise ResourceError(f"role {role!r} is not managed here; roles are {sorted(self.roles)}")
        self.allocate()
        group = next(d for d in self.demand if role in d.roles)
        share = len(group.roles)
        cfg = self.roles[role]
        return RolePlacement(
            role=role,
            pg=self._pgs[group.name],
            bundle_indices=tuple(range(cfg.num_workers)),
            num_cpus=_share(group.cpus_per_bundle, share),
            num_gpus=_share(group.gpus_per_bundle, share) if cfg.gpus_per_worker > 0 else 0.0,
        )

    def release(self) -> None:
        """Remove every placement group this manager created (their actors die with them)."""
        for pg in self._pgs.values():
            with contextlib.suppress(Exception):  # Ray already gone: nothing left to free
                remove_placement_group(pg)
        self._pgs.clear()

    def __enter__(self) -> ResourceManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _share(amount: float, ways: int) -> float:
    """``amount / ways`` rounded down to Ray's resource unit, so ``ways`` shares never exceed ``amount``."""
    if ways == 1:
        return amount
    return round(math.floor(round(amount / ways / _RESOURCE_UNIT, 6)) * _RESOURCE_UNIT, 4)


def _cluster_resources() -> dict[str, float]:
    return dict(ray.cluster_resources())  # type: ignore[no-untyped-call]


def _available_resources() -> dict[str, float]:
    return dict(ray.available_resources())  # type: ignore[no-untyped-call]
