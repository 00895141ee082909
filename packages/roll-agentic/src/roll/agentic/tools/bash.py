"""A ``bash`` tool over an episode's private scratch filesystem in the code sandbox's jail.

A :class:`Workspace` is one jail (:meth:`roll.pipelines.rewards.sandbox.Sandbox.start_jailed`, the one the code
reward uses: mount, pid and network namespaces, only ``/usr`` and the interpreter visible, read-only) whose
``/sandbox`` (cwd and ``HOME``) and ``/tmp`` are size-capped tmpfs. A shell server (:mod:`._jail_shell`) runs in
it as pid 1 and runs each command:

- as the unprivileged sandbox uid when the host is root (CI), else in a nested user namespace without
  capabilities (the jail itself is then a user namespace: see :mod:`roll.pipelines.rewards.sandbox`);
- under a wall deadline, with rlimits on CPU, memory, file size, processes and descriptors, output capped,
  no network (its network namespace has no interface up), a fresh environment and stdin ``/dev/null``;
- files persist across the episode's calls; processes do not: when a call ends, everything it started is killed.

:meth:`Workspace.check` runs the task's checker once, after the episode, in a fresh process as another
unprivileged uid, with the expected values in its environment only; then the workspace accepts nothing more.
:meth:`Workspace.close` ends the jail: its filesystem is gone with it. The host never reads or writes the
scratch files itself, so no symlink the agent makes can point it anywhere.

Where the host builds no jail (no ``unshare``, no CAP_SYS_ADMIN nor unprivileged user namespaces), a workspace
refuses to start: without a private filesystem there is no terminal episode.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from roll.agentic.types import ToolError, ToolResult
from roll.core.config.base import RollModel
from roll.pipelines.rewards.config import SandboxConfig
from roll.pipelines.rewards.sandbox import JailedProcess, Sandbox

__all__ = ["BashTool", "BashToolConfig", "ShellLimits", "ShellResult", "Workspace"]

_SERVER = (Path(__file__).parent / "_jail_shell.py").read_text(encoding="utf-8")
_START_TIMEOUT_S = 30.0
_SLACK_S = 10.0  # host-side margin over a command's own deadline (the server kills and reaps first)


class ShellLimits(RollModel):
    """Limits of every command of a terminal episode (and of its setup and checker)."""

    timeout_s: float = Field(5.0, gt=0, description="wall-clock seconds one command may run")
    cpu_time_s: int = Field(4, ge=1, description="CPU seconds one command may use (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address space of each process, MiB (RLIMIT_AS)")
    file_size_mb: int = Field(4, ge=1, description="largest file a command may write, MiB (RLIMIT_FSIZE)")
    disk_mb: int = Field(16, ge=1, description="size of the scratch filesystem (and of /tmp), MiB")
    max_processes: int = Field(
        128, ge=4, description="processes of the sandbox uid, host-wide (RLIMIT_NPROC)"
    )
    max_open_files: int = Field(64, ge=16, description="open descriptors per process (RLIMIT_NOFILE)")
    max_output_bytes: int = Field(16_000, ge=256, description="output beyond this kills the command")
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig,
        description="the code sandbox that builds the jail (uids, interpreter, namespaces); its own run limits "
        "are not used here",
    )


@dataclass(frozen=True)
class ShellResult:
    """One command: ``exit_code`` is None when it was killed (deadline or output cap)."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    output_limited: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Workspace:
    """One episode's jail and scratch filesystem. Not thread-safe (one env owns it); see the module docstring."""

    def __init__(self, limits: ShellLimits | None = None) -> None:
        self.limits = limits or ShellLimits()
        self._jail: JailedProcess | None = None
        self._lock = threading.Lock()
        self.checked = False

    @property
    def started(self) -> bool:
        return self._jail is not None

    def start(self) -> None:
        """Start the jail (a few hundred ms); :meth:`run` does it on first use."""
        if self._jail is not None:
            return
        lim, mb = self.limits, 1024 * 1024
        rlimits = {
            "RLIMIT_CPU": (lim.cpu_time_s, lim.cpu_time_s + 1),
            "RLIMIT_AS": (lim.memory_mb * mb, lim.memory_mb * mb),
            "RLIMIT_FSIZE": (lim.file_size_mb * mb, lim.file_size_mb * mb),
            "RLIMIT_NPROC": (lim.max_processes, lim.max_processes),
            "RLIMIT_NOFILE": (lim.max_open_files, lim.max_open_files),
            "RLIMIT_CORE": (0, 0),
        }
        sandbox = _sandbox(lim.sandbox)
        agent_uid, checker_uid = sandbox.uids
        settings = {
            "agent_uid": agent_uid,
            "checker_uid": checker_uid,
            "nested_userns": agent_uid is None and os.geteuid() != 0,
            "rlimits": rlimits,
            "max_output": lim.max_output_bytes,
        }
        self._jail = sandbox.start_jailed(_SERVER, json.dumps(settings), lim.disk_mb)
        hello = self._receive(_START_TIMEOUT_S)
        if hello.get("ready") is not True:
            self.close()
            raise ToolError(f"terminal workspace: the jail's shell server did not start as pid 1 ({hello})")

    def run(self, command: str, timeout_s: float | None = None) -> ShellResult:
        """Run ``command`` with ``bash -c`` in the scratch dir, as the agent, under the limits."""
        if self.checked:
            return ShellResult(None, "error: the episode is over (its checker has run)")
        return self._call({"op": "run", "command": command, "timeout_s": timeout_s or self.limits.timeout_s})

    def check(self, script: str, env: dict[str, str], timeout_s: float | None = None) -> ShellResult:
        """Run the checker ``script`` once, after every agent process is dead, as the checker uid; ``env`` (the
        expected values) reaches it only. Nothing runs in this workspace afterwards."""
        if self.checked:
            raise ToolError("terminal workspace: the checker runs once per episode")
        self.checked = True
        request = {
            "op": "check",
            "command": script,
            "env": env,
            "timeout_s": timeout_s or self.limits.timeout_s,
        }
        return self._call(request)

    def _call(self, request: dict[str, Any]) -> ShellResult:
        with self._lock:
            self.start()
            assert self._jail is not None and self._jail.proc.stdin is not None  # started just above
            try:
                self._jail.proc.stdin.write((json.dumps(request) + "\n").encode())
                self._jail.proc.stdin.flush()
            except OSError:
                self._fail("the jail's shell server is gone")
            reply = self._receive(float(request["timeout_s"]) + _SLACK_S)
        if "error" in reply:
            raise ToolError(f"terminal workspace: {reply['error']}")
        return ShellResult(
            reply["exit_code"],
            reply["output"],
            reply["timed_out"],
            reply["output_limited"],
            reply["duration_s"],
        )

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        """One answer line of the server, or a :class:`ToolError` (and a dead workspace) past the deadline."""
        assert self._jail is not None and self._jail.proc.stdout is not None  # started
        stdout, deadline, data = self._jail.proc.stdout, time.monotonic() + timeout_s, b""
        fd = stdout.fileno()
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
            if not ready:
                self._fail(f"the jail's shell server did not answer within {timeout_s:g} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._fail("the jail's shell server exited")
            data += chunk
        message: dict[str, Any] = json.loads(data)
        return message

    def _fail(self, why: str) -> None:
        self.close()
        raise ToolError(f"terminal workspace: {why}")

    def close(self) -> None:
        """End the jail; its scratch filesystem and every process in it are gone. Idempotent."""
        jail, self._jail = self._jail, None
        if jail is None:
            return
        try:
            if jail.proc.stdin is not None:
                jail.proc.stdin.write(b'{"op": "close"}\n')
                jail.proc.stdin.flush()
        except OSError:
            pass
        jail.close()


_SANDBOXES: dict[str, Sandbox] = {}
_SANDBOX_LOCK = threading.Lock()


def _sandbox(config: SandboxConfig) -> Sandbox:
    """One :class:`Sandbox` per config and process: building one probes the host and logs what is isolated."""
    key = config.model_dump_json()
    with _SANDBOX_LOCK:
        if key not in _SANDBOXES:
            _SANDBOXES[key] = Sandbox(config)
        return _SANDBOXES[key]


class BashToolConfig(RollModel):
    type: Literal["bash"] = Field("bash", description="selects this tool (its roll.tool entry point)")
    name: str = Field(default="bash", description="the function name the model calls")
    limits: ShellLimits = Field(default_factory=ShellLimits, description="limits of each command")
    max_command_chars: int = Field(4000, ge=1, description="longer commands are refused with an error result")


class BashTool:
    """The :class:`~roll.agentic.types.Tool` that runs a shell command in a :class:`Workspace`. Built alone (the
    ``bash`` entry point) it owns a scratch workspace of its own; a terminal env passes the episode's."""

    description = "Run a bash command in your working directory and return its output (stdout and stderr)."
    parameters: dict[str, Any] = {  # noqa: RUF012 - read-only JSON schema shared by instances
        "type": "object",
        "properties": {"command": {"type": "string", "description": "e.g. ls -l"}},
        "required": ["command"],
    }

    def __init__(self, config: BashToolConfig | None = None, workspace: Workspace | None = None) -> None:
        self.config = config or BashToolConfig()
        self.name = self.config.name
        self._owned = workspace is None
        self.workspace = workspace or Workspace(self.config.limits)

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return ToolResult("error: missing string argument 'command'", ok=False)
        if len(command) > self.config.max_command_chars:
            return ToolResult(
                f"error: command longer than {self.config.max_command_chars} characters", ok=False
            )
        result = self.workspace.run(command)
        return ToolResult(format_result(result, self.workspace.limits), ok=result.ok)

    def close(self) -> None:
        if self._owned:
            self.workspace.close()


def format_result(result: ShellResult, limits: ShellLimits) -> str:
    """What the agent reads: the output, then why the command ended when it did not exit 0."""
    parts = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.timed_out:
        parts.append(f"error: killed after {limits.timeout_s:g} s")
    elif result.output_limited:
        parts.append(f"error: output exceeded {limits.max_output_bytes} bytes; killed")
    elif result.exit_code not in (0, None):
        parts.append(f"exit code {result.exit_code}")
    return "\n".join(parts) or "(no output)"
