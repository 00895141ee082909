"""``pythonic``: tool calls written as a Python list of calls, the style of Llama 3.2's and Llama 4's pythonic
templates::

    [calculator(expression="6*7"), lookup(key='north', exact=True)]

A turn is a call turn when it starts with ``[`` and holds a ``(``; anything else is an ordinary answer. Arguments
are keyword arguments with Python literal values (strings, numbers, True/False/None, lists, dicts); ``repr`` writes
them and ``ast.literal_eval`` reads them back, so every JSON value round-trips. A call turn that is not such a list
is a ``ToolCallError``: the parser returns it, and the env answers the model with its message.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.types import ParsedToolCalls, ToolCall, ToolCallError, ToolResponse
from roll.core.types import ToolParserSpec


class PythonicParser:
    """roll.agentic.types.ToolParser: name, tools_prompt, render, parse and render_responses."""

    name = "pythonic"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        self.schemas = [dict(tool.get("function", tool)) for tool in tools or []]
        self.known = None if tools is None else {schema["name"] for schema in self.schemas}

    def tools_prompt(self, note: str = "") -> str:
        listing = "\n".join(json.dumps(schema) for schema in self.schemas)
        return (
            "You can call these functions:\n"
            + listing
            + "\n\nTo call them, reply with only a Python list of "
            'calls with keyword arguments: [func_name(param="value"), other(n=1)].'
            + (f" {note}" if note else "")
        )

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "[" + ", ".join(_call_text(call) for call in calls) + "]"

    def parse(self, text: str) -> ParsedToolCalls:
        stripped = text.strip()
        if not (stripped.startswith("[") and "(" in stripped):
            return ParsedToolCalls(stripped)  # an ordinary answer
        try:
            tree = ast.parse(stripped, mode="eval").body
        except SyntaxError as exc:
            return ParsedToolCalls("", (ToolCallError(f"tool calls are not a Python list: {exc.msg}"),))
        if not isinstance(tree, ast.List):
            return ParsedToolCalls("", (ToolCallError("write the calls as one Python list: [f(a=1)]"),))
        return ParsedToolCalls("", tuple(self._call(node) for node in tree.elts))

    def _call(self, node: ast.expr) -> ToolCall | ToolCallError:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return ToolCallError("each item must be a call with keyword arguments: name(key=value)")
        name = node.func.id
        if self.known is not None and name not in self.known:
            return ToolCallError(f"unknown tool {name!r}; available: {', '.join(sorted(self.known))}")
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        except ValueError:
            return ToolCallError(f"tool call {name!r}: argument values must be Python literals")
        return ToolCall(name, arguments)

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        return "\n".join(f"[{r.name or 'tool'}] {r.text}" for r in responses)


def _call_text(call: ToolCall) -> str:
    return f"{call.name}(" + ", ".join(f"{key}={value!r}" for key, value in call.arguments.items()) + ")"


def build(tools: Sequence[Mapping[str, Any]] | None) -> PythonicParser:
    """roll.core.types.ToolParserBuild: called once per env slot with tools (inside an env worker)."""
    return PythonicParser(tools)


SPEC = ToolParserSpec(name="pythonic", build=build, description="[name(key=value), ...]: Python call syntax")
