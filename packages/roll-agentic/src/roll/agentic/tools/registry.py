"""Find and build tools by name through the ``roll.tool`` entry-point group.

A :class:`~roll.core.types.ToolSpec`'s ``build(config)`` returns one :class:`~roll.agentic.types.Tool` or a list of
them (an MCP server offers several). :func:`build_tools` hides the difference, validates the config against the
spec's ``config_model`` and checks every result against the ``Tool`` protocol, naming the plugin when one fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from roll.agentic.types import Tool
from roll.core import plugins
from roll.core.errors import ConfigError, ConfigIssue, PluginError
from roll.core.types import ToolSpec

__all__ = ["build_tools", "load_tool_spec"]

GROUP = "roll.tool"


def load_tool_spec(name: str) -> ToolSpec:
    """The checked spec of tool ``name``. Unknown names raise :class:`PluginError` listing the installed ones."""
    spec: ToolSpec = plugins.load(GROUP, name)
    return spec


def build_tools(name: str, config: BaseModel | Mapping[str, Any] | None = None) -> list[Tool]:
    """Build the tool(s) of plugin ``name`` from ``config`` (a model, a mapping to validate, or None)."""
    spec = load_tool_spec(name)
    built = spec.build(_validated(spec, config))
    tools = list(built) if isinstance(built, Sequence) else [built]
    for tool in tools:
        if not isinstance(tool, Tool):
            raise PluginError(
                f"roll.tool plugin {name!r} built a {type(tool).__name__}, which is not a Tool "
                "(needs name, description, parameters, call and close)"
            )
    return tools


def _validated(spec: ToolSpec, config: BaseModel | Mapping[str, Any] | None) -> Any:
    if spec.config_model is None or isinstance(config, spec.config_model):
        return config
    try:
        return spec.config_model.model_validate(dict(config or {}))
    except ValidationError as exc:
        issues = [
            ConfigIssue(path=".".join(str(p) for p in err["loc"]), message=err["msg"]) for err in exc.errors()
        ]
        raise ConfigError(issues=issues) from None
