"""Attacks on the code sandbox, on both kinds of host it meets.

- ``jail``: this machine as it is (root with CAP_SYS_ADMIN): namespaces and the filesystem jail.
- ``bare``: the same machine with CAP_SYS_ADMIN dropped from the bounding set (``setpriv --bounding-set
  -sys_admin``, what Docker and Kubernetes give by default): no namespaces, so no jail; the sandbox refuses to
  run unless ``allow_unisolated``, and then runs programs as uid 65534 behind the in-process guard only.

Each attack program tries every route we know to do one harm; the test checks the harm itself (a secret it
printed, a file that exists, a process still alive, a connection the listener accepted), not the program's word.
The secrets are planted in a process of root *and* in one of uid 65534, whose ``/proc/<pid>/environ`` the
kernel would let a uid-65534 program read: only the guard stands in the way there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.rewards.config import SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv")
CONFIG = {"wall_timeout_s": 5.0, "cpu_time_s": 4, "memory_mb": 512}
DRIVER = """
import json, sys
from roll.pipelines.rewards.config import SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox, SandboxIsolationError
spec = json.loads(sys.argv[1])
try:
    sandbox = Sandbox(SandboxConfig(**spec["config"]))
except SandboxIsolationError as exc:
    print(json.dumps({"refused": str(exc)}))
    raise SystemExit(0)
runs = [sandbox.run(code) for code in spec["programs"]]
print(json.dumps({"isolation": sandbox.isolation, "uid": sandbox._launcher.uid,
                  "runs": [[r.exit_code, r.stdout, r.stderr] for r in runs]}))
"""

ENVIRON = """
import os
for pid in PIDS:
    attempts = {
        "plain": lambda: open(f"/proc/{pid}/environ", "rb").read(),
        "via /proc/self/..": lambda: open(f"/proc/self/../{pid}/environ", "rb").read(),
        "dir_fd": lambda: os.read(os.open(f"{pid}/environ", os.O_RDONLY, dir_fd=os.open("/proc", os.O_RDONLY)), 1 << 16),
        "fchdir": lambda: (os.fchdir(os.open(f"/proc/{pid}", os.O_RDONLY)), open("environ", "rb").read())[1],
        "chdir": lambda: (os.chdir(f"/proc/{pid}"), open("environ", "rb").read())[1],
        "listdir": lambda: os.listdir(f"/proc/{pid}/fd"),
    }
    for name, attempt in attempts.items():
        try:
            print(name, attempt())
        except BaseException as exc:
            print(name, "failed:", type(exc).__name__)
    try:  # read the process's memory where its environment lives (the top of the stack)
        maps = open(f"/proc/{pid}/maps").read()
        start, end = [int(x, 16) for x in next(l for l in maps.splitlines() if "[stack]" in l).split()[0].split("-")]
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(start)
            print("mem", mem.read(end - start))
    except BaseException as exc:
        print("mem failed:", type(exc).__name__)
"""

WRITE = """
import os, pathlib, gc, types
def attempts(target):
    folder, name = os.path.split(target)
    yield "open", lambda: open(target, "w").write("pwned")
    yield "pathlib", lambda: pathlib.Path(target).write_text("pwned")
    yield "dir_fd", lambda: os.write(os.open(name, os.O_CREAT | os.O_WRONLY, dir_fd=os.open(folder, os.O_RDONLY)), b"pwned")
    yield "fchdir", lambda: (os.fchdir(os.open(folder, os.O_RDONLY)), open(name, "w").write("pwned"))
    yield "chdir", lambda: (os.chdir(folder), open(name, "w").write("pwned"))
    yield "relative ..", lambda: open(os.path.relpath(target), "w").write("pwned")
    yield "dir_fd from a subdir", lambda: (os.makedirs("a/b", exist_ok=True), os.chdir("a/b"),
        os.write(os.open("../../" + os.path.relpath(target, os.path.realpath("../..")), os.O_CREAT | os.O_WRONLY,
                         dir_fd=os.open(os.path.realpath("../.."), os.O_RDONLY)), b"pwned"))
    yield "symlink", lambda: (os.symlink(target, "link"), open("link", "w").write("pwned"))
    yield "rename", lambda: (open("mine", "w").write("pwned"), os.rename("mine", target))
    yield "/proc/self/cwd", lambda: open("/proc/self/cwd/" + os.path.relpath(target), "w").write("pwned")
    class Lying(str):
        def startswith(self, *a): return True
        def __eq__(self, other): return True
        __hash__ = str.__hash__
    yield "str subclass", lambda: open(Lying(target), "w").write("pwned")
    def patched():
        os.getcwd = lambda: folder
        os.path.realpath = lambda p, **k: os.path.join(START, "x")
        return open(target, "w").write("pwned")
    yield "monkeypatched os", patched
    def rewired_guard():
        for f in gc.get_objects():
            if isinstance(f, types.FunctionType) and f.__name__ in ("guard", "_check_paths", "_allowed"):
                f.__code__ = (lambda *a, **k: None).__code__
        return open(target, "w").write("pwned")
    yield "rewired guard", rewired_guard
