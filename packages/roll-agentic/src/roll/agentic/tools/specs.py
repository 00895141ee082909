"""The :class:`~roll.core.types.ToolSpec` objects that roll-agentic registers in the ``roll.tool`` group.

The lead wires them as entry points: ``calculator``, ``python``, ``mcp``, ``bash``. Builds import nothing heavy; ``mcp``
imports the ``mcp`` package only when it builds (and starts the server then).
"""

from __future__ import annotations

from roll.agentic.tools.bash import BashTool, BashToolConfig
from roll.agentic.tools.calculator import CalculatorConfig, CalculatorTool
from roll.agentic.tools.mcp_client import McpServerConfig, McpTool, build_mcp_tools
from roll.agentic.tools.python_exec import PythonTool, PythonToolConfig
from roll.core.types import ToolSpec

__all__ = ["BASH", "CALCULATOR", "MCP", "PYTHON"]


def _calculator(config: CalculatorConfig | None = None) -> CalculatorTool:
    return CalculatorTool(config)


def _python(config: PythonToolConfig | None = None) -> PythonTool:
    return PythonTool(config)


def _bash(config: BashToolConfig | None = None) -> BashTool:
    return BashTool(config)


def _mcp(config: McpServerConfig) -> list[McpTool]:
    return build_mcp_tools(config)


CALCULATOR = ToolSpec(
    name="calculator",
    build=_calculator,
    config_model=CalculatorConfig,
    description="safe arithmetic over Python's AST",
)
PYTHON = ToolSpec(
    name="python",
    build=_python,
    config_model=PythonToolConfig,
    description="runs Python code in a resource-limited subprocess",
)
MCP = ToolSpec(
    name="mcp",
    build=_mcp,
    config_model=McpServerConfig,
    description="the tools of an MCP server started over stdio",
)
BASH = ToolSpec(
    name="bash",
    build=_bash,
    config_model=BashToolConfig,
    description="bash commands in a private jailed scratch dir that lives as long as the tool",
)
