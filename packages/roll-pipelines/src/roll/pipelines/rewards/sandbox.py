"""Run untrusted Python in a separate, limited process. No root-only features are required.

What each layer guarantees (kernel-enforced unless marked *in-process*):

- **Wall clock**: the child starts in its own session (``start_new_session=True``); past ``wall_timeout_s`` its
  whole process group gets SIGKILL. With a pid namespace (below), killing its first process ends every process
  in the namespace, even ones that left the group.
- **CPU, memory, files, processes, descriptors**: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``,
  ``RLIMIT_NPROC`` and ``RLIMIT_NOFILE``, set by the bootstrap before the program runs. The kernel ignores
  ``RLIMIT_NPROC`` for root, so when the parent is root and ``drop_privileges`` is on, the program runs as
  ``sandbox_uid`` (``nobody``), using an interpreter that user can execute (probed once).
- **Output**: stdout plus stderr beyond ``max_output_bytes`` kills the run (pipes are not covered by
  ``RLIMIT_FSIZE``).
- **Network**: when ``unshare`` can create namespaces (root, or unprivileged user namespaces), the program runs
  in a fresh network namespace whose loopback is down, so nothing is reachable, 127.0.0.1 included. Always, and
  *in-process*: an audit hook refuses ``socket.connect``/``bind``/``sendto``/name lookups.
- **Filesystem**: where a mount namespace can be made (``filesystem_jail``), the program runs in a jail
  (:mod:`._sandbox_jail`) whose root holds only ``/usr`` and the interpreter's prefix, read-only, a private
  tmpfs for cwd = ``HOME`` = ``TMPDIR`` and for ``/tmp``, and a ``/proc`` of its own pid namespace: no host
  file outside those (data, checkouts, answers files, home directories) can even be read. Without it, cwd is a
  fresh host temp dir and world-readable host files stay readable (a warning says so at start-up;
  ``require_isolation`` refuses to run instead). *In-process*: the audit hook refuses opening for write,
  renaming, deleting, linking or chmod-ing anything outside cwd (symlinks resolved), and reading
  ``/proc/*/environ``. As ``nobody``, file permissions also apply.
- **Environment**: the child gets a fresh environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``), never the
  parent's; ``python -I`` ignores ``PYTHON*`` variables and the user site.
- *In-process*: the hook refuses ``fork``/``exec``/``subprocess``/``os.kill``, ``ctypes`` (a way around the hook)
  and raising resource limits.

The audit hook cannot be removed from Python code; only native code could bypass it, and loading native code
through ``ctypes`` is refused. :attr:`Sandbox.isolation` reports which kernel layers this host provided.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from roll.core.errors import RollError
from roll.pipelines.rewards._sandbox_jail import SANDBOX_DIR, jail_script
from roll.pipelines.rewards.config import SandboxConfig

logger = logging.getLogger(__name__)
_BOOT_SOURCE = (Path(__file__).parent / "_sandbox_boot.py").read_text(encoding="utf-8")
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
class _Launcher:
    """How to start the interpreter: an argv prefix, the interpreter, the uid that will own the workdir, and the
    jail script when the program runs in a filesystem jail (see :mod:`._sandbox_jail`)."""

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


def _probe(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, env={"PATH": _SAFE_PATH}, capture_output=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _works(launcher: _Launcher) -> bool:
    if not launcher.prefix:
        return True
    with tempfile.TemporaryDirectory(prefix="roll-sandbox-probe-") as tmp:
        workdir = Path(tmp)
        _stage(workdir, "", launcher.uid)
        return _probe([*launcher.argv(workdir, 1), "-I", "-S", "-c", "pass"])


def _plans(python: str, namespaces: bool, jail: bool, drop: bool, uid: int) -> list[_Launcher]:
    """Launch plans, strongest first: jail + namespaces + uid, namespaces + uid, namespaces, nothing."""
    unshare = shutil.which("unshare", path=_SAFE_PATH) if namespaces else None
    root = os.geteuid() == 0
    plans: list[_Launcher] = []
    if unshare:
        user = () if root else ("--user", "--map-root-user")
        ns = (unshare, *user, "--net", "--pid", "--fork", "--kill-child")
        jail_ns = (unshare, *user, "--mount", "--propagation", "private", *ns[1 + len(user) :])
        ids = ("--setgid", str(uid), "--setuid", str(uid))
        dropped = root and drop
        as_uid = uid if dropped else None
        full = {"namespaces": True, "filesystem": True, "unprivileged_uid": dropped or not root}
        if jail:
            real = str(Path(python).resolve())  # a venv's symlink would point outside the jail
            plans.append(_Launcher(jail_ns, real, as_uid, full, jail_script(real, as_uid)))
        if dropped:
            plans.append(_Launcher((*ns, *ids), python, uid, {**full, "filesystem": False}))
        plans.append(_Launcher(ns, python, None, {**full, "filesystem": False, "unprivileged_uid": not root}))
    none = {"namespaces": False, "filesystem": False, "unprivileged_uid": not root}
    return [*plans, _Launcher((), python, None, none)]


@cache
def _launcher(python: str | None, namespaces: bool, jail: bool, drop: bool, uid: int) -> _Launcher:
    """The strongest launch this host allows for these settings; probed once per process, warns when partial."""
    candidates = (
        [python] if python else [sys.executable, *filter(None, [shutil.which("python3", path=_SAFE_PATH)])]
    )
    for plan_index in range(4):
        for interpreter in candidates:
            plans = _plans(interpreter, namespaces, jail, drop, uid)
            if plan_index < len(plans) and _works(plans[plan_index]):
                chosen = plans[plan_index]
                missing = [name for name, held in chosen.isolation.items() if not held]
                if missing:
                    logger.warning(
                        "code sandbox: running without %s isolation (%s): turned off in the config or impossible "
                        "on this host; Sandbox.isolation says what holds. Run as root or enable unprivileged user namespaces "
                        "(sysctl kernel.unprivileged_userns_clone=1) for full isolation.",
                        ", ".join(missing), chosen.isolation,
                    )  # fmt: skip
                return chosen
    raise AssertionError("unreachable: the last plan always succeeds")  # pragma: no cover


def _stage(workdir: Path, code: str, uid: int | None) -> None:
    """Write the program and the bootstrap into ``workdir`` (plus the jail's empty mount point)."""
    (workdir / "program.py").write_text(code, encoding="utf-8")
    (workdir / "_boot.py").write_text(_BOOT_SOURCE, encoding="utf-8")
    (workdir / "root").mkdir()
    if uid is not None:
        for path in (workdir, workdir / "program.py", workdir / "_boot.py"):
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
        if c.require_isolation and missing:
            raise SandboxIsolationError(
                f"code sandbox: full isolation is required (sandbox.require_isolation: true) but this host "
                f"gives no {', '.join(missing)} isolation ({self._launcher.isolation}). Fix: run as root or "
                f"enable unprivileged user namespaces, keep network_namespace/filesystem_jail/drop_privileges on, "
                f"or set require_isolation: false to accept the weaker sandbox."
            )

    @property
    def isolation(self) -> dict[str, bool]:
        """Which kernel layers this host gave: ``namespaces`` (network + pid), ``filesystem`` (the mount-namespace
        jail of :mod:`._sandbox_jail`: the host's files are invisible) and ``unprivileged_uid``."""
        return dict(self._launcher.isolation)

    def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Run ``code`` as ``__main__`` with ``stdin``; never raises for anything the program does."""
        workdir = Path(tempfile.mkdtemp(prefix="roll-sandbox-", dir=self.config.workdir_root))
        try:
            _stage(workdir, code, self._launcher.uid)
            return self._execute(workdir, stdin)
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

    def _settings(self) -> str:
        return json.dumps({"rlimits": self._rlimits(), "audit_hook": self.config.audit_hook})

    def _execute(self, workdir: Path, stdin: str) -> SandboxResult:
        launcher = self._launcher
        argv = [
            *launcher.argv(workdir, 4 * self.config.file_size_mb),
            "-I",
            "-S",
            "-B",
            "_boot.py",
            self._settings(),
            "program.py",
        ]
        home = SANDBOX_DIR if launcher.jail else str(workdir)
        env = {"PATH": _SAFE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        try:
            out, err, timed_out, limited = _communicate(proc, stdin.encode(), self.config)
        finally:
            _kill_group(proc)
        code = None if (timed_out or limited) else proc.returncode
        text = (out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        return SandboxResult(code, *text, timed_out, limited, time.monotonic() - started)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None  # guaranteed by stdin=PIPE
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the program exited or closed stdin without reading everything: its business


def _communicate(
    proc: subprocess.Popen[bytes], data: bytes, config: SandboxConfig
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin, collect output up to the cap, until exit or the wall-clock deadline."""
    threading.Thread(target=_feed, args=(proc, data), daemon=True).start()
    deadline = time.monotonic() + config.wall_timeout_s
    chunks: dict[int, list[bytes]] = {1: [], 2: []}
    total, timed_out, limited = 0, False, False
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None and proc.stderr is not None  # stdout/stderr=PIPE
        sel.register(proc.stdout, selectors.EVENT_READ, 1)
        sel.register(proc.stderr, selectors.EVENT_READ, 2)
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
                total += len(chunk)
            if total > config.max_output_bytes:
                limited = True
                break
    if not (timed_out or limited):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True  # closed its pipes but kept running
    cap = config.max_output_bytes
    return b"".join(chunks[1])[:cap], b"".join(chunks[2])[:cap], timed_out, limited


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (it leads its own session) and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


__all__ = ["Sandbox", "SandboxIsolationError", "SandboxResult"]
