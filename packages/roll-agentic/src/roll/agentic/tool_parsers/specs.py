"""The :class:`~roll.core.types.ToolParserSpec` objects that roll-agentic registers in the ``roll.tool_parser``
group: ``hermes``, ``qwen3_coder``, ``llama3_json``, ``mistral``. Pure Python; nothing heavy is imported."""

from __future__ import annotations

from roll.agentic.tool_parsers import hermes, llama3, mistral, qwen3_coder
from roll.core.types import ToolParserSpec

__all__ = ["HERMES", "LLAMA3_JSON", "MISTRAL", "QWEN3_CODER"]

HERMES = ToolParserSpec(
    name="hermes",
    build=hermes.build,
    description='`<tool_call>{"name", "arguments"}</tool_call>`: JSON in tags (Qwen2.5/Qwen3, Hermes; the default)',
)
QWEN3_CODER = ToolParserSpec(
    name="qwen3_coder",
    build=qwen3_coder.build,
    description="`<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>`: XML-style, "
    "raw values typed by the tool's schema (Qwen3-Coder)",
)
LLAMA3_JSON = ToolParserSpec(
    name="llama3_json",
    build=llama3.build,
    description='`{"name", "parameters"}`: the whole turn is JSON, possibly after the python_tag token (Llama 3.1/3.2)',
)
MISTRAL = ToolParserSpec(
    name="mistral",
    build=mistral.build,
    description='`[TOOL_CALLS][{"name", "arguments", "id"}]`: a JSON list after the token (Mistral v3+ templates)',
)
