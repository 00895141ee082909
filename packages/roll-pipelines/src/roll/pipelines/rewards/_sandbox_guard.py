"""The guard of the code sandbox: an audit hook in the untrusted interpreter (stdlib only, no roll imports).

:mod:`roll.pipelines.rewards.sandbox` copies this file next to the bootstrap (:mod:`._sandbox_boot`), which
installs :func:`make_guard`'s hook before the program runs. It refuses: sockets (connect, bind, sendto, name
lookups), processes by any route (``fork``, ``exec``, ``posix_spawn``, ``subprocess``, ``_posixsubprocess``,
``os.system``, subinterpreters, ``ctypes``, native extensions from outside the standard library), tracing hooks,
writes outside the working directory (paths resolved the way the kernel will: relative to ``dir_fd`` or the
current directory, symlinks followed; relative ``open`` paths may not climb with ``..``, since ``open``'s audit
event carries no ``dir_fd``), directory descriptors outside it (so ``dir_fd``/``fchdir`` cannot reach out), and
other processes' ``/proc`` entries. :func:`strip_unaudited` removes the functions that act on other processes or
make files without raising any audit event (``pidfd_open``, ``pidfd_send_signal``, ``mkfifo``, ``mknod``,
``setsid``...).

Tamper-proofing: every function the hook calls is a module-level function whose state sits in (immutable)
positional default arguments; they use no globals, no closures and only builtin functions captured at start-up,
so monkeypatching ``os``, ``posixpath`` or ``builtins`` does not change what the hook checks. Reassigning a
function's ``__code__`` or defaults and installing a trace function (the only ways to reach into the hook) are
refused by the hook itself. It also ends the process if interpreter finalization begins (audit hooks are
cleared there), which the bootstrap never lets happen.
"""

from __future__ import annotations

import os
import stat
import sys
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


def resolve(
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
        return resolve(dir_fd, cwd)
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
    _resolve: Callable[..., str] = resolve,
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
    _resolve: Callable[..., str] = resolve,
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


def make_guard(root: str, stdlib: str, pid: int) -> Callable[[str, tuple[Any, ...]], None]:
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
        _resolve: Callable[..., str] = resolve,
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


def strip_unaudited() -> None:
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


__all__ = ["GuardError", "make_guard", "resolve", "strip_unaudited"]
