"""Load-time checks of the env mix: each ``type`` is an installed ``roll.env`` plugin and its ``options`` validate
against that plugin's config model (tool wrappers included: an env's built-in tools are fields of its config,
such as countdown's ``tools``; an entry's ``tools`` list names ``roll.tool`` plugins, checked the same way, and its
``tool_calls.format`` a ``roll.tool_parser`` plugin). The agentic pipelines call :func:`env_issues` from their spec's ``preflight``, so ``roll
validate`` reports a misspelled env or option before any actor starts, with key paths such as
``env_manager.envs.0.options.size``, exactly as it reports rewards.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from roll.agentic.env_manager.config import EnvEntryConfig
from roll.core import plugins
from roll.core.config.validate import validate_data
from roll.core.errors import ConfigError, ConfigIssue, PluginError

__all__ = ["env_issues", "env_preflight"]


def env_issues(envs: Sequence[EnvEntryConfig], *, prefix: str = "env_manager.envs") -> list[ConfigIssue]:
    """Every problem of every env entry's plugin and options, with key paths under ``prefix``."""
    issues: list[ConfigIssue] = []
    for i, entry in enumerate(envs):
        where = f"{prefix}.{i}"
        try:
            spec = plugins.load("roll.env", entry.type)
        except PluginError as exc:
            issues.append(ConfigIssue(f"{where}.type", str(exc), _did_you_mean(entry.type)))
            continue
        issues += _option_issues(spec, entry, where)
        issues += _tool_issues(entry, where)
        issues += _format_issues(entry, where)
    return issues


def _tool_issues(entry: EnvEntryConfig, where: str) -> list[ConfigIssue]:
    """Each of ``entry.tools``: an installed ``roll.tool`` plugin whose options validate against its model."""
    issues: list[ConfigIssue] = []
    for j, tool in enumerate(entry.tools):
        at = f"{where}.tools.{j}"
        try:
            spec = plugins.load("roll.tool", tool.type)
        except PluginError as exc:
            issues.append(ConfigIssue(f"{at}.type", str(exc)))
            continue
        if spec.config_model is None:
            if tool.options:
                issues.append(
                    ConfigIssue(f"{at}.options", f"tool {tool.type!r} takes no options", "remove them")
                )
            continue
        try:
            validate_data(dict(tool.options), spec.config_model)
        except ConfigError as exc:
            issues += [_prefixed(issue, f"{at}.options") for issue in exc.issues]
    return issues


def _format_issues(entry: EnvEntryConfig, where: str) -> list[ConfigIssue]:
    """The entry's ``tool_calls.format`` plugin loads (its name was checked against the installed ones when the
    config was read; loading also imports it)."""
    try:
        plugins.load("roll.tool_parser", entry.tool_calls.format)
    except PluginError as exc:
        return [ConfigIssue(f"{where}.tool_calls.format", str(exc))]
    return []


def env_preflight(config: Any) -> list[ConfigIssue]:
    """The agentic pipelines' ``preflight``: every role's model path, and the env mix of ``config.env_manager``."""
    from roll.pipelines.common.checks import model_issues

    return model_issues(config) + env_issues(config.env_manager.envs)


def _option_issues(spec: Any, entry: EnvEntryConfig, where: str) -> list[ConfigIssue]:
    model = spec.config_model
    if model is None:
        if not entry.options:
            return []
        message = f"env {entry.type!r} takes no options, got {sorted(entry.options)}"
        return [ConfigIssue(f"{where}.options", message, "remove them")]
    data = dict(entry.options)
    if "type" in model.model_fields and "type" not in data:
        data["type"] = entry.type  # the env configs' discriminator, as build_env fills it in
    try:
        validate_data(data, model)
    except ConfigError as exc:
        return [_prefixed(issue, f"{where}.options") for issue in exc.issues]
    return []


def _did_you_mean(name: str) -> str | None:
    close = difflib.get_close_matches(name, sorted(plugins.available("roll.env")), n=1)
    return f"did you mean {close[0]!r}?" if close else None


def _prefixed(issue: ConfigIssue, prefix: str) -> ConfigIssue:
    path = f"{prefix}.{issue.path}" if issue.path else prefix
    return ConfigIssue(path, issue.message, issue.hint)
