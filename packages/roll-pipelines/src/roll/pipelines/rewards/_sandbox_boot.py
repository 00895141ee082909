"""The bootstrap that runs *inside* the sandbox, before the untrusted program (stdlib only, no roll imports).

:mod:`roll.pipelines.rewards.sandbox` copies this file next to the program and runs
``python -I -S -B _boot.py '<settings json>'``. Two modes:

- ``run`` (stdin/stdout cases, the agentic python tool): this process enters the sandbox (:func:`_enter`: closes
  every inherited descriptor, drops to the sandbox uid, sets the rlimits, installs the guard) and runs the
  program as ``__main__``. It ends with ``os._exit`` (after joining the program's threads and running its
  ``atexit`` functions): interpreter finalization, where audit hooks are cleared, never runs untrusted code.
- ``test`` (assert cases): the **harness** (this process, trusted) forks the **candidate** (untrusted) *before*
  it has read the tests, so the candidate's memory never held them. The candidate closes the harness's
  descriptors (the test pipe and the report pipe), enters the sandbox, waits for the harness's go, runs the
  program, then serves requests: call this function, get this attribute, with arguments and results crossing
  as *plain data* (exact ``None``/``bool``/``int``/``float``/``complex``/``str``/``bytes`` and
  ``list``/``tuple``/``dict``/``set``/``frozenset`` of those; anything else stays in the candidate and
  crosses as an opaque handle that cannot be compared and has no truth value). The harness reads the
  tests from its pipe, runs each in its own namespace where the program's names are remote proxies, and writes
  one verdict per test to the report pipe, which the candidate never held, each line carrying a per-run nonce
  that came with the tests (a line without it is ignored). So a test passes only when the
  harness itself ran it to the end: an exit of any kind (``sys.exit``, ``os._exit``, ``atexit``, a signal, a
  thread) before the verdict is a failure, a patched builtin or an object that claims equality lives in the
  candidate's interpreter and never reaches the comparison, and the test source is nowhere the candidate can
  read. Where the parent is root, harness and candidate drop to two different unprivileged uids; the harness
  also makes itself non-dumpable (``prctl``), so even a candidate of the same uid (a user-namespace jail)
  cannot open its ``/proc/<pid>/fd`` or memory. The harness runs behind the guard too: a test that evals the
  program's output stays inside the sandbox.

The guard (:mod:`._sandbox_guard`, copied alongside as ``_guard.py``) is an audit hook in the untrusted
interpreter; see its docstring for what it refuses and why it cannot be unhooked from Python.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import json
import os
import resource
import runpy
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

if __package__:  # imported as roll.pipelines.rewards._sandbox_boot (tests, type checking)
    from roll.pipelines.rewards._sandbox_guard import make_guard, resolve, strip_unaudited
else:  # run as _boot.py inside the sandbox, next to _guard.py (python -I does not put its folder on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _guard import make_guard, resolve, strip_unaudited  # type: ignore[no-redef]

    del sys.path[0]

_MAX_FRAME = 64 * 1024 * 1024


def _close_fds(keep: tuple[int, ...]) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _drop_to(uid: int | None) -> None:
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _guard_self(settings: dict[str, Any]) -> None:
    if settings["audit_hook"]:
        stdlib = resolve(os.path.dirname(os.__file__), "/")
        strip_unaudited()
        sys.addaudithook(make_guard(os.path.realpath(os.getcwd()), stdlib, os.getpid()))


def _enter(settings: dict[str, Any], keep: tuple[int, ...]) -> None:
    """Become the sandboxed process: close other descriptors, drop to the sandbox uid, limits, the guard."""
    _close_fds(keep)
    _drop_to(settings["uid"])
    for name, (soft, hard) in settings["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    _guard_self(settings)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _run_program(program: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``program`` as ``__main__``: (exit code, its globals when it finished without raising, what ended
    it otherwise, e.g. ``SystemExit: 0``)."""
    sys.argv = [program]
    try:
        return 0, runpy.run_path(program, run_name="__main__"), ""
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return _exit_code(exc.code), None, f"SystemExit: {exc.code}"
    except BaseException as exc:
        traceback.print_exc()
        return 1, None, f"{type(exc).__name__}: {str(exc)[:200]}"


