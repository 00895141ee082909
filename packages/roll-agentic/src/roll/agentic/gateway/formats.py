"""Tool calls in the model's text: how tools and past calls are shown to the model, and how its calls are read.

OpenAI's chat format carries tools as structure (``tools=[...]``, ``assistant.tool_calls``, ``role: tool``); a
policy sees text. A format turns the structure into plain ``system``/``user``/``assistant`` messages for the chat
template (:func:`render_messages`) and reads the calls back out of a sampled answer (:func:`parse_tool_calls_for`).

``hermes`` (Qwen2.5, Hermes): tools as JSON lines inside ``<tools></tools>`` in the system prompt, calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, results as ``<tool_response>...</tool_response>`` in a
user turn. Parsing is roll's own (:func:`roll.agentic.tools.wrapper.parse_tool_calls`), the same that env tool
turns use, so a policy trained on either sees one format.

:func:`parse_tool_calls_for` is the one place the gateway reads calls, so another format plugs in there.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.agentic.gateway.config import ToolCallFormat
from roll.agentic.tools.wrapper import parse_tool_calls
from roll.core.errors import DataError

__all__ = ["ParsedAnswer", "parse_tool_calls_for", "render_messages"]

_CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)

TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n"
    "Function signatures are within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
    "For each function call, return a JSON object with the function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": '
    "<args-json-object>}}\n</tool_call>"
)


@dataclass(frozen=True)
class ParsedAnswer:
    """A sampled answer as OpenAI returns it: ``content`` (the text without its calls; None when only calls)
    and ``tool_calls`` in the wire format (``arguments`` a JSON string). Malformed calls stay in ``content``."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def parse_tool_calls_for(text: str, fmt: ToolCallFormat = "hermes") -> ParsedAnswer:
    """The tool calls of ``text`` in format ``fmt`` (see the module docstring)."""
    if fmt != "hermes":
        raise DataError(f"unknown tool-call format {fmt!r}; known: hermes")
    calls = parse_tool_calls(text)
    if not calls or any(c.error is not None for c in calls):
        return ParsedAnswer(text, [])  # a malformed call is text the agent can read, not a call
    wire = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
    rest = _CALL_BLOCK.sub("", text).strip()
    return ParsedAnswer(rest or None, wire)


def render_messages(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    fmt: ToolCallFormat = "hermes",
) -> list[dict[str, str]]:
    """OpenAI chat ``messages`` (and ``tools``) as plain-text messages for a chat template."""
    if fmt != "hermes":
        raise DataError(f"unknown tool-call format {fmt!r}; known: hermes")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in ("system", "developer"):
            out.append({"role": "system", "content": _text(m, i)})
        elif role == "user":
            out.append({"role": "user", "content": _text(m, i)})
        elif role == "assistant":
            out.append({"role": "assistant", "content": _assistant_text(m, i)})
        elif role == "tool":
            _add_tool_result(out, _text(m, i))
        else:
            raise DataError(
                f"messages[{i}]: unknown role {role!r} (system, developer, user, assistant, tool)"
            )
    if tools:
        schemas = "\n".join(json.dumps(dict(t), separators=(", ", ": ")) for t in tools)
        block = TOOLS_PROMPT.format(schemas=schemas)
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


def _assistant_text(message: Mapping[str, Any], index: int) -> str:
    text = _text(message, index)
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = arguments
        body = json.dumps({"name": function.get("name", ""), "arguments": parsed})
        text += f"\n<tool_call>\n{body}\n</tool_call>" if text else f"<tool_call>\n{body}\n</tool_call>"
    return text


def _add_tool_result(out: list[dict[str, str]], content: str) -> None:
    """Tool results go in a user turn; consecutive results share one (as Qwen's template does)."""
    block = f"<tool_response>\n{content}\n</tool_response>"
    last = out[-1] if out else None
    if last is not None and last["role"] == "user" and last["content"].startswith("<tool_response>"):
        out[-1] = {"role": "user", "content": f"{last['content']}\n{block}"}
    else:
        out.append({"role": "user", "content": block})
