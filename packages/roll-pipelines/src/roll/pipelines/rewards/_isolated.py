"""A user's function called in a child Python process, under a deadline per call that nothing in it can evade.

Why a process: a Python thread cannot be stopped, and a function may never return (``while True: pass``,
``time.sleep(1e9)``, a C extension stuck without releasing anything, a handler that swallows ``SIGALRM`` or
``SIGTERM``). ``signal.alarm`` works only on the main thread (reward workers call from others) and the function
can catch it. Only ``SIGKILL`` of the process that runs the function is certain, and it must not be the reward
worker's own process (that would lose every other row of its share): so the function runs in a child, one call at
a time, and a call past its deadline kills the child; the row fails with the reason and the next call starts a
fresh child. Leaning on the worker restart alone (the reward role's ``call_timeout_s``) would fail a whole share
of rows for one bad row, and only after the share's much longer deadline.

The child is started once and reused (``python -m`` this module: a clean interpreter, no inherited threads or
locks, unlike a ``fork`` of a Ray worker), so a call costs a pickle round trip over a pipe (about 0.1 ms), not a
process start. It resolves the function itself from its ``module:name`` / ``file.py:name`` target with the
parent's ``sys.path``. Its start-up (imports) is never charged to a call. The protocol has its own pipes, so what
the function prints still reaches the worker's stdout and stderr. A child whose parent dies (the worker was
killed) exits within a second.

An exception raised by the function is raised again in the caller with the child's traceback text as its cause
(as :mod:`concurrent.futures` does across processes); a call past its deadline raises :class:`RewardTimeoutError`;
a child that dies during a call (``os._exit``, a segfault) raises :class:`RewardProcessError`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from roll.core.errors import RollError

__all__ = ["IsolatedFunction", "RewardProcessError", "RewardTimeoutError"]

START_TIMEOUT_S = 120.0
"""How long the child may take to start and import the function (not charged to any call)."""
_HEADER = struct.Struct("!Q")


class RewardTimeoutError(RollError, TimeoutError):
    """The function did not return within its deadline; its process was killed."""


class RewardProcessError(RollError, RuntimeError):
    """The process running the function died or could not start."""


class RemoteTraceback(Exception):
    """The child's traceback text, attached as the ``__cause__`` of an exception raised again in the caller."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class IsolatedFunction:
    """``target(*args, **kwargs)`` run in a child process, each call within ``timeout_s`` (module docstring)."""

    def __init__(self, target: str, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._to_child = self._from_child = -1
        self._lock = threading.Lock()
        self.killed = 0
        """Calls killed at their deadline."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._ensure_started()
            try:
                _send(self._to_child, (args, kwargs))
                kind, payload = _receive(self._from_child, time.monotonic() + self.timeout_s)
            except TimeoutError:
                self._kill()
                self.killed += 1
                raise RewardTimeoutError(
                    f"{self.target} did not return within timeout_s={self.timeout_s:g}s; its process was killed"
                ) from None
            except (EOFError, OSError) as exc:
                code = self._kill()
                raise RewardProcessError(
                    f"the process running {self.target} died during the call (exit code {code}): {exc}"
                ) from None
        if kind == "ok":
            return payload
        raise _rebuilt(*payload)

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: best effort
            self._kill()

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:
            self._kill()
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        cmd = [sys.executable, "-m", __name__, str(request_r), str(reply_w)]
        self._proc = subprocess.Popen(cmd, pass_fds=(request_r, reply_w), stdin=subprocess.DEVNULL)
        os.close(request_r)
        os.close(reply_w)
        self._to_child, self._from_child = request_w, reply_r
        try:
            _send(self._to_child, (list(sys.path), self.target))
            kind, payload = _receive(self._from_child, time.monotonic() + START_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError) as exc:
            code = self._kill()
            raise RewardProcessError(
                f"the process for {self.target} did not start within {START_TIMEOUT_S:g}s (exit code {code}): "
                f"{type(exc).__name__} {exc}"
            ) from None
        if kind != "ready":
            self._kill()
            raise RewardProcessError(f"the process for {self.target} could not load it: {payload}")

    def _kill(self) -> int | None:
        """Kill and reap the child (if any); its exit code."""
        proc, self._proc = self._proc, None
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_child = self._from_child = -1
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()  # SIGKILL: a function that ignores signals cannot ignore this one
        return proc.wait()


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, deadline: float) -> Any:
    """One message from ``fd``; TimeoutError at ``deadline``, EOFError when the writer is gone."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exactly(fd, size, deadline))


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while n:
        left = None if deadline == float("inf") else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
            raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the process closed its pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------- the child


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (a killed worker must not leave a spinning child behind)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _rebuilt(pickled: bytes | None, summary: str, text: str) -> BaseException:
    """The child's exception, its traceback text as the cause; one that does not unpickle here becomes a
    RuntimeError carrying its type and message."""
    try:
        error = pickle.loads(pickled) if pickled is not None else None
    except Exception:  # its class exists only in the child: its type and message still tell the story
        error = None
    if not isinstance(error, BaseException):
        error = RuntimeError(summary)
    error.__cause__ = RemoteTraceback(text)
    return error


def _error_payload(exc: BaseException) -> tuple[bytes | None, str, str]:
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled: bytes | None = pickle.dumps(exc)
    except Exception:  # an exception that cannot cross processes: its type and message can
        pickled = None
    return pickled, f"{type(exc).__name__}: {exc}", text


def _serve(request_fd: int, reply_fd: int) -> None:
    from roll.core.callables import resolve_callable

    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    sys_path, target = _receive(request_fd, float("inf"))
    sys.path[:] = sys_path
    try:
        fn = resolve_callable(target)
    except Exception as exc:
        _send(reply_fd, ("error", f"{type(exc).__name__}: {exc}"))
        return
    _send(reply_fd, ("ready", None))
    while True:
        try:
            args, kwargs = _receive(request_fd, float("inf"))
        except EOFError:
            return
        try:
            reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
            _send(reply_fd, reply)
        except Exception as exc:  # the user's exception (or an unpicklable value) goes back to the caller
            _send(reply_fd, ("raise", _error_payload(exc)))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
