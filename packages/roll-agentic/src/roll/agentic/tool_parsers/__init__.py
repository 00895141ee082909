"""Tool-call formats: how tools are described to a model, how its calls are written and how they are read back.

A format is a ``roll.tool_parser`` plugin (:class:`~roll.core.types.ToolParserSpec`); its ``build(tools)`` returns
a :class:`~roll.agentic.types.ToolParser` for one set of tools. roll-agentic ships four:

=================  ==============================================================================================
``hermes``         ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen2.5/Qwen3, Hermes; the
                   default)
``qwen3_coder``    ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
``llama3_json``    ``{"name": ..., "parameters": {...}}``, possibly after ``<|python_tag|>`` (Llama 3.1/3.2)
``mistral``        ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abc123XYZ"}]``
=================  ==============================================================================================

The one entry point for code that reads calls (the env wrapper, a gateway)::

    parser = get_tool_parser("qwen3_coder", tools)   # tools: OpenAI function schemas, or None
    parsed = parser.parse(model_output)               # ParsedToolCalls: content, items (ToolCall | ToolCallError)
    calls = parsed.checked()                          # or raise the first ToolCallError

A config key that names a format validates it with :func:`installed_format` (a pydantic field validator).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.types import ToolParser
from roll.core import plugins
from roll.core.errors import PluginError
from roll.core.types import ToolParserSpec

__all__ = [
    "DEFAULT_FORMAT",
    "GROUP",
    "get_tool_parser",
    "installed_format",
    "load_tool_parser_spec",
    "tool_parser_names",
]

GROUP = "roll.tool_parser"
DEFAULT_FORMAT = "hermes"


def tool_parser_names() -> list[str]:
    """The installed formats' names, without importing them."""
    return sorted(plugins.available(GROUP))


def installed_format(name: str) -> str:
    """``name`` when a format of that name is installed, else ValueError listing the installed ones: the field
    validator of every config key that names a format (``tool_calls.format``, a gateway's), run at load time."""
    known = tool_parser_names()
    if name not in known:
        raise ValueError(f"no {GROUP} plugin named {name!r}; installed: {', '.join(known) or '(none)'}")
    return name


def load_tool_parser_spec(name: str) -> ToolParserSpec:
    """The checked spec of format ``name``. Unknown names raise :class:`PluginError` listing the installed ones."""
    spec: ToolParserSpec = plugins.load(GROUP, name)
    return spec


def get_tool_parser(
    name: str = DEFAULT_FORMAT, tools: Sequence[Mapping[str, Any]] | None = None
) -> ToolParser:
    """The parser of format ``name`` for ``tools`` (OpenAI function schemas; None: any function name, untyped)."""
    parser = load_tool_parser_spec(name).build(tools)
    if not isinstance(parser, ToolParser):
        raise PluginError(
            f"{GROUP} plugin {name!r} built a {type(parser).__name__}, which is not a ToolParser "
            "(needs name, tools_prompt, render, parse and render_responses)"
        )
    return parser
