"""The reward side of the rlvr family (``rlvr``, ``rlvr_rollout``, and a plugin that scores as they do): one
:class:`~roll.pipelines.rlvr.reward_worker.RewardWorker` cluster per reward domain, role ``reward_<domain>``, and the
:class:`~roll.core.scheduler.RewardScheduler` that routes each row to its domain by tag (``rewards.<domain>.tags``;
the domain without tags takes the rest). A row whose reward call passes its deadline scores as failed
(:func:`~roll.pipelines.rlvr.reward_worker.timed_out_rows`) and the run goes on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from roll.core.cluster import Cluster
from roll.core.config.sections import RoleConfig
from roll.core.scheduler import RankRequest, RewardScheduler
from roll.pipelines.rlvr.config import RewardDomainConfig, reward_routes
from roll.pipelines.rlvr.reward_worker import REWARD_COLUMNS, RewardWorker, timed_out_rows

if TYPE_CHECKING:
    from roll.pipelines.rlvr.clusters import RewardCluster

__all__ = ["reward_roles", "start_rewards"]


def reward_roles(rewards: Mapping[str, RewardDomainConfig]) -> dict[str, RoleConfig]:
    """Each reward domain's role, for a recipe's ``roles``."""
    return {f"reward_{name}": domain.workers for name, domain in rewards.items()}


def start_rewards(
    make_cluster: Callable[..., Cluster], rewards: Mapping[str, RewardDomainConfig]
) -> RewardScheduler:
    """Start every domain's reward workers (ready when their constructors return: they have no ``setup``) and
    return the scheduler over them, each domain called through its typed ``score``."""
    routes, default = reward_routes(dict(rewards))
    scorers = {}
    for name, domain in rewards.items():
        cluster = make_cluster(f"reward_{name}", RewardWorker, init_args=(domain.type, domain.options))
        scorers[name] = RankRequest.bind(cast("RewardCluster", cluster).score)
    return RewardScheduler(
        scorers, routes, columns=REWARD_COLUMNS, default_domain=default, on_timeout=timed_out_rows
    )
