"""Run untrusted Python in a separate, limited process.

Two ways to run: :meth:`Sandbox.run` (a program with stdin; stdout, stderr and the exit code come back: stdin
cases, the agentic python tool) and :meth:`Sandbox.run_tests` (a program, then test source run against its
names by a harness the program cannot end, see or forge: assert cases; see :mod:`._sandbox_boot`).

What each layer guarantees (kernel-enforced unless marked *in-process*):

- **The jail** (the default, and required unless ``allow_unisolated``): where ``unshare`` can create
  namespaces (root with CAP_SYS_ADMIN, or unprivileged user namespaces), the program runs in fresh mount, pid
  and network namespaces (:mod:`._sandbox_jail`): its root holds only ``/usr`` and the interpreter's prefix,
  read-only, a private ``noexec`` tmpfs for cwd = ``HOME`` = ``TMPDIR`` and for ``/tmp``, and a ``/proc`` of
  its own pid namespace; its loopback is down, so nothing is reachable, 127.0.0.1 (and roll's Ray) included;
  when the first process of the pid namespace ends, every process in it is killed.
- **uid**: when the parent is root and ``drop_privileges`` is on, the bootstrap drops the program to
  ``sandbox_uid`` (``nobody``) before it runs (in ``test`` mode after forking the harness off, which stays
  apart and non-dumpable), so ``RLIMIT_NPROC`` applies and the kernel's permissions hold.
- **Wall clock, CPU, memory, files, processes, descriptors, output**: the child leads its own session and its
  group (and itself) get SIGKILL past ``wall_timeout_s``; ``RLIMIT_CPU``/``AS``/``FSIZE``/``NPROC``/``NOFILE``;
  stdout plus stderr beyond ``max_output_bytes`` kills the run.
- **Environment**: a fresh one (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``), never the parent's; ``python -I -S``.
- *In-process*, always (the guard of :mod:`._sandbox_boot`, an audit hook whose state the program cannot
  change): no sockets (connect, bind, sendto, name lookups), no processes by any route (fork, exec,
  ``posix_spawn``, ``subprocess``, ``_posixsubprocess``, ``os.system``, subinterpreters, ``ctypes``, native
  modules from outside the standard library), no tracing hooks, no signals to other processes, no writes outside
  cwd (``dir_fd``/``fchdir`` included), no access to other processes' ``/proc`` entries. It ends the program
  with ``os._exit``, so interpreter finalization (where hooks are cleared) never runs its code.

Where no jail can be built (a container without CAP_SYS_ADMIN, user namespaces off), :class:`Sandbox` refuses
to start unless ``allow_unisolated: true``; then the program runs with the uid drop (when root), the limits and
the guard, but it can read every host file its uid can read, and only the guard keeps it off the network. The
start-up log line says exactly what holds (:func:`describe`); :attr:`Sandbox.isolation` reports it as flags.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from roll.core.errors import RollError
from roll.pipelines.rewards._sandbox_jail import SANDBOX_DIR, jail_script
from roll.pipelines.rewards.config import SandboxConfig

logger = logging.getLogger(__name__)
_BOOT_SOURCE = (Path(__file__).parent / "_sandbox_boot.py").read_text(encoding="utf-8")
_GUARD_SOURCE = (Path(__file__).parent / "_sandbox_guard.py").read_text(encoding="utf-8")
_PROBE_TIMEOUT_S = 30.0
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxIsolationError(RollError, RuntimeError):
    """Full isolation was demanded (``require_isolation``) and this host cannot provide it."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. ``exit_code`` is ``None`` when the run was killed (timeout or output limit)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_limited: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited


@dataclass(frozen=True)
class TestsRun:
    """What one ``test``-mode run did: the harness's verdict per test (``None`` where it gave none before the run
    ended: a timeout or a crash) and the process's own result."""

    __test__ = False  # not a pytest class, despite the name

    verdicts: list[bool | None]
    errors: list[str | None]
    result: SandboxResult


