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

The guard (:func:`_make_guard`) is an audit hook in the untrusted interpreter: no sockets, no processes by
any route (``fork``, ``exec``, ``posix_spawn``, ``subprocess``, ``_posixsubprocess``, subinterpreters,
``ctypes``, native extensions from outside the standard library), no tracing hooks, no writes outside the
working directory (paths resolved the way the kernel will: relative to ``dir_fd`` or the current directory,
symlinks followed), no directory descriptors outside it (so ``dir_fd``/``fchdir`` cannot reach out), and no
other process's ``/proc`` entries. Its state sits in default arguments of functions whose code and defaults
cannot be reassigned (the guard refuses that), and it calls only builtin functions captured at start-up, so
monkeypatching ``os``, ``posixpath`` or ``builtins`` does not change what it checks.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import json
import os
import resource
import runpy
import stat
import struct
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

_DENIED_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "os.kill",
        "os.killpg",
        "subprocess.Popen",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.call_function",
        "resource.setrlimit",
        "resource.prlimit",
        "sys.settrace",
        "sys.setprofile",
        "cpython.PyInterpreterState_New",
    }
)
_DENIED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "_posixsubprocess",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "_interpreters",
        "_interpchannels",
        "posix",
        "_signal",
        "xxsubtype",
        "xxlimited",
        "xxlimited_35",
    }
)
# Functions with no audit event that reach other processes or make files: removed from their modules.
_UNAUDITED = ("pidfd_open", "mkfifo", "mknod", "setsid", "setpgid", "setpgrp")
_STRIPPED = {"posix": _UNAUDITED, "os": _UNAUDITED}
_STRIPPED_SIGNAL = ("pidfd_send_signal",)
# event -> (indices of path arguments, indices of their dir_fd arguments or -1); all of them modify files.
_PATH_WRITES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.link": ((0, 1), (2, 3)),
    "os.mkdir": ((0,), (2,)),
    "os.remove": ((0,), (1,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.rmdir": ((0,), (1,)),
    "os.truncate": ((0,), (-1,)),
    "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), (-1,)),
    "os.removexattr": ((0,), (-1,)),
}
_PATH_READS = frozenset({"os.listdir", "os.scandir", "os.fwalk", "os.getxattr", "os.listxattr"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_MAX_FRAME = 64 * 1024 * 1024


class GuardError(PermissionError):
    """Raised by the guard; a plain ``PermissionError`` to the program."""


def _text(
    path: Any,
    _str: type = str,
    _bytes: type = bytes,
    _int: type = int,
    _isinstance: Callable[..., bool] = isinstance,
    _getitem: Callable[..., str] = str.__getitem__,
    _decode: Callable[..., str] = bytes.decode,
    _int_repr: Callable[[int], str] = int.__repr__,
    _full: slice = slice(None),
    _error: type = GuardError,
) -> str:
    """The exact ``str`` behind a path argument (a descriptor ``n`` becomes ``/proc/self/fd/n``), built from the
    underlying characters: a ``str`` subclass cannot lie through its methods."""
    if _isinstance(path, _int):
        return "/proc/self/fd/" + _int_repr(path)
    if _isinstance(path, _bytes):
        return _decode(path, "utf-8", "surrogateescape")
    if _isinstance(path, _str):
        return _getitem(path, _full)
    raise _error("sandbox: only str, bytes or descriptor paths are allowed")


def _resolve(
    path: Any,
    base: str,
    _text: Callable[[Any], str] = _text,
    _lstat: Callable[..., Any] = os.lstat,
    _readlink: Callable[..., str] = os.readlink,
    _islink: Callable[[int], bool] = stat.S_ISLNK,
    _error: type = GuardError,
    _oserror: type[OSError] = OSError,
) -> str:
    """The absolute path the kernel will use for ``path`` relative to ``base``, symlinks followed (a missing
    tail is taken as written)."""
    text = _text(path)
    todo = (text if text[:1] == "/" else base + "/" + text).split("/")
    todo.reverse()
    parts: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        candidate = "/" + "/".join([*parts, part])
        try:
            mode = _lstat(candidate).st_mode
        except _oserror:
            parts.append(part)
            continue
        if not _islink(mode):
            parts.append(part)
            continue
        links += 1
        if links > 40:
            raise _error("sandbox: too many levels of symbolic links")
        target = _readlink(candidate)
        if target[:1] == "/":
            parts = []
        pieces = target.split("/")
        pieces.reverse()
        todo += pieces
    return "/" + "/".join(parts)


def _dir_base(dir_fd: Any, cwd: str, _int: type = int, _isinstance: Callable[..., bool] = isinstance) -> str:
    """Where a relative path of a ``*at`` call starts: its ``dir_fd``'s directory, else the current one."""
    if _isinstance(dir_fd, _int) and dir_fd >= 0:
        return _resolve(dir_fd, cwd)
    return cwd


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root + "/")


def _allowed(
    real: str, writing: bool, root: str, own_proc: str, _inside: Callable[..., bool] = _inside
) -> bool:
    """No other process's ``/proc`` entries; writes only inside ``root``, to ``/dev/null`` or to descriptors
    the process holds that are no files (pipes: ``/proc/<own pid>/fd/pipe:[n]``)."""
    if real.startswith("/proc/") and real.split("/")[2].isdigit() and not _inside(real, own_proc):
        return False
    if not writing:
        return True
    return _inside(real, root) or real == "/dev/null" or real.startswith(own_proc + "/fd/")


def _check_open(
    args: tuple[Any, ...],
    root: str,
    own_proc: str,
    _text: Callable[[Any], str] = _text,
    _resolve: Callable[..., str] = _resolve,
    _allowed: Callable[..., bool] = _allowed,
    _inside: Callable[..., bool] = _inside,
    _getcwd: Callable[[], str] = os.getcwd,
    _stat: Callable[..., Any] = os.stat,
    _isdir: Callable[[int], bool] = stat.S_ISDIR,
    _isinstance: Callable[..., bool] = isinstance,
    _int: type = int,
    _str: type = str,
    _error: type = GuardError,
    _oserror: type[OSError] = OSError,
    _write_flags: int = _WRITE_FLAGS,
) -> None:
    """``open`` carries no ``dir_fd``: relative paths may not climb (``..``), directories outside cannot be
    opened (so no ``dir_fd`` outside exists), and the resolved path must be allowed."""
    path, mode, flags = args
    if _isinstance(path, _int):
        return  # wrapping a descriptor the program already holds
    writing = (flags is not None and (flags & _write_flags) != 0) or (
        _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
    )
    text = _text(path)
    relative = text[:1] != "/"
    if relative and ".." in text.split("/"):
        raise _error("sandbox: relative paths with '..' are not allowed")
    real = _resolve(text, _getcwd())
    if not _allowed(real, writing, root, own_proc):
        raise _error(f"sandbox: access to {real!r} is not allowed")
    if relative or _inside(real, root):
        return
    try:
        is_dir = _isdir(_stat(real).st_mode)
    except _oserror:
        return
    if is_dir:
        raise _error(f"sandbox: opening the directory {real!r} is not allowed")


def _check_paths(
    event: str,
    args: tuple[Any, ...],
    root: str,
    own_proc: str,
    _writes: tuple[tuple[str, tuple[tuple[int, ...], tuple[int, ...]]], ...] = tuple(_PATH_WRITES.items()),
    _reads: frozenset[str] = _PATH_READS,
    _check_open: Callable[..., None] = _check_open,
    _resolve: Callable[..., str] = _resolve,
    _dir_base: Callable[..., str] = _dir_base,
    _allowed: Callable[..., bool] = _allowed,
    _inside: Callable[..., bool] = _inside,
    _getcwd: Callable[[], str] = os.getcwd,
    _zip: Callable[..., Any] = zip,
    _error: type = GuardError,
) -> None:
    if event == "open":
        _check_open(args, root, own_proc)
    elif event == "os.chdir":
        real = _resolve(args[0], _getcwd())
        if not _inside(real, root):
            raise _error(f"sandbox: changing directory to {real!r} is not allowed")
    elif event in _reads:
        if args and args[0] is not None and not _allowed(_resolve(args[0], _getcwd()), False, root, own_proc):
            raise _error(f"sandbox: {event} of another process's entries is not allowed")
    elif event == "os.symlink":
        link = _resolve(args[1], _dir_base(args[2], _getcwd()))
        target = _resolve(args[0], link.rsplit("/", 1)[0] or "/")
        if not (_inside(link, root) and _inside(target, root)):
            raise _error("sandbox: symlinks must stay inside the sandbox directory")
    else:
        for name, (positions, dir_fds) in _writes:
            if name == event:
                for index, fd_index in _zip(positions, dir_fds):
                    base = _dir_base(args[fd_index] if fd_index >= 0 else None, _getcwd())
                    real = _resolve(args[index], base)
                    if not _allowed(real, True, root, own_proc):
                        raise _error(f"sandbox: {event} outside the sandbox directory: {real!r}")


def _make_guard(root: str, stdlib: str, pid: int) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook for a program whose working directory is ``root`` (see the module docstring). Every
    helper it calls is a module-level function whose state is in (immutable) default arguments."""

    def guard(
        event: str,
        args: tuple[Any, ...],
        _root: str = root,
        _stdlib: str = stdlib + "/",
        _own_proc: str = "/proc/" + str(pid),
        _denied: frozenset[str] = _DENIED_EVENTS,
        _denied_imports: frozenset[str] = _DENIED_IMPORTS,
        _check_paths: Callable[..., None] = _check_paths,
        _text: Callable[[Any], str] = _text,
        _resolve: Callable[..., str] = _resolve,
        _error: type = GuardError,
        _function: type = types.FunctionType,
        _type: type = type,
        _exit: Callable[[int], None] = os._exit,
        _write: Callable[[int, bytes], int] = os.write,
    ) -> None:
        if event in _denied:
            raise _error(f"sandbox: {event} is not allowed")
        if event == "import":
            name = _text(args[0])
            if name in _denied_imports or name[:5] == "_test":
                raise _error(f"sandbox: importing {name} is not allowed")
            if args[1] is not None and not _resolve(args[1], _root).startswith(_stdlib):
                raise _error("sandbox: native code from outside the standard library is not allowed")
        elif event in ("object.__setattr__", "object.__delattr__"):
            if _type(args[0]) is _function or _text(args[1]) in ("__cantrace__", "__fspath__"):
                raise _error("sandbox: changing a function's code or defaults is not allowed")
        elif event == "cpython._PySys_ClearAuditHooks":
            _write(2, b"sandbox: interpreter finalization reached; exiting\n")
            _exit(1)
        else:
            _check_paths(event, args, _root, _own_proc)

    return guard


def _strip_unaudited() -> None:
    """Remove the functions that reach other processes or create files without any audit event."""
    for module_name, names in _STRIPPED.items():
        module = sys.modules.get(module_name)
        for name in names:
            if module is not None and hasattr(module, name):
                delattr(module, name)
    import signal

    for module in (signal, sys.modules.get("_signal")):
        for name in _STRIPPED_SIGNAL:
            if module is not None and hasattr(module, name):
                delattr(module, name)


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
        stdlib = _resolve(os.path.dirname(os.__file__), "/")
        _strip_unaudited()
        sys.addaudithook(_make_guard(os.path.realpath(os.getcwd()), stdlib, os.getpid()))


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
