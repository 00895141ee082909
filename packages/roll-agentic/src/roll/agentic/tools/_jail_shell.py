"""The shell server that runs *inside* a terminal episode's jail (stdlib only, no roll imports).

:class:`roll.agentic.tools.bash.Workspace` starts it through the code sandbox's jail
(:meth:`roll.pipelines.rewards.sandbox.Sandbox.start_jailed`) as ``python -I -S -B program.py '<settings>'``. It is
the first process of the episode's pid namespace (pid 1) and root of its mount namespace; the episode's scratch
filesystem is the jail's size-capped tmpfs at ``/sandbox`` (plus its ``/tmp``), which lives exactly as long as this
process: when it exits, the kernel kills every process of the namespace and the tmpfs is gone.

It reads one JSON request per line on stdin and answers one JSON line on stdout; nothing it starts ever holds
those two pipes, so only the host talks to it. Requests:

- ``run``: ``bash -c COMMAND`` in ``/sandbox`` as the agent (the sandbox uid when the host is root, else a nested
  user namespace without capabilities), with rlimits, a fresh environment, stdin ``/dev/null``, stdout and stderr
  merged and capped, a wall deadline. When the command ends (or is killed), every other process of the namespace
  is killed too (``kill(-1, SIGKILL)`` from pid 1) and reaped: nothing the agent starts outlives its call.
- ``check``: the checker, after the episode: all agent processes are already dead; ``/proc`` is unmounted (so no
  symlink the agent left can lead the checker to its own environment or descriptors); then ``bash -c CHECKER``
  runs as the checker uid (another unprivileged uid) with the expected values in its environment. The checker's
  text and values arrive only now, over the host's pipe: they were never in the agent's reach.
- ``close``: exit (the namespace and its filesystem die with this process).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

_BASH = "/bin/bash"
_PATH = "/usr/local/bin:/usr/bin:/bin"
_WORKDIR = "/sandbox"


def _child(
    command: str, uid: int | None, nested_userns: bool, env: dict[str, str], limits: Any, wfd: int
) -> None:
    """In the forked child: become the agent (or checker) and exec bash; never returns."""
    try:
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(wfd, 1)
        os.dup2(wfd, 2)
        os.closerange(3, 1 << 16)
        os.chdir(_WORKDIR)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        for name, (soft, hard) in limits.items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        argv = ["bash", "--norc", "--noprofile", "-c", command]
        if (
            nested_userns
        ):  # no root host: a user namespace of its own leaves the agent no capability over ours
            os.execve("/usr/bin/unshare", ["unshare", "--user", "--", _BASH, *argv[1:]], env)
        os.execve(_BASH, argv, env)
    except BaseException:
        pass
    os._exit(127)


def _kill_all() -> None:
    """SIGKILL every other process of this pid namespace (we are its pid 1) and reap them all."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _collect(pid: int, rfd: int, timeout_s: float, cap: int) -> tuple[bytes, int | None, bool, bool]:
    """Output of ``pid`` until it exits (and its pipe is drained), the deadline or the cap."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    total, status, timed_out, limited = 0, None, False, False
    while True:
        if status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = status is None
            break
        ready, _, _ = select.select([rfd], [], [], 0.0 if status is not None else min(remaining, 0.05))
        if not ready:
            if status is not None:
                break  # exited and nothing more to read now: a background child holding the pipe is not waited for
            continue
        chunk = os.read(rfd, 65536)
        if not chunk:
            if status is None:
                continue
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            limited = True
            break
    return b"".join(chunks)[:cap], status if not (timed_out or limited) else None, timed_out, limited


def _execute(settings: dict[str, Any], request: dict[str, Any], as_checker: bool) -> dict[str, Any]:
    uid = settings["checker_uid"] if as_checker else settings["agent_uid"]
    nested = settings["nested_userns"] and not as_checker
    env = {"PATH": _PATH, "HOME": _WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    limits = {k: tuple(v) for k, v in settings["rlimits"].items()}
    started = time.monotonic()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(str(request["command"]), uid, nested, env, limits, wfd)
    os.close(wfd)
    try:
        out, code, timed_out, limited = _collect(
            pid, rfd, float(request["timeout_s"]), int(settings["max_output"])
        )
    finally:
        os.close(rfd)
        _kill_all()  # the command, and whatever it left running
    return {
        "exit_code": code,
        "output": out.decode("utf-8", "replace"),
        "timed_out": timed_out,
        "output_limited": limited,
        "duration_s": time.monotonic() - started,
    }


def _unmount_proc() -> bool:
    """Detach ``/proc``: the checker then cannot be led (by a symlink the agent left) to its own environment."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.umount2(b"/proc", 2)) == 0 or not os.path.exists("/proc/self")  # MNT_DETACH
    except (OSError, AttributeError):
        return False


def _make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: an agent of our uid (user-namespace hosts) cannot open our /proc entries."""
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    settings = json.loads(sys.argv[1])
    for name in (
        "program.py",
        "_boot.py",
        "_guard.py",
    ):  # the jail stages them into /sandbox: not the agent's
        with contextlib.suppress(OSError):
            os.remove(os.path.join(_WORKDIR, name))
    _make_undumpable()
    checked = False
    _answer({"ready": os.getpid() == 1})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        if op == "close":
            break
        if op == "run" and not checked:
            _answer(_execute(settings, request, as_checker=False))
        elif op == "check" and not checked:
            checked = True  # after the checker, nothing else runs: the verdict is final
            _kill_all()
            if not _unmount_proc():
                _answer({"error": "could not unmount /proc before the checker"})
                continue
            _answer(_execute(settings, request, as_checker=True))
        else:
            _answer({"error": f"refused request {op!r}" + (" after the check" if checked else "")})
    _kill_all()


if __name__ == "__main__":
    main()
