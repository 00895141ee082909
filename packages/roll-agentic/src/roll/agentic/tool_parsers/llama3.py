"""``llama3_json``: the JSON tool calls of Llama 3.1 and 3.2 chat templates.

The whole assistant turn is the call, ``{"name": NAME, "parameters": {...}}``, possibly after the
``<|python_tag|>`` token (which Llama also uses for its built-in tools). The template allows one call per turn; like
vLLM's ``llama3_json`` parser, several calls separated by ``;`` are read (and rendered) as well. ``arguments`` is
accepted in place of ``parameters``.

A turn is a call turn when it starts with ``{`` or contains ``<|python_tag|>``; any other text is an ordinary
answer. In a call turn, text that is not JSON (truncated, a trailing remark) is a
:class:`~roll.agentic.types.ToolCallError`: the template asks for the JSON alone. Tool results come back as the
``ipython`` role's plain text, one result per line block. Every JSON value round-trips.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.tool_parsers._common import Functions, call_from_json, dumps
from roll.agentic.types import ParsedToolCalls, ToolCall, ToolCallError, ToolResponse

__all__ = ["PYTHON_TAG", "Llama3JsonParser", "build"]

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_INSTRUCTIONS = (
    "You have access to the following functions. To call a function, please respond with JSON for a function "
    'call.Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables."
)


class Llama3JsonParser:
    name = "llama3_json"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.functions = Functions(tools)

    def tools_prompt(self, note: str = "") -> str:
        listing = "".join(f"{dumps(schema, indent=4)}\n\n" for schema in self.functions.schemas)
        note = f" {note}" if note else ""
        return f"{_INSTRUCTIONS}{note}\n\n{listing}".rstrip("\n")

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(f'{{"name": {dumps(c.name)}, "parameters": {dumps(c.arguments)}}}' for c in calls)

    def parse(self, text: str) -> ParsedToolCalls:
        stripped = text.lstrip()
        if stripped.startswith(PYTHON_TAG):
            content, body = "", stripped.removeprefix(PYTHON_TAG)
        elif stripped.startswith("{"):  # a tag inside the JSON's strings is text, not the start of a call
            content, body = "", stripped
        elif PYTHON_TAG in text:
            content, body = text.split(PYTHON_TAG, 1)
        else:
            return ParsedToolCalls(text.strip())
        return ParsedToolCalls(content.strip(), tuple(self._calls(body)))

    def _calls(self, body: str) -> list[ToolCall | ToolCallError]:
        items: list[ToolCall | ToolCallError] = []
        pos = _skip_space(body, 0)
        while True:
            try:
                data, pos = _DECODER.raw_decode(body, pos)
            except json.JSONDecodeError as exc:
                items.append(ToolCallError(f"tool call is not valid JSON ({exc.msg} at position {exc.pos})"))
                return items
            items.append(call_from_json(data, self.functions, args_key="parameters"))
            pos = _skip_space(body, pos)
            if pos == len(body):
                return items
            if body[pos] != ";":
                items.append(
                    ToolCallError(
                        f"unexpected text after the tool call: {body[pos : pos + 40]!r}; reply with the JSON only"
                    )
                )
                return items
            pos = _skip_space(body, pos + 1)

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        return "\n".join(r.text for r in responses)


def build(tools: Sequence[Mapping[str, Any]] | None) -> Llama3JsonParser:
    return Llama3JsonParser(tools)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
