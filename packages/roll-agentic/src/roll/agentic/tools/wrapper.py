"""Give an env tools: run the tool calls in the model's output, pass everything else to the env.

The tool-call *format* is a ``roll.tool_parser`` plugin (``tool_calls.format``; :mod:`roll.agentic.tool_parsers`):
it writes the tools section of the system prompt, finds the calls in a turn and writes the results back. The
default, ``hermes`` (Qwen's template), reads a turn whose output contains ``<tool_call>`` as a tool turn::

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*7"}}</tool_call>

Every call in it runs, in order, and the observation is one ``<tool_response>...</tool_response>`` per call. A
call the format cannot read (truncated, not valid JSON, an unknown tool, non-object arguments) is answered with
``format error: <why>`` in its response (``info["format_ok"] = False``) and counts against the limit; it never
raises. Past ``max_tool_calls`` per episode, further calls are refused in the response. Any other output is an
env action and goes unchanged to the wrapped env (whose own parser reads it).

Rewards: a tool turn earns ``tool_success_reward`` per successful call (0 by default: shaping the policy
toward tool use is opt-in), ``format_error_reward`` per malformed call. The wrapper's ``max_steps`` is the inner
env's plus ``max_tool_calls``, so tool turns cannot starve the env of its own steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, field_validator

from roll.agentic.tool_parsers import DEFAULT_FORMAT, GROUP, get_tool_parser, installed_format
from roll.agentic.types import (
    Env,
    EnvError,
    Frame,
    Observation,
    RenderMode,
    StepResult,
    Tool,
    ToolCall,
    ToolCallError,
    ToolResponse,
    ToolResult,
    tool_schema,
)
from roll.core.config.base import RollModel
from roll.core.errors import ConfigError

__all__ = ["ToolEnvWrapper", "ToolWrapperConfig"]


class ToolWrapperConfig(RollModel):
    format: str = Field(
        default=DEFAULT_FORMAT,
        min_length=1,
        description="roll.tool_parser plugin that writes the tools prompt and reads the calls: hermes, "
        "qwen3_coder, llama3_json, mistral, ...",
    )
    max_tool_calls: int = Field(default=4, ge=0, description="tool calls allowed per episode")
    tool_success_reward: float = Field(default=0.0, description="reward per successful tool call")
    format_error_reward: float = Field(
        default=0.0, le=0.0, description="reward (a penalty) per malformed call"
    )
    max_response_chars: int = Field(default=2000, ge=16, description="longer tool output is cut")

    _installed = field_validator("format")(installed_format)


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
        self.parser = get_tool_parser(self.config.format, [tool_schema(tool) for tool in tools])
        self.max_steps = env.max_steps + self.config.max_tool_calls
        self._calls_used = 0
        self._steps = 0
        self._done = False

    @property
    def system_prompt(self) -> str:
        note = f"You can make at most {self.config.max_tool_calls} calls per episode."
        return f"{self.env.system_prompt}\n\n{self.parser.tools_prompt(note)}"

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
        try:
            calls = self.parser.parse(action).items
        except (
            Exception
        ) as exc:  # a format plugin's bug (bad output is a ToolCallError item): the env step fails
            exc.add_note(f"in {GROUP} {self.parser.name!r}, parsing {action!r:.200}")
            raise
        result = self._tool_turn(calls) if calls else self.env.step(action)
        if not result.done and self._steps >= self.max_steps:
            result = StepResult(result.observation, result.reward, False, True, result.info)
        self._done = result.done
        return result

    def _tool_turn(self, calls: Sequence[ToolCall | ToolCallError]) -> StepResult:
        responses: list[ToolResponse] = []
        reward, ok_calls, format_ok = 0.0, 0, True
        for call in calls:
            outcome, well_formed = self._run(call)
            format_ok = format_ok and well_formed
            reward += 0.0 if well_formed else self.config.format_error_reward
            if outcome.ok:
                ok_calls += 1
                reward += self.config.tool_success_reward
            text = self._clip(outcome.text)
            if isinstance(call, ToolCall):
                responses.append(ToolResponse(text, call.name, call.id))
            else:
                responses.append(ToolResponse(text))
        info = {"tool_calls": len(calls), "tool_calls_ok": ok_calls, "format_ok": format_ok}
        return StepResult(self.parser.render_responses(responses), reward, False, False, info)

    def _run(self, call: ToolCall | ToolCallError) -> tuple[ToolResult, bool]:
        """The call's result and whether it was well formed (a known tool, readable arguments)."""
        if self._calls_used >= self.config.max_tool_calls:
            limit = self.config.max_tool_calls
            refused = f"error: tool-call limit reached ({limit} per episode); answer without tools"
            return ToolResult(refused, ok=False), isinstance(call, ToolCall)
        self._calls_used += 1
        if isinstance(call, ToolCallError):
            return ToolResult(f"format error: {call}", ok=False), False
        tool = self.tools.get(call.name)
        if tool is None:  # a format plugin that does not check names itself
            return ToolResult(
                f"format error: unknown tool {call.name!r}; available: {', '.join(self.tools)}", False
            ), False
        try:
            return tool.call(call.arguments), True
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
