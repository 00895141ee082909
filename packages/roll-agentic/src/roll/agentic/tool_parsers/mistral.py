"""``mistral``: the ``[TOOL_CALLS]`` JSON list of Mistral chat templates (v3 tokenizers and later).

An assistant turn's calls are one JSON list after the ``[TOOL_CALLS]`` token::

    [TOOL_CALLS][{"name": NAME, "arguments": {...}, "id": "a1B2c3D4e"}, ...]

Newer templates require each call to carry a 9-character alphanumeric ``id`` (tool results refer to it), older
ones have none: ``render`` writes the id a :class:`~roll.agentic.types.ToolCall` carries, ``parse`` keeps one when
present. A single object instead of a list is read as one call. Tools are listed as
``[AVAILABLE_TOOLS] [...schemas...][/AVAILABLE_TOOLS]``; results come back as
``[TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]``. Text after the list, other than whitespace
and the ``</s>`` end token, is a :class:`~roll.agentic.types.ToolCallError`. Every JSON value round-trips. The
``[TOOL_CALLS]NAME[ARGS]{...}`` form of the v11 tokenizers (Mistral Small 3.2, Magistral; ``[CALL_ID]ID`` before
``[ARGS]`` in some) is read too, one call per ``[TOOL_CALLS]``; ``render`` writes the list form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.tool_parsers._common import Functions, call_from_json, dumps
from roll.agentic.types import ParsedToolCalls, ToolCall, ToolCallError, ToolResponse

__all__ = ["TOOL_CALLS", "MistralParser", "build"]

TOOL_CALLS = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()
_EOS = "</s>"
_NAMED = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")


class MistralParser:
    name = "mistral"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.functions = Functions(tools)

    def tools_prompt(self, note: str = "") -> str:
        listing = f"[AVAILABLE_TOOLS] {dumps(self.functions.schemas)}[/AVAILABLE_TOOLS]"
        return f"{listing}\n{note}" if note else listing

    def render(self, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return ""
        return TOOL_CALLS + dumps([_call_json(call) for call in calls])

    def parse(self, text: str) -> ParsedToolCalls:
        at = text.find(TOOL_CALLS)
        if at < 0:
            return ParsedToolCalls(text.strip())
        items: list[ToolCall | ToolCallError] = []
        pos = at
        while True:  # each [TOOL_CALLS] list; a marker inside a JSON string is text, read by the decoder
            found, pos = self._calls(text, pos + len(TOOL_CALLS))
            items += found
            rest = text[pos:].strip().removesuffix(_EOS).strip()
            if not rest:
                break
            if not rest.startswith(TOOL_CALLS):
                items.append(ToolCallError(f"unexpected text after the [TOOL_CALLS] list: {rest[:40]!r}"))
                break
            pos = text.index(TOOL_CALLS, pos)
        return ParsedToolCalls(text[:at].strip(), tuple(items))

    def _calls(self, text: str, pos: int) -> tuple[list[ToolCall | ToolCallError], int]:
        """The calls of the list starting at ``pos`` and where it ends (the text's end when it is not JSON)."""
        start = len(text) - len(text[pos:].lstrip())
        named = _NAMED.match(text, start)
        if named is not None:  # the v11 form: NAME[ARGS]{...}, maybe NAME[CALL_ID]ID[ARGS]{...}
            return self._named_call(text, named)
        try:
            data, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            error = f"the [TOOL_CALLS] list is not valid JSON ({exc.msg} at position {exc.pos - start})"
            return [ToolCallError(error)], len(text)
        calls = data if isinstance(data, list) else [data]
        if not calls:
            return [ToolCallError("the [TOOL_CALLS] list is empty")], end
        return [call_from_json(one, self.functions) for one in calls], end

    def _named_call(self, text: str, named: re.Match[str]) -> tuple[list[ToolCall | ToolCallError], int]:
        name, call_id = named.group(1), named.group(2)
        try:
            arguments, end = _DECODER.raw_decode(text, named.end())
        except json.JSONDecodeError as exc:
            error = (
                f"the [ARGS] of {name!r} are not valid JSON ({exc.msg} at position {exc.pos - named.end()})"
            )
            return [ToolCallError(error)], len(text)
        data = {"name": name, "arguments": arguments, **({"id": call_id} if call_id else {})}
        return [call_from_json(data, self.functions)], end

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        return "\n".join(_result(r) for r in responses)


def build(tools: Sequence[Mapping[str, Any]] | None) -> MistralParser:
    return MistralParser(tools)


def _call_json(call: ToolCall) -> dict[str, Any]:
    data: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
    if call.id is not None:
        data["id"] = call.id
    return data


def _result(response: ToolResponse) -> str:
    data: dict[str, Any] = {"content": response.text}
    if response.call_id is not None:
        data["call_id"] = response.call_id
    return f"[TOOL_RESULTS] {dumps(data)}[/TOOL_RESULTS]"