START = os.getcwd()
for target in TARGETS:
    for name, attempt in attempts(target):
        os.chdir(START)
        try:
            attempt()
            print(name, "wrote", target)
        except BaseException as exc:
            print(name, "failed:", type(exc).__name__)
"""

SPAWN = """
import os, sys
ARGV = ["/bin/sh", "-c", "sleep 300; echo TOKEN"]
def fork():
    if os.fork() == 0:
        os.setsid(); os.execv(ARGV[0], ARGV)
def posixsubprocess():
    import _posixsubprocess
    _posixsubprocess.fork_exec(ARGV, [ARGV[0].encode()], True, (), None, None, -1, -1, -1, -1, -1, -1,
                               *os.pipe(), False, True, -1, None, None, None, -1, None)
def posix_spawn():
    os.posix_spawn(ARGV[0], ARGV, {}, setsid=True)
def subprocess_():
    import subprocess
    subprocess.Popen(ARGV, start_new_session=True)
def system():
    os.system("setsid " + " ".join(repr(a) for a in ARGV) + " &")
def subinterpreter():
    import _xxsubinterpreters as interpreters
    interpreters.run_string(interpreters.create(), f"import os; os.posix_spawn({ARGV[0]!r}, {ARGV!r}, {{}}, setsid=True)")
def ctypes_():
    import ctypes
    libc = ctypes.CDLL(None)
    if libc.fork() == 0:
        libc.setsid(); os.execv(ARGV[0], ARGV)
def multiprocessing_():
    import multiprocessing
    multiprocessing.Process(target=os.execv, args=(ARGV[0], ARGV), daemon=False).start()
def forkpty():
    import pty
    if pty.fork()[0] == 0:
        os.execv(ARGV[0], ARGV)
for attempt in (fork, posixsubprocess, posix_spawn, subprocess_, system, subinterpreter, ctypes_, multiprocessing_, forkpty):
    try:
        attempt()
        print(attempt.__name__, "spawned")
    except BaseException as exc:
        print(attempt.__name__, "failed:", type(exc).__name__)
"""

CONNECT = """
import os, sys
def socket_():
    import socket
    socket.create_connection(("127.0.0.1", PORT), timeout=1)
def raw_socket():
    import _socket
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect(("127.0.0.1", PORT))
def connect_ex():
    import socket
    if socket.socket().connect_ex(("127.0.0.1", PORT)) != 0:
        raise OSError("connect_ex")
def subinterpreter():
    import _xxsubinterpreters as interpreters
    interpreters.run_string(interpreters.create(), f"import socket; socket.create_connection(('127.0.0.1', {PORT}))")
def ctypes_():
    import ctypes, socket
    s = socket.socket()
    addr = bytes([2, 0]) + (PORT).to_bytes(2, "big") + bytes([127, 0, 0, 1]) + bytes(8)
    if ctypes.CDLL(None).connect(s.fileno(), addr, 16) != 0:
        raise OSError("ctypes connect")
def settrace_then_connect():
    import socket
    sys.settrace(lambda *a: None)
    socket.create_connection(("127.0.0.1", PORT), timeout=1)
def audit_hook_then_connect():
    import socket
    sys.addaudithook(lambda *a: None)
    socket.create_connection(("127.0.0.1", PORT), timeout=1)
for attempt in (socket_, raw_socket, connect_ex, subinterpreter, ctypes_, settrace_then_connect, audit_hook_then_connect):
    try:
        attempt()
        print(attempt.__name__, "connected")
    except BaseException as exc:
        print(attempt.__name__, "failed:", type(exc).__name__)
