"""What the built-in formats share: the tools they were built for, and reading a call given as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.types import ToolCall, ToolCallError

__all__ = ["Functions", "call_from_json", "dumps"]


def dumps(value: Any, indent: int | None = None) -> str:
    """JSON as chat templates write it (transformers' ``tojson``: non-ASCII kept, default separators)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


class Functions:
    """The tools a parser was built for, by name: their function schemas (``{"name", "description",
    "parameters"}``). Built from OpenAI tool schemas (``{"type": "function", "function": {...}}``) or bare function
    schemas; ``None`` means unknown, and then every name is accepted."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        self.known = tools is not None
        self.schemas: list[Mapping[str, Any]] = list(tools or [])
        self.by_name: dict[str, Mapping[str, Any]] = {}
        for tool in self.schemas:
            function = tool.get("function", tool)
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise ToolCallError(f"a tool schema needs a function name, got {dict(tool)!r:.200}")
            self.by_name[function["name"]] = function

    def unknown(self, name: str) -> ToolCallError | None:
        """The error for a call of ``name`` when no tool has that name (None when it is known or tools are not)."""
        if not self.known or name in self.by_name:
            return None
        return ToolCallError(f"unknown tool {name!r}; available: {', '.join(self.by_name)}")

    def property_type(self, function: str, parameter: str) -> Any:
        """The JSON-schema ``type`` of ``parameter`` of ``function`` (None when not declared)."""
        props = self.by_name.get(function, {}).get("parameters", {}).get("properties", {})
        spec = props.get(parameter) if isinstance(props, Mapping) else None
        return spec.get("type") if isinstance(spec, Mapping) else None


def call_from_json(
    data: Any, functions: Functions, *, args_key: str = "arguments"
) -> ToolCall | ToolCallError:
    """A call given as a JSON object ``{"name": ..., "<args_key>": {...}}`` (``arguments`` always accepted too;
    ``id`` kept when it is a string), or the error the model reads."""
    shape = f'{{"name": ..., "{args_key}": {{...}}}}'
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCallError(f"a tool call must be a JSON object {shape}")
    name: str = data["name"]
    arguments = data.get(args_key, data.get("arguments", {}))
    if isinstance(arguments, str):  # the OpenAI wire format sends arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCallError(f"{args_key!r} is a string that is not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCallError(f"{args_key!r} must be a JSON object")
    call_id = data.get("id")
    if call_id is not None and not isinstance(call_id, str):
        return ToolCallError(f"the call's 'id' must be a string, got {call_id!r}")
    return functions.unknown(name) or ToolCall(name, arguments, call_id)
