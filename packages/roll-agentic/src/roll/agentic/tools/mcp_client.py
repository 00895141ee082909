"""MCP tools: the tools of an external Model Context Protocol server, offered to the model as roll tools.

:class:`McpClient` starts the server as a subprocess and talks to it over stdio with the ``mcp`` package's client
(``stdio_client`` + ``ClientSession``, the API common to mcp 1.x and 2.x). The MCP client is asyncio; envs and
tools are synchronous, so the client owns one background thread running an event loop. A single task on that
loop opens the transport and the session and holds them until :meth:`McpClient.close` (anyio requires a context
to be exited by the task that entered it); calls are submitted to the loop with a timeout each.

:func:`build_mcp_tools` lists the server's tools and returns one :class:`McpTool` per tool, all sharing the
client; the server stops when the last of them is closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import Field

from roll.agentic.types import ToolError, ToolResult
from roll.core.config.base import RollModel

__all__ = ["McpClient", "McpServerConfig", "McpTool", "McpToolInfo", "build_mcp_tools"]

T = TypeVar("T")


class McpServerConfig(RollModel):
    """How to start an MCP server over stdio, and which of its tools to expose."""

    type: Literal["mcp"] = Field("mcp", description="selects this tool (its roll.tool entry point)")
    command: str = Field(description="the executable that starts the server, e.g. 'python' or 'npx'")
    args: tuple[str, ...] = Field((), description="arguments of the server command")
    env: dict[str, str] | None = Field(default=None, description="extra environment variables for the server")
    cwd: str | None = Field(None, description="working directory of the server; unset: the worker's")
    tools: tuple[str, ...] | None = Field(default=None, description="expose only these tools; None: all")
    prefix: str = Field(default="", description="prepended to each tool name, to keep names unique")
    startup_timeout_s: float = Field(
        default=30.0, gt=0, description="limit for the server to start and initialize"
    )
    call_timeout_s: float = Field(default=30.0, gt=0, description="limit of one tool call")


@dataclass(frozen=True)
class McpToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]


class McpClient:
    """A live stdio connection to one MCP server, usable from synchronous code. Raises :class:`ToolError` if the
    server does not start and initialize within ``startup_timeout_s``."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._refs = 0
        self._closed = False
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives as long as the server
        self._ready: cf.Future[Any] = cf.Future()
        self._stop: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="roll-mcp-client", daemon=True)
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self._session = self._wait_ready()

    async def _serve(self) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.config.command, args=list(self.config.args), env=self.config.env, cwd=self.config.cwd
        )
        self._stop = asyncio.Event()
        async with (
            stdio_client(params, errlog=self._stderr) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            self._ready.set_result(session)
            await self._stop.wait()

    def _wait_ready(self) -> Any:
        done, _ = cf.wait([self._ready, self._main], self.config.startup_timeout_s, cf.FIRST_COMPLETED)
        if self._ready in done:
            return self._ready.result()
        cause = self._main.exception() if self._main in done else None
        stderr = self._stderr_tail()
        self.close()
        reason = (
            f"failed: {_leaf(cause)!r}" if cause else f"did not answer in {self.config.startup_timeout_s:g} s"
        )
        raise ToolError(
            f"MCP server {self.config.command!r} {list(self.config.args)} {reason}; "
            f"its stderr ends with: {stderr!r}. Check the command and that it speaks MCP over stdio."
        )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ToolError(f"MCP client for {self.config.command!r} is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.config.call_timeout_s)
        except cf.TimeoutError:
            future.cancel()
            raise

    def list_tools(self) -> list[McpToolInfo]:
        """The server's tools, in its order."""
        listing = self._run(self._session.list_tools())
        return [_tool_info(tool) for tool in listing.tools]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call one tool; failures (its own, a timeout, a protocol error) come back as ``ok=False``."""
        try:
            result = self._run(self._session.call_tool(name, arguments))
        except cf.TimeoutError:
            return ToolResult(
                f"error: tool {name!r} timed out after {self.config.call_timeout_s:g} s", ok=False
            )
        except ToolError:
            raise
        except Exception as exc:  # a protocol error from the server is the model's to read, not a crash
            return ToolResult(f"error: {exc}", ok=False)
        return _result_to_tool_result(result)

    def acquire(self) -> None:
        self._refs += 1

    def release(self) -> None:
        self._refs -= 1
        if self._refs <= 0:
            self.close()

    def close(self) -> None:
        """Stop the server and the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._main.result(timeout=10)
        except BaseException:
            self._main.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._stderr.close()

    def _stderr_tail(self, chars: int = 500) -> str:
        if self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-chars:]

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside anyio's nested exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _tool_info(tool: Any) -> McpToolInfo:
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {"type": "object"}
    return McpToolInfo(name=tool.name, description=tool.description or "", input_schema=dict(schema))


def _result_to_tool_result(result: Any) -> ToolResult:
    content = getattr(result, "content", None)
    if content is None:
        return ToolResult(f"error: unsupported MCP result {type(result).__name__}", ok=False)
    parts = [
        block.text if hasattr(block, "text") else f"[{getattr(block, 'type', 'content')}]"
        for block in content
    ]
    is_error = bool(getattr(result, "is_error", getattr(result, "isError", False)))
    return ToolResult("\n".join(parts), ok=not is_error)


class McpTool:
    """One tool of an MCP server, as a roll :class:`~roll.agentic.types.Tool`."""

    def __init__(self, client: McpClient, info: McpToolInfo, prefix: str = "") -> None:
        self._client = client
        self._info = info
        self._open = True
        self.name = prefix + info.name
        self.description = info.description
        self.parameters = info.input_schema
        client.acquire()

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        return self._client.call_tool(self._info.name, arguments)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client.release()


def build_mcp_tools(config: McpServerConfig) -> list[McpTool]:
    """Start the server, list its tools and wrap the selected ones. Unknown names in ``config.tools`` raise."""
    client = McpClient(config)
    try:
        infos = client.list_tools()
        if config.tools is not None:
            known = {info.name for info in infos}
            missing = sorted(set(config.tools) - known)
            if missing:
                raise ToolError(
                    f"MCP server {config.command!r} has no tools {missing}; it offers {sorted(known)}"
                )
            infos = [info for info in infos if info.name in config.tools]
    except BaseException:
        client.close()
        raise
    tools = [McpTool(client, info, config.prefix) for info in infos]
    if not tools:
        client.close()
    return tools
