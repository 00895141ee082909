"""The start-up checks: everything ``roll train`` checks between loading a config and starting Ray.

``roll validate`` and ``roll train`` both call :func:`startup_issues` (through
:func:`roll.core.cli.load_run_config`), so a config that validates passes every check the run makes before Ray
starts, and a config a run rejects there is rejected by ``roll validate`` with the same message and key path.
The list is :data:`CORE_CHECKS` (what every pipeline shares: tracker names, node pins) followed by the pipeline's
own :attr:`~roll.core.types.PipelineSpec.preflight` (data sources, model paths, plugin options). No check loads
model weights or starts Ray; all of them return every problem they find.

What is not checked here: the output dir (a held run dir, a damaged resume checkpoint) is state, not config; the
run checks it when the pipeline is built, still before Ray starts. CPU/GPU totals and the labels of a running Ray
cluster are checked by the run once it reaches the cluster (:meth:`ResourceManager.allocate`), with the
arithmetic.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable

from roll.core import plugins
from roll.core.config.schema import sections_of
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.errors import ConfigIssue, PluginError
from roll.core.types import PipelineSpec

Check = Callable[[RunConfig], list[ConfigIssue]]


def startup_issues(spec: PipelineSpec, config: RunConfig) -> list[ConfigIssue]:
    """Every problem :data:`CORE_CHECKS` and the pipeline's pre-flight find in ``config``."""
    issues = [issue for check in CORE_CHECKS for issue in check(config)]
    if spec.preflight is not None:
        issues += spec.preflight(config)
    return issues


def tracker_issues(config: RunConfig) -> list[ConfigIssue]:
    """Every ``tracking.backends`` name that is no installed ``roll.tracker`` plugin (or fails to load)."""
    issues = []
    for i, name in enumerate(config.tracking.backends):
        try:
            plugins.load("roll.tracker", name)
        except PluginError as exc:
            issues.append(ConfigIssue(f"tracking.backends.{i}", str(exc)))
    return issues


def node_pin_issues(config: RunConfig) -> list[ConfigIssue]:
    """Role pins (``<role>.node``) that no machine of the Ray the run will start offers.

    Checked only when the run starts a local Ray (no ``ray.address``, no ``RAY_ADDRESS``, no Ray already up in this
    process): that Ray's one node offers ``node:<this machine's IP>`` and no labels of its own, so any other pin
    would never be placed. With an address the cluster's labels are checked by the run once it attaches.
    """
    if not _starts_local_ray(config):
        return []
    local = {f"node:{ip}" for ip in _local_ips()}
    issues = []
    for where, role in sections_of(config, RoleConfig):
        if role.node is None or role.node in local:
            continue
        message = (
            f"no machine offers {role.node!r}: this run starts a local Ray (ray.address and RAY_ADDRESS unset), "
            f"whose only node offers {', '.join(sorted(local))}"
        )
        hint = (
            f"start a cluster whose nodes carry it (`ray start --head --resources='{{\"{role.node}\": 1}}'`) and "
            "set ray.address or RAY_ADDRESS, or remove the pin"
        )
        issues.append(ConfigIssue(f"{where}.node", message, hint))
    return issues


CORE_CHECKS: tuple[Check, ...] = (tracker_issues, node_pin_issues)
"""The checks every pipeline's run makes before Ray starts, in order."""


def _starts_local_ray(config: RunConfig) -> bool:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return False  # the run uses the Ray already up (a test's, a notebook's), whatever its labels
    address = config.ray.address or os.environ.get("RAY_ADDRESS") or None
    return address in (None, "local")


def _local_ips() -> set[str]:
    """This machine's IPv4 addresses as Ray may name its node: the outbound route's, the host name's, loopback."""
    ips = {"127.0.0.1"}
    with contextlib.suppress(OSError):
        ips.update(socket.gethostbyname_ex(socket.gethostname())[2])
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("8.8.8.8", 80))  # UDP: sends nothing, only picks the outbound interface
        ips.add(probe.getsockname()[0])
    return ips
