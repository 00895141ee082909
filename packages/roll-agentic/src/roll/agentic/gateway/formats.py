"""Tool calls in the model's text: how tools and past calls are shown to the model, and how its calls are read.

OpenAI's chat format carries tools as structure (``tools=[...]``, ``assistant.tool_calls``, ``role: tool``); a
policy sees text. The run's tool-call format (``gateway.tool_call_format``: a ``roll.tool_parser`` plugin, see
:mod:`roll.agentic.tool_parsers`; ``hermes`` by default) turns the structure into plain
``system``/``user``/``assistant`` messages for the chat template (:func:`render_messages`: the tools section in
the system prompt, past calls as the format writes them, tool results in a user turn) and reads the calls back out
of a sampled answer (:func:`parse_tool_calls_for`). Env tool turns use the same parsers, so a policy trained on
either sees one format.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.agentic.tool_parsers import get_tool_parser
from roll.agentic.types import ToolCall, ToolResponse
from roll.core.errors import DataError

__all__ = ["ParsedAnswer", "parse_tool_calls_for", "render_messages"]


@dataclass(frozen=True)
class ParsedAnswer:
    """A sampled answer as OpenAI returns it: ``content`` (the text without its calls; None when only calls)
    and ``tool_calls`` in the wire format (``arguments`` a JSON string). An answer with a malformed call is
    returned whole as ``content`` with no calls: the agent reads what the model wrote."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def parse_tool_calls_for(
    text: str, fmt: str = "hermes", tools: Sequence[Mapping[str, Any]] | None = None
) -> ParsedAnswer:
    """The tool calls of ``text`` in format ``fmt`` (for ``tools``, the request's schemas, or None)."""
    parsed = get_tool_parser(fmt, tools).parse(text)
    if not parsed.items or len(parsed.calls) != len(parsed.items):
        return ParsedAnswer(text, [])
    wire = [
        {
            "id": c.id or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in parsed.calls
    ]
    return ParsedAnswer(parsed.content or None, wire)


def render_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, fmt: str = "hermes"
) -> list[dict[str, str]]:
    """OpenAI chat ``messages`` (and ``tools``) as plain-text messages for a chat template."""
    parser = get_tool_parser(fmt, tools)
    out: list[dict[str, str]] = []
    pending: list[ToolResponse] = []  # consecutive tool results share one user turn
    for i, m in enumerate(messages):
        role = m.get("role")
        if role != "tool" and pending:
            out.append({"role": "user", "content": parser.render_responses(pending)})
            pending = []
        if role in ("system", "developer"):
            out.append({"role": "system", "content": _text(m, i)})
        elif role == "user":
            out.append({"role": "user", "content": _text(m, i)})
        elif role == "assistant":
            calls = parser.render(_calls(m, i)) if m.get("tool_calls") else ""
            text = "\n".join(t for t in (_text(m, i), calls) if t)
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            pending.append(ToolResponse(_text(m, i), m.get("name"), m.get("tool_call_id")))
        else:
            raise DataError(
                f"messages[{i}]: unknown role {role!r} (system, developer, user, assistant, tool)"
            )
    if pending:
        out.append({"role": "user", "content": parser.render_responses(pending)})
    if tools:
        block = parser.tools_prompt()
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _text(message: Mapping[str, Any], index: int) -> str:
    """A message's text: a string, or the text parts of a content list (images are not served)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise DataError(f"messages[{index}]: only text content parts are served")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise DataError(f"messages[{index}]: content must be a string or a list of text parts")


def _calls(message: Mapping[str, Any], index: int) -> list[ToolCall]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise DataError(f"messages[{index}].tool_calls: each needs function.name and function.arguments")
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise DataError(f"messages[{index}].tool_calls: arguments are not JSON") from None
        if not isinstance(parsed, dict):
            raise DataError(f"messages[{index}].tool_calls: arguments must be a JSON object")
        calls.append(ToolCall(function["name"], parsed, call.get("id")))
    return calls
