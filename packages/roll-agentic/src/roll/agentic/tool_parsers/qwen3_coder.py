"""``qwen3_coder``: the XML-style calls of Qwen3-Coder (and Qwen3.5) chat templates.

A call is written::

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

with one ``<parameter=...>`` block per argument and one ``<tool_call>`` block per call (several per turn). A value
is raw text, not JSON: a string as it is (quotes, newlines and unicode need no escaping), an object or array as
JSON. Values are typed by the tool's JSON schema, as the model's own parser does: ``string`` stays text,
``integer``/``number``/``boolean`` must read as one, ``object``/``array`` as JSON, ``null`` is None for any
non-string type; a value whose type is not declared is read as JSON when it parses (``5``, ``true``, ``[1]``) and
as text otherwise. So ``parse(render(calls))`` gives the calls back when their tools' schemas are known; without
schemas, a string that reads as JSON (``"42"``) comes back as that JSON value.

Deviations from the template, both for round-trips: booleans and null render as JSON (``true``, ``null``; the
template writes Python's ``True``/``None``, which are read as well); a value containing ``</parameter>``,
``</function>`` or ``</tool_call>`` cannot be carried by this format, so ``render`` refuses it. Tool results come back as Hermes's
``<tool_response>`` blocks, as in the template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.tool_parsers._common import Functions, dumps
from roll.agentic.types import ParsedToolCalls, ToolCall, ToolCallError, ToolResponse

__all__ = ["Qwen3CoderParser", "build"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_OPEN = "<tool_call>"
_SHAPE = "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>"
_EXAMPLE = (
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>"
)
_REMINDERS = [
    "Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags",
    "Required parameters MUST be specified",
    "You may provide optional reasoning for your function call in natural language BEFORE the function call, but "
    "NOT after",
    "If there is no function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls",
]


class Qwen3CoderParser:
    name = "qwen3_coder"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.functions = Functions(tools)

    def tools_prompt(self, note: str = "") -> str:
        listing = "".join(_function_xml(f) for f in self.functions.by_name.values())
        reminders = "\n".join(f"- {line}" for line in [*_REMINDERS, *([note] if note else [])])
        return (
            f"# Tools\n\nYou have access to the following functions:\n\n<tools>{listing}\n</tools>\n\n"
            f"If you choose to call a function ONLY reply in the following format with NO suffix:\n\n{_EXAMPLE}\n\n"
            f"<IMPORTANT>\nReminder:\n{reminders}\n</IMPORTANT>"
        )

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(self._render_one(call) for call in calls)

    def _render_one(self, call: ToolCall) -> str:
        params = "".join(
            f"<parameter={k}>\n{_value_text(k, v)}\n</parameter>\n" for k, v in call.arguments.items()
        )
        return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"

    def parse(self, text: str) -> ParsedToolCalls:
        items = [self._one(body) for body in _CALL.findall(text)]
        content = _CALL.sub("", text)
        if _OPEN in content:
            items.append(ToolCallError(f"unclosed <tool_call> tag: write each call as {_SHAPE}"))
            content = content[: content.index(_OPEN)]
        return ParsedToolCalls(content.strip(), tuple(items))

    def _one(self, body: str) -> ToolCall | ToolCallError:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            return ToolCallError(f"a tool call needs one <function=NAME>...</function> block: {_SHAPE}")
        name, inner = match.group(1).strip(), match.group(2)
        unknown = self.functions.unknown(name)
        if unknown is not None:
            return unknown
        if _PARAMETER.sub("", inner).strip():
            return ToolCallError(
                f"tool call {name!r}: every argument must be a closed <parameter=ARG>\nVALUE\n</parameter> block, "
                "with nothing else inside <function=...>"
            )
        arguments: dict[str, Any] = {}
        for key, raw in _PARAMETER.findall(inner):
            key = key.strip()
            if key in arguments:
                return ToolCallError(f"tool call {name!r}: parameter {key!r} is given twice")
            value = self._value(name, key, _unwrap(raw))
            if isinstance(value, ToolCallError):
                return value
            arguments[key] = value
        return ToolCall(name, arguments)

    def _value(self, function: str, key: str, raw: str) -> Any:
        declared = self.functions.property_type(function, key)
        try:
            return _typed(raw, declared)
        except ValueError:
            return ToolCallError(
                f"tool call {function!r}: parameter {key!r} must be {declared}, got {raw[:80]!r}"
            )

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in responses)


def build(tools: Sequence[Mapping[str, Any]] | None) -> Qwen3CoderParser:
    return Qwen3CoderParser(tools)


def _value_text(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else dumps(value)
    for tag in ("</parameter>", "</function>", "</tool_call>"):
        if tag in text:
            raise ToolCallError(f"argument {key!r} contains {tag}, which the qwen3_coder format cannot carry")
    return text


def _unwrap(raw: str) -> str:
    """The value of a ``<parameter=..>`` block: its text minus the one newline after the tag and before the end."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


_PY_LITERALS = {"True": True, "False": False, "None": None}


def _typed(raw: str, declared: Any) -> Any:
    """``raw`` as the JSON-schema type ``declared`` says (see the module docstring); ValueError when it is not one."""
    if declared in ("string", "str", "text"):
        return raw
    stripped = raw.strip()
    if stripped in ("null", "None"):
        return None
    if declared in ("integer", "int"):
        return int(stripped)
    if declared == "boolean":
        if stripped.lower() not in ("true", "false"):
            raise ValueError(raw)
        return stripped.lower() == "true"
    if declared == "number":
        value = json.loads(stripped)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(raw)
        return value
    if declared in ("object", "array"):
        value = json.loads(stripped)
        if not isinstance(value, dict if declared == "object" else list):
            raise ValueError(raw)
        return value
    return _untyped(raw, stripped)


def _untyped(raw: str, stripped: str) -> Any:
    if stripped in _PY_LITERALS:
        return _PY_LITERALS[stripped]
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        return raw
    return raw if isinstance(value, str) else value


def _function_xml(function: Mapping[str, Any]) -> str:
    """One tool as the template lists it: ``<function><name>..</name><description>..</description><parameters>``
    with one ``<parameter>`` per property, then every other key as ``<key>value</key>``."""
    parts = [f"\n<function>\n<name>{function['name']}</name>"]
    if "description" in function:
        parts.append(f"\n<description>{str(function['description']).strip()}</description>")
    parts.append("\n<parameters>")
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    for pname, fields in (properties or {}).items():
        parts.append(f"\n<parameter>\n<name>{pname}</name>")
        if isinstance(fields, Mapping) and "type" in fields:
            parts.append(f"\n<type>{fields['type']}</type>")
        if isinstance(fields, Mapping) and "description" in fields:
            parts.append(f"\n<description>{str(fields['description']).strip()}</description>")
        parts.append(_extra_keys(fields, ("name", "type", "description")) + "\n</parameter>")
    parts.append(_extra_keys(parameters, ("type", "properties")) + "\n</parameters>")
    parts.append(_extra_keys(function, ("type", "name", "description", "parameters")) + "\n</function>")
    return "".join(parts)


def _extra_keys(mapping: Any, handled: tuple[str, ...]) -> str:
    if not isinstance(mapping, Mapping):
        return ""
    out = []
    for key, value in mapping.items():
        if key in handled:
            continue
        text = dumps(value) if isinstance(value, Mapping | list | tuple) else str(value)
        out.append(f"\n<{key}>{text}</{key}>")
    return "".join(out)
