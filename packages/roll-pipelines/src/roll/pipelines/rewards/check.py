"""Load-time checks of reward domains: each ``type`` is an installed ``roll.reward`` plugin and its ``options``
validate against that plugin's config model (for ``python``, that imports the function and checks its
signature). Pipelines call :func:`reward_issues` from their spec's ``preflight``, so ``roll validate`` reports
a bad reward before any actor starts, with key paths such as ``rewards.math.options.function``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from roll.core import plugins
from roll.core.config.validate import validate_data
from roll.core.errors import ConfigError, ConfigIssue, PluginError


class RewardDomain(Protocol):
    """What a pipeline's reward-domain config provides (``rlvr``'s ``RewardDomainConfig`` does)."""

    @property
    def type(self) -> str: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


def reward_issues(domains: Mapping[str, RewardDomain], *, prefix: str = "rewards") -> list[ConfigIssue]:
    """Every problem of every domain's plugin and options, with key paths under ``prefix``."""
    issues: list[ConfigIssue] = []
    for name, domain in domains.items():
        where = f"{prefix}.{name}"
        try:
            spec = plugins.load("roll.reward", domain.type)
        except PluginError as exc:
            issues.append(ConfigIssue(f"{where}.type", str(exc)))
            continue
        if spec.config_model is None:
            if domain.options:
                message = f"reward {domain.type!r} takes no options, got {sorted(domain.options)}"
                issues.append(ConfigIssue(f"{where}.options", message))
            continue
        try:
            validate_data(dict(domain.options), spec.config_model)
        except ConfigError as exc:
            issues += [_prefixed(issue, f"{where}.options") for issue in exc.issues]
    return issues


def _prefixed(issue: ConfigIssue, prefix: str) -> ConfigIssue:
    path = f"{prefix}.{issue.path}" if issue.path else prefix
    return ConfigIssue(path, issue.message, issue.hint)
