"""Give an env tools: run the tool calls in the model's output, pass everything else to the env.

A turn whose output contains ``<tool_call>`` is a tool turn (Qwen/Hermes format)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*7"}}</tool_call>

Every call in it runs, in order, and the observation is one ``<tool_response>...</tool_response>`` per call. A
call that is not valid JSON, names no known tool or has non-object arguments is answered with a format error in
its ``<tool_response>`` (``info["format_ok"] = False``) and counts against the limit; it never raises. Past
``max_tool_calls`` per episode, further calls are refused in the response. Any other output is an env action and
goes unchanged to the wrapped env (whose own parser reads it).

Rewards: a tool turn earns ``tool_success_reward`` per successful call (0 by default: shaping the policy
toward tool use is opt-in), ``format_error_reward`` per malformed call. The wrapper's ``max_steps`` is the inner
env's plus ``max_tool_calls``, so tool turns cannot starve the env of its own steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from roll.agentic.types import (
    Env,
    EnvError,
    Frame,
    Observation,
    RenderMode,
    StepResult,
    Tool,
    ToolResult,
    tool_schema,
)
from roll.core.config.base import RollModel
from roll.core.errors import ConfigError

__all__ = ["ToolCall", "ToolEnvWrapper", "ToolWrapperConfig", "parse_tool_calls"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolWrapperConfig(RollModel):
    max_tool_calls: int = Field(default=4, ge=0, description="tool calls allowed per episode")
    tool_success_reward: float = Field(default=0.0, description="reward per successful tool call")
    format_error_reward: float = Field(
        default=0.0, le=0.0, description="reward (a penalty) per malformed call"
    )
    max_response_chars: int = Field(default=2000, ge=16, description="longer tool output is cut")


@dataclass
class ToolCall:
    """One parsed call: ``name`` and ``arguments`` when well formed, else ``error`` says what was wrong."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text``; an unclosed block is one malformed call."""
    calls = [_parse_one(body) for body in _CALL.findall(text)]
    tail = _CALL.sub("", text)
    if "<tool_call>" in tail:
        calls.append(ToolCall(error="unclosed <tool_call> tag: end each call with </tool_call>"))
    return calls


def _parse_one(body: str) -> ToolCall:
    try:
        data = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ToolCall(error=f"tool call is not valid JSON ({exc.msg} at position {exc.pos})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI wire format sends arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(name=data["name"], error="'arguments' is a string that is not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCall(name=data["name"], error="'arguments' must be a JSON object")
    return ToolCall(name=data["name"], arguments=arguments)


class ToolEnvWrapper:
    """An :class:`~roll.agentic.types.Env` that adds ``tools`` to ``env``. Owns the tools: ``close`` closes them."""

    def __init__(self, env: Env, tools: Sequence[Tool], config: ToolWrapperConfig | None = None) -> None:
        self.env = env
        self.config = config or ToolWrapperConfig()
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            names = [tool.name for tool in tools]
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(
                f"tool names must be unique; {dupes} appear more than once (set a name or prefix)"
            )
        self.max_steps = env.max_steps + self.config.max_tool_calls
        self._calls_used = 0
        self._steps = 0
        self._done = False

    @property
    def system_prompt(self) -> str:
        schemas = "\n".join(json.dumps(tool_schema(tool)) for tool in self.tools.values())
        return (
            f"{self.env.system_prompt}\n\n# Tools\n\nYou may call one or more functions to assist with the task. "
            f"You can make at most {self.config.max_tool_calls} calls per episode.\n"
            f"Function signatures are within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
            "For each function call, return a JSON object with the function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>"
        )

    @property
    def action_space_text(self) -> str:
        return f"{self.env.action_space_text}; or call a tool: {', '.join(self.tools)}"

    @property
    def calls_used(self) -> int:
        return self._calls_used

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        self._calls_used = 0
        self._steps = 0
        self._done = False
        return self.env.reset(seed)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() called on a finished episode; call reset() first")
        self._steps += 1
        calls = parse_tool_calls(action)
        result = self._tool_turn(calls) if calls else self.env.step(action)
        if not result.done and self._steps >= self.max_steps:
            result = StepResult(result.observation, result.reward, False, True, result.info)
        self._done = result.done
        return result

    def _tool_turn(self, calls: list[ToolCall]) -> StepResult:
        responses: list[str] = []
        reward, ok_calls, format_ok = 0.0, 0, True
        for call in calls:
            outcome = self._run(call)
            format_ok = format_ok and call.error is None
            reward += self.config.format_error_reward if call.error else 0.0
            if outcome.ok:
                ok_calls += 1
                reward += self.config.tool_success_reward
            responses.append(f"<tool_response>\n{self._clip(outcome.text)}\n</tool_response>")
        info = {"tool_calls": len(calls), "tool_calls_ok": ok_calls, "format_ok": format_ok}
        return StepResult("\n".join(responses), reward, False, False, info)

    def _run(self, call: ToolCall) -> ToolResult:
        if self._calls_used >= self.config.max_tool_calls:
            limit = self.config.max_tool_calls
            return ToolResult(
                f"error: tool-call limit reached ({limit} per episode); answer without tools", ok=False
            )
        self._calls_used += 1
        if call.error is not None:
            return ToolResult(f"format error: {call.error}", ok=False)
        tool = self.tools.get(call.name)
        if tool is None:
            call.error = f"unknown tool {call.name!r}"
            return ToolResult(
                f"format error: unknown tool {call.name!r}; available: {', '.join(self.tools)}", False
            )
        try:
            return tool.call(call.arguments)
        except (
            Exception
        ) as exc:  # a tool's bug (errors inside a call come back as ToolResult): the env step fails
            exc.add_note(f"in roll.tool {call.name!r}, called with arguments {call.arguments!r:.200}")
            raise

    def _clip(self, text: str) -> str:
        cap = self.config.max_response_chars
        return text if len(text) <= cap else text[:cap] + f"\n... [truncated {len(text) - cap} characters]"

    def render(self, mode: RenderMode = "text") -> Frame:
        return self.env.render(mode)

    def close(self) -> None:
        for tool in self.tools.values():
            tool.close()
        self.env.close()