@dataclass(frozen=True)
class _Launcher:
    """How to start the interpreter: an argv prefix, the interpreter, the uid the bootstrap drops to (``None``:
    it keeps the launcher's), what holds, and the jail script when the program runs in a filesystem jail."""

    prefix: tuple[str, ...]
    python: str
    uid: int | None
    isolation: dict[str, bool] = field(default_factory=dict)
    jail: str | None = None

    def argv(self, workdir: Path, size_mb: int) -> list[str]:
        """The argv prefix up to (and including) the interpreter for a run in ``workdir``."""
        if self.jail is None:
            return [*self.prefix, self.python]
        return [*self.prefix, "/bin/sh", "-c", self.jail, "sh", str(workdir), str(size_mb), self.python]


_PROBE_PROGRAM = "import collections, decimal, fractions, json, os, re\nprint(os.getuid())\n"


def _works(launcher: _Launcher) -> bool:
    """Whether a program runs through ``launcher``, under the expected uid, importing some of the stdlib."""
    with tempfile.TemporaryDirectory(prefix="roll-sandbox-probe-") as tmp:
        workdir = Path(tmp)
        _stage(workdir, _PROBE_PROGRAM, launcher.uid)
        settings: dict[str, Any] = {
            "mode": "run",
            "program": "program.py",
            "uid": launcher.uid,
            "rlimits": {},
            "audit_hook": True,
        }
        argv = [*launcher.argv(workdir, 1), "-I", "-S", "-B", "_boot.py", json.dumps(settings)]
        try:
            done = subprocess.run(
                argv, cwd=workdir, env={"PATH": _SAFE_PATH}, capture_output=True, timeout=_PROBE_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError):
            return False
    expected = str(launcher.uid) if launcher.uid is not None else None
    return done.returncode == 0 and (expected is None or done.stdout.decode().strip() == expected)


def _plans(python: str, namespaces: bool, jail: bool, drop: bool, uid: int) -> list[_Launcher]:
    """Launch plans, strongest first: jail + namespaces, namespaces, nothing (each with the uid drop when root)."""
    unshare = shutil.which("unshare", path=_SAFE_PATH) if namespaces else None
    root = os.geteuid() == 0
    as_uid = uid if root and drop else None
    unprivileged = as_uid is not None or not root
    plans: list[_Launcher] = []
    if unshare:
        user = () if root else ("--user", "--map-root-user")
        ns = (unshare, *user, "--net", "--pid", "--fork", "--kill-child")
        jail_ns = (unshare, *user, "--mount", "--propagation", "private", *ns[1 + len(user) :])
        full = {"namespaces": True, "filesystem": True, "unprivileged_uid": unprivileged}
        if jail:
            real = str(Path(python).resolve())  # a venv's symlink would point outside the jail
            plans.append(_Launcher(jail_ns, real, as_uid, full, jail_script(real, as_uid)))
        plans.append(_Launcher(ns, python, as_uid, {**full, "filesystem": False}))
    none = {"namespaces": False, "filesystem": False, "unprivileged_uid": unprivileged}
    return [*plans, _Launcher((), python, as_uid, none)]


@cache
def _launcher(python: str | None, namespaces: bool, jail: bool, drop: bool, uid: int) -> _Launcher:
    """The strongest launch this host allows for these settings; probed once per process."""
    candidates = (
        [python] if python else [sys.executable, *filter(None, [shutil.which("python3", path=_SAFE_PATH)])]
    )
    for plan_index in range(3):
        for interpreter in candidates:
            plans = _plans(interpreter, namespaces, jail, drop, uid)
            if plan_index < len(plans) and _works(plans[plan_index]):
                return plans[plan_index]
    raise SandboxIsolationError(
        f"code sandbox: no interpreter of {candidates} runs a program here, not even without namespaces"
        + (f" as uid {uid}" if os.geteuid() == 0 and drop else "")
        + ": set sandbox.python to an interpreter that user can read and execute"
    )


