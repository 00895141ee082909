"""A Python tool: the model sends code, the tool runs it in the shared sandbox and returns what it printed.

The runner is :class:`roll.pipelines.rewards.sandbox.Sandbox` (the one the code reward uses): a fresh ``python -I``
per call with rlimits on CPU, memory, files, processes and output, a wall-clock timeout that kills the process
group, no network where the host allows namespaces, and an unprivileged user when run as root. Each call is
independent: nothing survives between calls, so the model must ``print`` what it wants to see.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from roll.agentic.types import ToolResult
from roll.core.config.base import RollModel
from roll.pipelines.rewards.config import SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox, SandboxResult

__all__ = ["PythonTool", "PythonToolConfig"]


class PythonToolConfig(RollModel):
    type: Literal["python"] = Field("python", description="selects this tool (its roll.tool entry point)")
    name: str = Field(default="python", description="the function name the model calls")
    sandbox: SandboxConfig = SandboxConfig()
    max_output_chars: int = Field(default=4000, ge=16, description="longer output is cut in the middle")
    max_code_chars: int = Field(
        default=20_000, ge=1, description="longer code is refused with an error result"
    )


class PythonTool:
    """The :class:`~roll.agentic.types.Tool` that runs Python code."""

    description = "Run a Python 3 program and return its stdout and stderr. Use print() to see values."
    parameters: dict[str, Any] = {  # noqa: RUF012 - read-only JSON schema shared by instances
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete Python program"}},
        "required": ["code"],
    }

    def __init__(self, config: PythonToolConfig | None = None) -> None:
        self.config = config or PythonToolConfig()
        self.name = self.config.name
        self._sandbox = Sandbox(self.config.sandbox)

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult("error: missing string argument 'code'", ok=False)
        if len(code) > self.config.max_code_chars:
            return ToolResult(f"error: code longer than {self.config.max_code_chars} characters", ok=False)
        result = self._sandbox.run(code)
        return ToolResult(self._format(result), ok=result.ok)

    def _format(self, result: SandboxResult) -> str:
        parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
        if result.stderr.strip():
            parts.append("stderr:\n" + result.stderr.rstrip("\n"))
        if result.timed_out:
            parts.append(f"error: timed out after {self.config.sandbox.wall_timeout_s:g} s")
        elif result.output_limited:
            parts.append(f"error: output exceeded {self.config.sandbox.max_output_bytes} bytes")
        elif result.exit_code != 0:
            parts.append(f"exit code {result.exit_code}")
        return _clip_middle("\n".join(parts) or "(no output)", self.config.max_output_chars)

    def close(self) -> None:
        return None


def _clip_middle(text: str, cap: int) -> str:
    """Keep the head and the tail: a traceback's last line says what went wrong."""
    if len(text) <= cap:
        return text
    head = cap // 2
    return f"{text[:head]}\n... [{len(text) - cap} characters cut] ...\n{text[len(text) - (cap - head) :]}"
