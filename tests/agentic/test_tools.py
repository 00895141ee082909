"""Tools: calculator, python sandbox, MCP over stdio against a local server, the env wrapper and the registry."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.envs.learnable import GuessDirectionConfig, GuessDirectionEnv
from roll.agentic.tool_parsers import get_tool_parser
from roll.agentic.tools import registry
from roll.agentic.tools.calculator import CalculatorTool, evaluate
from roll.agentic.tools.mcp_client import McpServerConfig, McpTool, build_mcp_tools
from roll.agentic.tools.python_exec import PythonTool, PythonToolConfig
from roll.agentic.tools.specs import CALCULATOR, MCP, PYTHON
from roll.agentic.tools.wrapper import ToolEnvWrapper, ToolWrapperConfig
from roll.agentic.types import Env, EnvError, Tool, ToolError, ToolResult
from roll.core import plugins
from roll.core.errors import ConfigError, PluginError
from roll.pipelines.rewards.config import SandboxConfig

# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("(3 + 5) * 2", "16"),
        ("1/3*3", "1"),
        ("7 / 2", "3.5"),
        ("2 ** 10", "1024"),
        ("sqrt(16) + abs(-1)", "5"),
    ],
)
def test_calculator_values(expr: str, text: str) -> None:
    assert CalculatorTool().call({"expression": expr}) == ToolResult(text, ok=True)


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('echo hi')",
        "x + 1",
        "1 / 0",
        "9 ** 9 ** 9",
        "(1).real",
        "'a' * 3",
        "open('f')",
        "1 +",
    ],
)
def test_calculator_refuses(expr: str) -> None:
    result = CalculatorTool().call({"expression": expr})
    assert not result.ok and result.text.startswith("error:")


def test_calculator_is_a_tool() -> None:
    tool = CalculatorTool()
    assert isinstance(tool, Tool)
    assert not tool.call({}).ok
    assert evaluate("10 // 3 + 10 % 3") == 4


# ---------------------------------------------------------------- python


def test_python_tool_runs_code() -> None:
    tool = PythonTool()
    assert isinstance(tool, Tool)
    assert tool.call({"code": "print(sum(range(10)))"}) == ToolResult("45", ok=True)
    failed = tool.call({"code": "raise SystemExit(3)"})
    assert not failed.ok and "exit code 3" in failed.text
    crashed = tool.call({"code": "1/0"})
    assert not crashed.ok and "ZeroDivisionError" in crashed.text
    assert not tool.call({"code": ""}).ok


def test_python_tool_limits() -> None:
    sandbox = SandboxConfig(wall_timeout_s=1.0, cpu_time_s=1, memory_mb=256)
    slow = PythonTool(PythonToolConfig(sandbox=sandbox)).call({"code": "while True: pass"})
    assert not slow.ok and "timed out" in slow.text
    # the other limits get a generous wall clock: a loaded CI box must not turn them into timeouts
    sandbox = SandboxConfig(wall_timeout_s=60.0, cpu_time_s=5, memory_mb=256)
    tool = PythonTool(PythonToolConfig(sandbox=sandbox, max_output_chars=50))
    hungry = tool.call({"code": "x = bytearray(1024 ** 3)"})
    assert not hungry.ok and "MemoryError" in hungry.text
    loud = tool.call({"code": "print('x' * 1000)"})
    assert loud.ok and "characters cut" in loud.text and len(loud.text) < 120


# ---------------------------------------------------------------- mcp

SERVER = textwrap.dedent(
    '''
    try:  # mcp 2.x renamed FastMCP to MCPServer
        from mcp.server.mcpserver import MCPServer as FastMCP
    except ImportError:
        from mcp.server.fastmcp import FastMCP

    app = FastMCP("tiny")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @app.tool()
    def explode(reason: str) -> str:
        """Always fails."""
        raise ValueError(reason)

    if __name__ == "__main__":
        app.run()
    '''
)


@pytest.fixture(scope="module")
def mcp_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[McpTool]]:
    script = tmp_path_factory.mktemp("mcp") / "server.py"
    script.write_text(SERVER)
    tools = build_mcp_tools(McpServerConfig(command=sys.executable, args=(str(script),), prefix="m_"))
    yield tools
    for tool in tools:
        tool.close()


def test_mcp_lists_and_calls(mcp_tools: list[McpTool]) -> None:
    by_name = {tool.name: tool for tool in mcp_tools}
    assert set(by_name) == {"m_add", "m_explode"}
    add = by_name["m_add"]
    assert isinstance(add, Tool)
    assert add.description == "Add two integers."
    assert set(add.parameters["properties"]) == {"a", "b"}
    assert add.call({"a": 2, "b": 40}) == ToolResult("42", ok=True)
    assert not by_name["m_explode"].call({"reason": "boom"}).ok
    assert not add.call({"a": "not a number"}).ok


def test_mcp_in_wrapper(mcp_tools: list[McpTool]) -> None:
    env = ToolEnvWrapper(GuessDirectionEnv(), mcp_tools)
    env.reset(seed=0)
    out = env.step('<tool_call>{"name": "m_add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert out.observation == "<tool_response>\n3\n</tool_response>"


def test_mcp_bad_server_raises(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import sys; sys.stderr.write('no mcp here'); sys.exit(1)")
    with pytest.raises(ToolError, match="no mcp here"):
        build_mcp_tools(McpServerConfig(command=sys.executable, args=(str(broken),), startup_timeout_s=20))


# ---------------------------------------------------------------- wrapper


class Echo:
    """A tool that records its calls and closes."""

    name = "echo"
    description = "echo the text"
    parameters: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}  # noqa: RUF012

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append(arguments)
        return ToolResult(str(arguments.get("text", "")))

    def close(self) -> None:
        self.closed = True


def call(name: str = "echo", args: str = '{"text": "hi"}') -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def wrapped(**kw: Any) -> tuple[ToolEnvWrapper, Echo]:
    echo = Echo()
    env = ToolEnvWrapper(
        GuessDirectionEnv(GuessDirectionConfig(max_steps=1)), [echo], ToolWrapperConfig(**kw)
    )
    env.reset(seed=0)
    return env, echo


def test_wrapper_runs_calls_and_passes_actions() -> None:
    env, echo = wrapped(tool_success_reward=0.1)
    assert isinstance(env, Env)
    out = env.step("thinking... " + call() + call(args='{"text": "yo"}'))
    assert out.observation == "<tool_response>\nhi\n</tool_response>\n<tool_response>\nyo\n</tool_response>"
    assert out.reward == pytest.approx(0.2) and not out.done
    assert out.info == {"tool_calls": 2, "tool_calls_ok": 2, "format_ok": True}
    assert echo.calls == [{"text": "hi"}, {"text": "yo"}]
    final = env.step(env.env.direction)  # type: ignore[attr-defined]
    assert final.reward == 1.0 and final.terminated
    env.close()
    assert echo.closed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>{"name": "echo", "arguments": {"text": "hi"}</tool_call>', "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        (call(args="[1]"), "must be a JSON object"),
        (call(name="nope"), "unknown tool 'nope'"),
        ('<tool_call>{"name": "echo"', "unclosed"),
    ],
)
def test_wrapper_malformed_calls_are_format_errors(text: str, message: str) -> None:
    env, echo = wrapped(format_error_reward=-0.5)
    out = env.step(text)
    assert out.observation.startswith("<tool_response>\nformat error:") and message in out.observation
    assert out.info["format_ok"] is False and out.reward == pytest.approx(-0.5)
    assert echo.calls == [] and not out.done


def test_wrapper_limits_calls_per_episode() -> None:
    env, echo = wrapped(max_tool_calls=2)
    env.step(call() + call() + call())
    assert len(echo.calls) == 2 and env.calls_used == 2
    refused = env.step(call())
    assert "limit reached" in refused.observation and len(echo.calls) == 2
    assert env.max_steps == 3 and not refused.done
    assert env.step(call()).truncated, "tool turns are bounded by max_steps too"
    with pytest.raises(EnvError):
        env.step("Left")
    env.reset(seed=1)
    env.step(call())
    assert len(echo.calls) == 3, "the limit resets with the episode"


def test_wrapper_prompt_and_json_string_arguments() -> None:
    env, echo = wrapped()
    assert '"name": "echo"' in env.system_prompt and "<tool_call>" in env.system_prompt
    assert "echo" in env.action_space_text
    env.step(call(args='"{\\"text\\": \\"s\\"}"'))
    assert echo.calls == [{"text": "s"}]
    assert get_tool_parser("hermes").parse("no calls here").items == ()
    with pytest.raises(ConfigError, match="unique"):
        ToolEnvWrapper(GuessDirectionEnv(), [Echo(), Echo()])


# ---------------------------------------------------------------- registry and specs


def test_registry_builds_via_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = {"calculator": CALCULATOR, "python": PYTHON, "mcp": MCP}

    def fake_load(group: str, name: str) -> Any:
        assert group == "roll.tool"
        if name not in specs:
            raise PluginError(f"no roll.tool plugin named {name!r}; installed: {', '.join(specs)}")
        return specs[name]

    monkeypatch.setattr(plugins, "load", fake_load)
    (calc,) = registry.build_tools("calculator")
    assert calc.call({"expression": "2+2"}).text == "4"
    (py,) = registry.build_tools("python", {"sandbox": {"wall_timeout_s": 2}})
    assert isinstance(py, PythonTool) and py.config.sandbox.wall_timeout_s == 2
    with pytest.raises(ConfigError, match=r"sandbox\.wall_timeout_s"):
        registry.build_tools("python", {"sandbox": {"wall_timeout_s": -1}})
    with pytest.raises(PluginError, match="installed"):
        registry.build_tools("nope")


def test_an_env_entry_takes_tool_plugins_by_name() -> None:
    """``tools`` on any env entry wraps the env: a turn with a call runs the ``roll.tool`` plugin (7*6 -> 42), the
    limit comes from ``tool_calls``, and the env's own actions still reach it."""
    from roll.agentic.env_manager.config import EnvEntryConfig
    from roll.agentic.env_manager.slots import build_env

    entry = EnvEntryConfig(
        type="guess_direction",
        options={"num_directions": 2, "max_steps": 1},
        tools=[{"type": "calculator"}],
        tool_calls={"max_tool_calls": 1},
    )
    env = build_env(entry)
    assert isinstance(env, ToolEnvWrapper) and env.max_steps == 1 + 1
    env.reset(0)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "7*6"}}</tool_call>'
    result = env.step(call)
    assert result.observation == "<tool_response>\n42\n</tool_response>" and result.info["tool_calls_ok"] == 1
    assert not result.done and env.calls_used == 1


def test_env_entry_tools_are_preflighted_with_key_paths() -> None:
    from roll.agentic.env_manager.check import env_issues
    from roll.agentic.env_manager.config import EnvEntryConfig

    entry = EnvEntryConfig(
        type="guess_direction", tools=[{"type": "calculatr"}, {"type": "calculator", "options": {"x": 1}}]
    )
    issues = {issue.path: issue.message for issue in env_issues([entry])}
    assert set(issues) == {"env_manager.envs.0.tools.0.type", "env_manager.envs.0.tools.1.options.x"}
    assert "installed: bash, calculator, mcp, python" in issues["env_manager.envs.0.tools.0.type"]