def describe(launcher: _Launcher) -> str:
    """One paragraph saying exactly what is and is not isolated for programs run through ``launcher``."""
    iso = launcher.isolation
    who = f"uid {launcher.uid}" if launcher.uid is not None else f"this process's uid {os.geteuid()}"
    held = [
        f"runs as {who}",
        "rlimits on CPU, memory, file size, processes, descriptors; wall clock; output cap",
    ]
    lost = []
    if iso["namespaces"]:
        held.append("own network namespace (no network at all, localhost included) and pid namespace")
    else:
        lost.append(
            "no network or pid namespace: only the in-process guard refuses sockets and new processes"
        )
    if iso["filesystem"]:
        held.append("filesystem jail (only the interpreter, read-only; private /tmp and working directory)")
    else:
        lost.append(
            "no filesystem jail: the program can read every host file its uid can read (datasets, checkouts); "
            "only the in-process guard refuses writes outside its directory and other processes' /proc entries"
        )
    if launcher.uid is None and os.geteuid() != 0:
        lost.append("same uid as this process: it could read and write whatever this process can")
    text = "isolated: " + "; ".join(held) + "."
    return text + (" NOT isolated: " + "; ".join(lost) + "." if lost else "")


def _stage(workdir: Path, code: str, uid: int | None) -> None:
    """Write the program and the bootstrap into ``workdir`` (plus the jail's empty mount point)."""
    (workdir / "program.py").write_text(code, encoding="utf-8")
    (workdir / "_boot.py").write_text(_BOOT_SOURCE, encoding="utf-8")
    (workdir / "_guard.py").write_text(_GUARD_SOURCE, encoding="utf-8")
    (workdir / "root").mkdir()
    if uid is not None:
        for path in (workdir, workdir / "program.py", workdir / "_boot.py", workdir / "_guard.py"):
            os.chown(path, uid, uid)


