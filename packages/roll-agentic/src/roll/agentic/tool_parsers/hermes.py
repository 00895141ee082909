"""``hermes``: JSON inside ``<tool_call>`` tags, the format of Qwen2.5/Qwen3 and Hermes chat templates (the default).

An assistant turn writes each call as ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``, one per
line, after any text; results come back as one ``<tool_response>\\n...\\n</tool_response>`` per call. Any text may
surround the calls (it is the message's content). A string holding ``</`` is written ``<\\/`` (the same JSON
string), so a value holding ``</tool_call>`` cannot end its block. A block that is not JSON, not ``{"name", "arguments"}``, names an
unknown tool or is never closed is a :class:`~roll.agentic.types.ToolCallError`. ``arguments`` given as a JSON
string (the OpenAI wire format) is read too. Every JSON value round-trips.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.tool_parsers._common import Functions, call_from_json, dumps
from roll.agentic.types import ParsedToolCalls, ToolCall, ToolCallError, ToolResponse

__all__ = ["HermesParser", "build"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


class HermesParser:
    name = "hermes"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.functions = Functions(tools)

    def tools_prompt(self, note: str = "") -> str:
        schemas = "\n".join(json.dumps(schema) for schema in self.functions.schemas)
        note = f" {note}" if note else ""
        return (
            f"# Tools\n\nYou may call one or more functions to assist with the task.{note}\n"
            f"Function signatures are within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
            "For each function call, return a JSON object with the function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>"
        )

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f'<tool_call>\n{{"name": {_json(c.name)}, "arguments": {_json(c.arguments)}}}\n</tool_call>'
            for c in calls
        )

    def parse(self, text: str) -> ParsedToolCalls:
        items = [self._one(body) for body in _CALL.findall(text)]
        content = _CALL.sub("", text)
        if _OPEN in content:
            items.append(ToolCallError("unclosed <tool_call> tag: end each call with </tool_call>"))
            content = content[: content.index(_OPEN)]
        return ParsedToolCalls(content.strip(), tuple(items))

    def _one(self, body: str) -> ToolCall | ToolCallError:
        try:
            data = json.loads(body.strip())
        except json.JSONDecodeError as exc:
            return ToolCallError(f"tool call is not valid JSON ({exc.msg} at position {exc.pos})")
        return call_from_json(data, self.functions)

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in responses)


def _json(value: Any) -> str:
    """JSON as the template writes it, with ``</`` (only ever inside a string) written ``<\\/``, its JSON escape, so a
    value holding ``</tool_call>`` cannot end the block early."""
    return dumps(value).replace("</", "<\\/")


def build(tools: Sequence[Mapping[str, Any]] | None) -> HermesParser:
    return HermesParser(tools)