"""


@dataclass
class Scene:
    """What the attacks aim at: planted secrets, write targets, a token for spawned processes, a listener."""

    secret: str
    pids: list[int]
    targets: list[Path]
    token: str
    listener: socket.socket

    def programs(self) -> list[str]:
        return [
            ENVIRON.replace("PIDS", repr(self.pids)),
            WRITE.replace("TARGETS", repr([str(t) for t in self.targets])),
            SPAWN.replace("TOKEN", self.token),
            CONNECT.replace("PORT", str(self.listener.getsockname()[1])),
        ]


@contextlib.contextmanager
def _staged() -> Iterator[Scene]:
    secret, token = f"PLANTED-{uuid.uuid4().hex}", f"SURVIVOR-{uuid.uuid4().hex}"
    env = {"PATH": "/usr/bin:/bin", "ROLL_PLANTED": secret}
    as_nobody = [SETPRIV or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    planted = [
        subprocess.Popen(["sleep", "300"], env=env),
        subprocess.Popen([*as_nobody, "sleep", "300"], env=env),
    ]
    checkout = Path(__file__).resolve().parents[2]
    targets = [
        Path(f"/tmp/roll-escape-{token}"),
        Path("/dev/shm") / f"roll-escape-{token}",
        checkout / f"escape-{token}",
    ]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    time.sleep(0.2)  # let the planted processes exec, so their environ is the planted one
    yield Scene(secret, [p.pid for p in planted], targets, token, listener)
    for process in planted:
        process.kill()
        process.wait()
    listener.close()
    for target in targets:
        target.unlink(missing_ok=True)
    for pid in _pids_with(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    with _staged() as staged:
        yield staged


def _run_on(host: str, programs: list[str], **config: Any) -> dict[str, Any]:
    settings = {**CONFIG, **config}
    if host == "jail":
        sandbox = Sandbox(SandboxConfig(**settings))
        runs = [sandbox.run(code) for code in programs]
        return {"isolation": sandbox.isolation, "uid": sandbox._launcher.uid,
                "runs": [[r.exit_code, r.stdout, r.stderr] for r in runs]}  # fmt: skip
    argv = [SETPRIV or "setpriv", "--bounding-set", "-sys_admin", "--", sys.executable, "-c", DRIVER]
    spec = json.dumps({"config": settings, "programs": programs})
    done = subprocess.run([*argv, spec], capture_output=True, text=True, timeout=300, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module", params=["jail", "bare"])
def attacked(request: pytest.FixtureRequest, scene: Scene) -> dict[str, Any]:
    """Every attack program run once on one kind of host; the tests below check what they left behind."""
    outcome = _run_on(request.param, scene.programs(), allow_unisolated=request.param == "bare")
    outcome["host"] = request.param
    outcome["survivors"] = _pids_with(scene.token)
    return outcome


def _pids_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and token.encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_each_host_is_what_it_claims(attacked: dict[str, Any]) -> None:
    jail = attacked["host"] == "jail"
    assert attacked["isolation"] == {"namespaces": jail, "filesystem": jail, "unprivileged_uid": True}
    assert attacked["uid"] == 65534


def test_other_processes_environments_are_not_read(attacked: dict[str, Any], scene: Scene) -> None:
    _, stdout, _ = attacked["runs"][0]
    assert stdout.count("failed:") == 7 * len(scene.pids), stdout  # every route to each process failed
    assert scene.secret not in stdout


def test_no_file_outside_the_working_directory_is_written(attacked: dict[str, Any], scene: Scene) -> None:
    _, stdout, _ = attacked["runs"][1]
    assert [t for t in scene.targets if t.exists()] == []
    assert " wrote " not in stdout and stdout.count("failed:") == 13 * len(scene.targets), stdout


def test_no_process_survives_the_run(attacked: dict[str, Any]) -> None:
    _, stdout, _ = attacked["runs"][2]
    assert attacked["survivors"] == []
    assert "spawned" not in stdout and stdout.count("failed:") == 9, stdout


def test_localhost_is_unreachable(attacked: dict[str, Any], scene: Scene) -> None:
    _, stdout, _ = attacked["runs"][3]
    assert "connected" not in stdout and stdout.count("failed:") == 7, stdout
    with pytest.raises(BlockingIOError):
        scene.listener.accept()  # nothing ever reached the listening port


def test_a_bare_host_refuses_without_the_opt_in() -> None:
    outcome = _run_on("bare", ["print(1)"])
    message = outcome["refused"]
    assert "allow_unisolated: true" in message and "NOT isolated" in message
    assert "as root" not in message.lower() and "run as root" not in message.lower()


def test_the_attacks_do_harm_on_a_bare_host_without_the_guard() -> None:
    """The attack programs are real: with the guard off, uid 65534 alone does not stop them on a bare host."""
    with _staged() as staged:
        outcome = _run_on("bare", staged.programs(), allow_unisolated=True, audit_hook=False)
        runs = outcome["runs"]
        assert staged.secret in runs[0][1]  # read from the uid-65534 process's environ
        assert (
            staged.targets[0].exists() and staged.targets[1].exists()
        )  # /tmp and /dev/shm are world-writable
        assert not staged.targets[2].exists()  # the checkout is root's: the uid holds there
        assert _pids_with(staged.token) != []
        staged.listener.accept()  # a connection reached the listening port


RAY_PROBE = """
import socket
for host, port in TARGETS:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print(host, port, "connected")
    except BaseException as exc:
        print(host, port, "failed:", type(exc).__name__)
"""


@pytest.mark.parametrize("host", ["jail", "bare"])
@pytest.mark.usefixtures("ray_local")
def test_rolls_own_ray_is_unreachable(host: str) -> None:
    """The GCS and the raylet of the session's Ray (roll starts it without a dashboard) accept connections from
    this process, and none from a sandboxed program on either kind of host."""
    import ray

    node = next(n for n in ray.nodes() if n["Alive"])
    gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    targets = [(gcs_host, int(gcs_port)), (node["NodeManagerAddress"], node["NodeManagerPort"])]
    for target in targets:
        socket.create_connection(target, timeout=5).close()  # reachable from here
    outcome = _run_on(host, [RAY_PROBE.replace("TARGETS", repr(targets))], allow_unisolated=host == "bare")
    _, stdout, _ = outcome["runs"][0]
    assert stdout.count("failed:") == len(targets) and "connected" not in stdout, stdout