class Sandbox:
    """Runs one program at a time per call; safe to call from many threads at once."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        c = self.config
        self._launcher = _launcher(
            c.python, c.network_namespace, c.filesystem_jail, c.drop_privileges, c.sandbox_uid
        )
        missing = [name for name, held in self._launcher.isolation.items() if not held]
        summary = describe(self._launcher)
        if not self._launcher.isolation["filesystem"] and not c.allow_unisolated:
            raise SandboxIsolationError(
                f"code sandbox: no jail here ({summary}) The jail needs mount, pid and network namespaces: "
                "unshare must work (CAP_SYS_ADMIN, or unprivileged user namespaces allowed by the kernel and "
                "the container's seccomp profile), with network_namespace and filesystem_jail on. To run "
                "untrusted code without it anyway, set sandbox.allow_unisolated: true."
            )
        if c.require_isolation and missing:
            raise SandboxIsolationError(
                f"code sandbox: full isolation is required (sandbox.require_isolation: true) but this host "
                f"gives no {', '.join(missing)} isolation ({summary}) Fix: make unshare work (see "
                f"allow_unisolated), keep network_namespace/filesystem_jail/drop_privileges on, or set "
                f"require_isolation: false to accept the weaker sandbox."
            )
        if missing:
            logger.warning("code sandbox: running without %s isolation. %s", ", ".join(missing), summary)
        else:
            logger.info("code sandbox: %s", summary)

    @property
    def isolation(self) -> dict[str, bool]:
        """Which kernel layers this host gave: ``namespaces`` (network + pid), ``filesystem`` (the mount-namespace
        jail of :mod:`._sandbox_jail`: the host's files are invisible) and ``unprivileged_uid``."""
        return dict(self._launcher.isolation)

    def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Run ``code`` as ``__main__`` with ``stdin``; never raises for anything the program does."""
        with self._workdir(code) as workdir:
            return self._execute(workdir, stdin, {"mode": "run"}, None)[0]

    def run_tests(self, code: str, tests: list[str]) -> TestsRun:
        """Run ``code``, then each of ``tests`` (Python source, e.g. asserts) against its names in the harness
        of :mod:`._sandbox_boot`: a test passes only when the harness ran it to the end. The tests reach the
        harness through a pipe the program never holds; the wall clock covers the program and all tests."""
        nonce = secrets.token_hex(
            16
        )  # only the harness reads it: report lines without it are not the harness's
        payload = json.dumps({"nonce": nonce, "tests": tests}).encode()
        with self._workdir(code) as workdir:
            result, lines = self._execute(workdir, "", {"mode": "test"}, payload)
        verdicts: list[bool | None] = [None] * len(tests)
        errors: list[str | None] = [None] * len(tests)
        for line in lines:
            index = line.get("i")
            if line.get("nonce") != nonce or not isinstance(index, int) or not 0 <= index < len(tests):
                continue
            if verdicts[index] is None:  # the harness reports each test once: first line wins
                verdicts[index], errors[index] = line.get("ok") is True, str(line.get("error") or "") or None
        return TestsRun(verdicts, errors, result)

    @property
    def uids(self) -> tuple[int | None, int | None]:
        """(program uid, harness uid) that untrusted code and its judge run as here; ``None``: this process's own
        (not root, or ``drop_privileges`` off)."""
        uid = self._launcher.uid
        return uid, (self.config.harness_uid if uid is not None else None)

    def start_jailed(self, program: str, argument: str, size_mb: int) -> JailedProcess:
        """Start ``program`` (trusted, stdlib-only Python) as root of a fresh jail whose ``/sandbox`` (its cwd) and
        ``/tmp`` are private tmpfs of ``size_mb`` MiB each, with ``argument`` as its one argument, and return at
        once: it lives until :meth:`JailedProcess.close` (the agentic terminal's per-episode shell). It is *not*
        dropped to the sandbox uid nor guarded: it must drop whatever it runs for others itself. Raises
        :class:`SandboxIsolationError` where this host builds no filesystem jail."""
        launcher = self._launcher
        if launcher.jail is None:
            raise SandboxIsolationError(
                f"a jailed program needs the filesystem jail, which this host does not give ({describe(launcher)})"
            )
        workdir = Path(tempfile.mkdtemp(prefix="roll-jail-", dir=self.config.workdir_root))
        try:
            _stage(workdir, program, launcher.uid)
            argv = [*launcher.argv(workdir, size_mb), "-I", "-S", "-B", "program.py", argument]
            env = {"PATH": _SAFE_PATH, "HOME": SANDBOX_DIR, "TMPDIR": SANDBOX_DIR, "LANG": "C.UTF-8"}
            proc = subprocess.Popen(
                argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return JailedProcess(proc, workdir, *self.uids)

    @contextlib.contextmanager
    def _workdir(self, code: str) -> Iterator[Path]:
        workdir = Path(tempfile.mkdtemp(prefix="roll-sandbox-", dir=self.config.workdir_root))
        try:
            _stage(workdir, code, self._launcher.uid)
            yield workdir
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _rlimits(self) -> dict[str, tuple[int, int]]:
        c, mb = self.config, 1024 * 1024
        return {
            "RLIMIT_CPU": (c.cpu_time_s, c.cpu_time_s + 1),  # SIGXCPU first, SIGKILL a second later
            "RLIMIT_AS": (c.memory_mb * mb, c.memory_mb * mb),
            "RLIMIT_FSIZE": (c.file_size_mb * mb, c.file_size_mb * mb),
            "RLIMIT_NPROC": (c.max_processes, c.max_processes),
            "RLIMIT_NOFILE": (c.max_open_files, c.max_open_files),
            "RLIMIT_CORE": (0, 0),
        }

    def _execute(
        self, workdir: Path, stdin: str, mode: dict[str, str], tests: bytes | None
    ) -> tuple[SandboxResult, list[dict[str, Any]]]:
        launcher = self._launcher
        tests_read, tests_write = os.pipe() if tests is not None else (-1, -1)
        report_read, report_write = os.pipe() if tests is not None else (-1, -1)
        settings = {
            **mode,
            "program": "program.py",
            "uid": launcher.uid,
            "harness_uid": self.config.harness_uid if launcher.uid is not None else None,
            "rlimits": self._rlimits(),
            "audit_hook": self.config.audit_hook,
            "tests_fd": tests_read,
            "report_fd": report_write,
        }
        argv = [*launcher.argv(workdir, 4 * self.config.file_size_mb), "-I", "-S", "-B", "_boot.py"]
        home = SANDBOX_DIR if launcher.jail else str(workdir)
        env = {"PATH": _SAFE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        started = time.monotonic()
        passed = tuple(fd for fd in (tests_read, report_write) if fd >= 0)
        try:
            proc = subprocess.Popen(
                [*argv, json.dumps(settings)], cwd=workdir, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                pass_fds=passed,
            )  # fmt: skip
        finally:
            for fd in passed:
                os.close(fd)
        try:
            if tests is not None:
                threading.Thread(target=_write_all, args=(tests_write, tests), daemon=True).start()
            out, err, report, timed_out, limited = _communicate(
                proc, stdin.encode(), self.config, report_read if tests is not None else None
            )
        finally:
            _kill_group(proc)
            if report_read >= 0:
                os.close(report_read)
        code = None if (timed_out or limited) else proc.returncode
        text = (out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        result = SandboxResult(code, *text, timed_out, limited, time.monotonic() - started)
        return result, _report_lines(report)


@dataclass
class JailedProcess:
    """A trusted program running as root of a fresh jail (see :meth:`Sandbox.start_jailed`): talk to it through
    ``proc.stdin``/``proc.stdout``; ``agent_uid`` is the uid it should run untrusted commands as (``None``: the
    host is not root, the jail is a user namespace, and the program must shed its capabilities another way)."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    agent_uid: int | None
    checker_uid: int | None

    def close(self) -> None:
        """Kill the jail (its pid namespace and every process in it) and remove the host's staging folder."""
        try:
            _kill_group(self.proc)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    """Feed the tests to the harness's pipe, then close it (the harness reads to end of file)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # the harness is gone: the run fails on its own
    finally:
        os.close(fd)


def _report_lines(report: bytes) -> list[dict[str, Any]]:
    lines = []
    for raw in report.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None  # guaranteed by stdin=PIPE
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the program exited or closed stdin without reading everything: its business


def _communicate(
    proc: subprocess.Popen[bytes], data: bytes, config: SandboxConfig, report_fd: int | None
) -> tuple[bytes, bytes, bytes, bool, bool]:
    """Feed stdin, collect output up to the cap (and the harness's report), until exit or the deadline."""
    threading.Thread(target=_feed, args=(proc, data), daemon=True).start()
    deadline = time.monotonic() + config.wall_timeout_s
    chunks: dict[int, list[bytes]] = {1: [], 2: [], 3: []}
    total, timed_out, limited = 0, False, False
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None  # stdout/stderr=PIPE
        sel.register(proc.stdout, selectors.EVENT_READ, 1)
        sel.register(proc.stderr, selectors.EVENT_READ, 2)
        if report_fd is not None:
            sel.register(report_fd, selectors.EVENT_READ, 3)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                chunks[key.data].append(chunk)
                total += len(chunk) if key.data != 3 else 0
            if total > config.max_output_bytes:
                limited = True
                break
    if not (timed_out or limited):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True  # closed its pipes but kept running
    cap = config.max_output_bytes
    out, err = b"".join(chunks[1])[:cap], b"".join(chunks[2])[:cap]
    return out, err, b"".join(chunks[3]), timed_out, limited


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (it leads its own session) and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # in case it left its group
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


__all__ = ["JailedProcess", "Sandbox", "SandboxIsolationError", "SandboxResult", "TestsRun", "describe"]