def _finish(code: int, _exit: Callable[[int], None] = os._exit) -> None:
    """What a normal interpreter exit does for the program (threads joined, atexit run, streams flushed), then
    ``os._exit``: finalization, which clears audit hooks, never runs."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:
        code = code or 1
    _exit(code)


# ---------------------------------------------------------------------------------------------- plain data


def _encode(value: Any, handle: Callable[[Any], list[Any]], depth: int = 0) -> list[Any]:
    """``value`` as tagged JSON when it is plain data (exact builtin types all the way down), else ``handle``."""
    kind = type(value)
    if depth > 200:
        raise ValueError("sandbox: value nested too deeply")
    if value is None or kind is bool or kind is str:
        return ["v", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        items = [_encode(item, handle, depth + 1) for item in value]
        if any(item[0] == "h" for item in items) and kind is not list and kind is not tuple:
            return handle(value)
        tags: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "S"}
        return [tags[kind], items]
    if kind is dict:
        pairs = [[_encode(k, handle, depth + 1), _encode(v, handle, depth + 1)] for k, v in value.items()]
        if any(k[0] == "h" for k, _ in pairs):
            return handle(value)
        return ["d", pairs]
    return handle(value)


def _decode(data: Any, resolve: Callable[[list[Any]], Any], depth: int = 0) -> Any:
    """The inverse of :func:`_encode`; builds exact builtin types only, rejects anything malformed."""
    if type(data) is not list or not data or type(data[0]) is not str or depth > 200:
        raise ValueError("sandbox: malformed value")
    tag = data[0]
    if tag == "v" and len(data) == 2 and (data[1] is None or type(data[1]) in (bool, str)):
        return data[1]
    if tag == "i" and len(data) == 2 and type(data[1]) is str:
        return int(data[1])
    if tag == "f" and len(data) == 2 and type(data[1]) is str:
        return float.fromhex(data[1])
    if tag == "c" and len(data) == 3:
        return complex(float.fromhex(data[1]), float.fromhex(data[2]))
    if tag == "y" and len(data) == 2 and type(data[1]) is str:
        return bytes.fromhex(data[1])
    if tag in ("l", "t", "s", "S") and len(data) == 2 and type(data[1]) is list:
        items = [_decode(item, resolve, depth + 1) for item in data[1]]
        return {"l": list, "t": tuple, "s": set, "S": frozenset}[tag](items)
    if tag == "d" and len(data) == 2 and type(data[1]) is list:
        pairs = [p for p in data[1] if type(p) is list and len(p) == 2]
        if len(pairs) != len(data[1]):
            raise ValueError("sandbox: malformed dict")
        return {_decode(k, resolve, depth + 1): _decode(v, resolve, depth + 1) for k, v in pairs}
    if tag == "h":
        return resolve(data)
    raise ValueError("sandbox: malformed value")


class _Channel:
    """Length-prefixed JSON frames over a pair of pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message: Any) -> None:
        data = json.dumps(message, allow_nan=False).encode("utf-8", "surrogatepass")
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = os.read(self.read_fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> Any:
        (size,) = struct.unpack(">I", self._read(4))
        if size > _MAX_FRAME:
            raise ValueError("sandbox: frame too large")
        return json.loads(self._read(size).decode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------------- candidate


def _candidate(settings: dict[str, Any], channel: _Channel) -> None:
    """The untrusted side of ``test`` mode; never returns."""
    code = 1
    try:
        _enter(settings, keep=(channel.read_fd, channel.write_fd))
        channel.recv()  # the harness's go: it is non-dumpable from here on
        code, program_globals, ended = _run_program(settings["program"])
        if program_globals is None:
            channel.send(["exited", ended])
        else:
            _serve(channel, program_globals)
    except BaseException:
        pass
    _finish(code)


def _small(value: Any, limit: int = 20_000) -> bool:
    """Whether ``value`` holds at most ``limit`` items, counted without building anything."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if type(item) in (list, tuple, set, frozenset):
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
    return True


def _global(value: Any, handle: Callable[[Any], list[Any]]) -> list[Any]:
    """A program global for the harness: its plain value when small (constants a test may use), else a handle
    (a precomputed table, a structure that contains itself)."""
    if not _small(value):
        return handle(value)
    try:
        return _encode(value, handle)
    except (ValueError, RecursionError):
        return handle(value)


def _serve(channel: _Channel, program_globals: dict[str, Any]) -> None:
    handles: list[Any] = []

    def handle(value: Any) -> list[Any]:
        handles.append(value)
        return ["h", len(handles) - 1, type(value).__name__]

    def resolve(data: list[Any]) -> Any:
        return handles[data[1]]

    names = {
        name: _global(value, handle) for name, value in program_globals.items() if not name.startswith("__")
    }
    channel.send(["ready", names])
    while True:
        try:
            request = channel.recv()
        except EOFError:
            return
        try:
            target = handles[request[1]]
            if request[0] == "call":
                args = _decode(request[2], resolve)
                kwargs = _decode(request[3], resolve)
                result = target(*args, **kwargs)
            elif request[0] == "getattr":
                result = getattr(target, request[2])
            else:
                result = target[_decode(request[2], resolve)]
            reply = ["ok", _encode(result, handle)]
        except Exception as exc:
            reply = ["raise", type(exc).__name__, str(exc)[:1000]]
        channel.send(reply)


# ---------------------------------------------------------------------------------------------- harness


class ProgramExited(BaseException):
    """The candidate is gone (it exited, crashed or broke the protocol): every test still to run fails.
    A ``BaseException``, so a test's ``except Exception`` cannot swallow it."""


class ProgramError(Exception):
    """The candidate raised an exception that is not a builtin ``Exception`` class."""


class _Remote:
    """A program object that is not plain data: callable and subscriptable through the candidate; comparing it
    or asking its truth value is an error, so it can never satisfy an assert."""

    __slots__ = ("_handle", "_kind", "_rpc")

    def __init__(self, rpc: _Rpc, handle: int, kind: str) -> None:
        self._rpc, self._handle, self._kind = rpc, handle, kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._rpc.request(["call", self._handle, self._rpc.encode(args), self._rpc.encode(kwargs)])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._rpc.request(["getattr", self._handle, name])

    def __getitem__(self, key: Any) -> Any:
        return self._rpc.request(["item", self._handle, self._rpc.encode(key)])

    def __bool__(self) -> bool:
        raise TypeError(f"the program's {self._kind} object is not plain data")

    def __eq__(self, other: object) -> bool:
        raise TypeError(f"the program's {self._kind} object is not plain data: it cannot be compared")

    def __ne__(self, other: object) -> bool:
        raise TypeError(f"the program's {self._kind} object is not plain data: it cannot be compared")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<the program's {self._kind}>"


class _Rpc:
    """The harness's end of the channel to the candidate."""

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel
        self.gone: str | None = None

    def proxy(self, data: list[Any]) -> _Remote:
        if len(data) != 3 or type(data[1]) is not int or type(data[2]) is not str:
            raise ValueError("sandbox: malformed handle")
        return _Remote(self, data[1], data[2])

    def encode(self, value: Any) -> list[Any]:
        def refuse(obj: Any) -> list[Any]:
            if type(obj) is _Remote:
                return ["h", obj._handle]
            raise TypeError(
                f"a test can pass only plain data or the program's objects, not {type(obj).__name__}"
            )

        return _encode(value, refuse)

    def receive(self) -> Any:
        if self.gone is not None:
            raise ProgramExited(self.gone)
        try:
            return self.channel.recv()
        except (EOFError, OSError, ValueError) as exc:
            self.gone = (
                "the program exited before the tests finished" if isinstance(exc, EOFError) else str(exc)
            )
            raise ProgramExited(self.gone) from None

    def request(self, message: list[Any]) -> Any:
        try:
            self.channel.send(message)
        except OSError:
            self.gone = self.gone or "the program exited before the tests finished"
        reply = self.receive()
        try:
            if reply[0] == "ok" and len(reply) == 2:
                return _decode(reply[1], self.proxy)
            if reply[0] == "raise" and len(reply) == 3:
                raise _exception(str(reply[1]), str(reply[2]))
        except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
            if reply[0] == "raise":
                raise
            self.gone = f"the program broke the protocol: {exc}"
            raise ProgramExited(self.gone) from None
        self.gone = "the program broke the protocol"
        raise ProgramExited(self.gone)


def _exception(name: str, message: str) -> Exception:
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return ProgramError(f"{name}: {message}")


def _harness(settings: dict[str, Any], channel: _Channel) -> None:
    """The trusted side of ``test`` mode: reads the tests, runs them against the candidate, reports."""
    report = settings["report_fd"]
    _drop_to(settings["harness_uid"])  # not the program's uid: it cannot signal or trace the harness
    protected = _make_undumpable() or settings["harness_uid"] is not None
    _guard_self(settings)  # the tests are trusted, but one that evals the program's output must not escape
    channel.send(["go"])
    with os.fdopen(settings["tests_fd"], "rb") as pipe:
        payload = json.loads(pipe.read().decode("utf-8"))
    tests, nonce = payload["tests"], payload["nonce"]
    rpc = _Rpc(channel)
    if not protected:
        rpc.gone = "the harness could not make itself non-dumpable (prctl) and shares the program's uid"
    namespace: dict[str, Any] = {}
    try:
        hello = rpc.receive() if rpc.gone is None else ["refused"]
        if hello[0] != "ready" or type(hello[1]) is not dict:
            exited = hello[0] == "exited" and len(hello) == 2
            rpc.gone = (
                f"the program exited before the tests started ({hello[1]})" if exited else "bad protocol"
            )
        else:
            shadowing = set(dir(builtins))  # a program's `abs` or `len` must not judge the test's values
            namespace = {
                str(name): _decode(value, rpc.proxy)
                for name, value in hello[1].items()
                if name not in shadowing
            }
    except ProgramExited:
        pass
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        rpc.gone = f"the program broke the protocol: {exc}"
    for index, source in enumerate(tests):
        error = rpc.gone or _run_test(source, namespace)
        _report(report, {"nonce": nonce, "i": index, "ok": error is None, "error": error})
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # the candidate sees end of file and exits; its group or namespace is killed anyway


def _run_test(source: str, program_names: dict[str, Any]) -> str | None:
    """None when ``source`` ran to the end in the harness, else why it did not."""
    scope = {"__name__": "__main__", "__builtins__": builtins, **program_names}
    try:
        exec(compile(source, "<test>", "exec"), scope)
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
    return None


def _report(fd: int, message: dict[str, Any]) -> None:
    data = memoryview((json.dumps(message) + "\n").encode("utf-8", "surrogatepass"))
    while data:
        data = data[os.write(fd, data) :]


def _make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``: a process of the same uid can no longer open our ``/proc`` entries."""
    try:
        import ctypes  # only in the harness, after the fork: the candidate never has it

        return int(ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _test_main(settings: dict[str, Any]) -> None:
    """Fork the candidate before anything about the tests is in memory, then run the harness."""
    candidate_reads, harness_writes = os.pipe()
    harness_reads, candidate_writes = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(harness_reads)
        os.close(harness_writes)
        _candidate(settings, _Channel(candidate_reads, candidate_writes))
    os.close(candidate_reads)
    os.close(candidate_writes)
    _harness(settings, _Channel(harness_reads, harness_writes))


def main() -> None:
    settings = json.loads(sys.argv[1])
    if settings["mode"] == "test":
        _test_main(settings)
        return
    _enter(settings, keep=())
    code, _, _ = _run_program(settings["program"])
    _finish(code)


if __name__ == "__main__":
    main()
