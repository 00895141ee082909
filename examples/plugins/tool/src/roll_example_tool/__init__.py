"""``lookup``: a tool that answers the value of a key from a table given in the run's config.

The model calls it as ``<tool_call>{"name": "lookup", "arguments": {"key": "north"}}</tool_call>`` and reads the
value in a ``<tool_response>``. A key not in the table is the model's mistake, not a bug: it comes back as
``ToolResult(text, ok=False)`` naming the known keys, for the model to read and recover from; ``call`` never raises
for bad arguments.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from roll.agentic.types import ToolResult
from roll.core.config.base import RollModel
from roll.core.types import ToolSpec


class LookupConfig(RollModel):
    """The options of ``{type: lookup}`` (strict: an unknown option is a config error)."""

    table: dict[str, str] = Field(min_length=1, description="key -> value the tool answers")
    case_sensitive: bool = False
    name: str = Field("lookup", pattern=r"^[a-z_][a-z0-9_]*$", description="the name the model calls")


class LookupTool:
    """roll.agentic.types.Tool: name, description, JSON-schema parameters, call and close."""

    def __init__(self, config: LookupConfig) -> None:
        self.config = config
        self.table = {self._key(k): v for k, v in config.table.items()}

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def description(self) -> str:
        return "Look up the value of a key. Known keys: " + ", ".join(self.config.table)

    @property
    def parameters(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "the key to look up"}},
            "required": ["key"],
        }

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        key = arguments.get("key")
        if not isinstance(key, str):
            return ToolResult('error: pass {"key": "<a string>"}', ok=False)
        value = self.table.get(self._key(key))
        if value is None:
            return ToolResult(
                f"error: no entry {key!r}; known keys: {', '.join(self.config.table)}", ok=False
            )
        return ToolResult(value)

    def close(self) -> None:
        return None  # nothing held; a tool with a server process stops it here

    def _key(self, key: str) -> str:
        return key if self.config.case_sensitive else key.casefold()


def build(config: LookupConfig) -> LookupTool:
    """roll.core.types.ToolBuild: called once per env slot that lists the tool, inside an env worker."""
    return LookupTool(config)


SPEC = ToolSpec(name="lookup", build=build, config_model=LookupConfig, description="a key -> value table")
