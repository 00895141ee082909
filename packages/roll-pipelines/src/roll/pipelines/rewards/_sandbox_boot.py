"""The bootstrap that runs *inside* the sandbox, before the untrusted program (stdlib only, no roll imports).

:mod:`roll.pipelines.rewards.sandbox` copies this file's source next to the program and runs
``python -I -S -B _boot.py '<settings json>' program.py``. It sets the resource limits, installs an audit hook, then
executes the program as ``__main__``. The audit hook is an in-process guard (CPython's ``sys.addaudithook``):
it cannot be removed from Python code, but native code could bypass it, which is why it also refuses to load
``ctypes`` and to start processes. Kernel-enforced limits (rlimits, namespaces, the uid) are the hard layer.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
from collections.abc import Callable
from typing import Any

_DENIED = frozenset(
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
        "resource.setrlimit",
        "resource.prlimit",
    }
)
_PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.mkdir",
        "os.rmdir",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "os.utime",
        "os.chdir",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.move",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_WRITABLE_DEVICES = ("/dev/null",)


def _make_hook(root: str) -> Callable[[str, tuple[Any, ...]], None]:
    def inside(path: Any) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: the check happened when it was opened
        real = os.path.realpath(os.path.join(root, os.fsdecode(path)))
        return real == root or real.startswith(root + os.sep) or real in _WRITABLE_DEVICES

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in _DENIED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = bool(mode and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing outside the sandbox directory: {path!r}")
            if isinstance(path, (str, bytes)) and os.fsdecode(path).endswith("/environ"):
                raise PermissionError("sandbox: reading process environments is not allowed")
        elif event in _PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    raise PermissionError(f"sandbox: {event} outside the sandbox directory: {arg!r}")

    return hook


def main() -> None:
    settings = json.loads(sys.argv[1])
    program = sys.argv[2]
    for name, (soft, hard) in settings["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    sys.argv = [program]
    if settings["audit_hook"]:
        sys.addaudithook(_make_hook(os.path.realpath(os.getcwd())))
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
