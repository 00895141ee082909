"""Reward hacks against the code reward's assert cases, written as a policy would write them: each must score 0.

The first five are the ones issue 27 measured on the old reward (asserts appended to the program, a case
passed on exit status 0): each scored 1.0 there. The rest try the other doors: patched builtins, a patched
``sys.exit``/``excepthook``, a silenced ``print``, killing or impersonating the harness, hunting the tests in
memory, on disk or in other processes, objects that are truthy or equal to anything, shadowing the test's
builtins. The wrong function subtracts instead of adding, so only a working hack could pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.rewards import sandbox as sandbox_module
from roll.pipelines.rewards.code import CodeReward
from roll.pipelines.rewards.config import CodeRewardConfig, SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox
from roll.pipelines.rewards.types import RewardRequest

ASSERTS = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]}
WRONG = "def add(a, b):\n    return a - b\n"
ANSWERS_FROM = (  # the answer for (a, b) parsed out of whatever text holds the tests
    "import re\n"
    "def answer_from(text, a, b):\n"
    "    for x, y, want in re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', text):\n"
    "        if (int(x), int(y)) == (a, b):\n"
    "            return int(want)\n"
    "    return None\n"
)
HACKS = {
    # --- measured in the issue: 1.0 each before the harness split
    "sys.exit(0) after a wrong body": WRONG + "import sys\nsys.exit(0)\n",
    "atexit handler calling os._exit(0)": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "a thread forcing exit 0 at shutdown": WRONG + "import os, threading, time\n"
    "def force():\n"
    "    while threading.main_thread().is_alive():\n"
    "        time.sleep(0.001)\n"
    "    os._exit(0)\n"
    "threading.Thread(target=force).start()\n",
    "an int whose __eq__ is always true": "class Yes(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return Yes(0)\n",
    "reading the asserts appended to its own file": ANSWERS_FROM + "import sys\n"
    "def add(a, b):\n    return answer_from(open(sys.argv[0]).read(), a, b)\n",
    # --- more doors
    "patching builtins.AssertionError": WRONG
    + "import builtins\nclass Never(BaseException):\n    pass\nbuiltins.AssertionError = Never\n",
    "sys.exit and excepthook patched to exit 0": WRONG
    + "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\nsys.exit = lambda *a: os._exit(0)\n",
    "print silenced": WRONG + "import builtins\nbuiltins.print = lambda *a, **k: None\n",
    "killing the parent": WRONG + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "killing the parent from inside the call": "import os, signal\n"
    "def add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "SIGALRM handler calling os._exit(0)": WRONG
    + "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.05)\n",
    "SystemExit(0) from inside the call": "def add(a, b):\n    raise SystemExit(0)\n",
    "os._exit(0) from inside the call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "truthy object for any comparison": "class Any:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __bool__(self):\n        return True\n"
    "def add(a, b):\n    return Any()\n",
    "list subclass equal to everything": "class L(list):\n"
    "    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return L()\n",
    "forging a report on every descriptor": WRONG + "import json, os\n"
    "for fd in range(3, 64):\n"
    "    for i in range(3):\n"
    "        try:\n"
    "            os.write(fd, (json.dumps({'i': i, 'ok': True, 'error': None}) + '\\n').encode())\n"
    "        except OSError:\n"
    "            pass\n",
    "opening the harness's descriptors through /proc": WRONG + "import json, os\n"
    "for fd in range(64):\n"
    "    try:\n"
    "        w = os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY)\n"
    '        os.write(w, b\'{"i": 0, "ok": true}\\n{"i": 1, "ok": true}\\n{"i": 2, "ok": true}\\n\')\n'
    "    except OSError:\n"
    "        pass\n",
    "hunting the tests in memory, stdin and the parent": ANSWERS_FROM + "import gc, os, sys\n"
    "def hunt():\n"
    "    texts = [o for o in gc.get_objects() if isinstance(o, str) and 'add(' in o]\n"
    "    for path in (f'/proc/{os.getppid()}/cmdline', f'/proc/{os.getppid()}/environ', '/proc/1/cmdline'):\n"
    "        try:\n            texts.append(open(path, errors='replace').read())\n"
    "        except OSError:\n            pass\n"
    "    texts.append(sys.stdin.read())\n"
    "    return '\\n'.join(texts)\n"
    "def add(a, b):\n    return answer_from(hunt(), a, b)\n",
    "shadowing a builtin the test uses": "def add(a, b):\n    return a - b\ndef abs(x):\n    return 0\n",
}


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(
        CodeRewardConfig(
            sandbox=SandboxConfig(wall_timeout_s=5.0, cpu_time_s=4, memory_mb=512), max_concurrency=2
        )
    )


def test_every_hack_scores_zero(reward: CodeReward) -> None:
    names = list(HACKS)
    metadata = {"shadowing a builtin the test uses": {"asserts": ["assert abs(add(1, 2) - 3) < 1e-9"] * 3}}
    results = reward.score([RewardRequest(HACKS[n], metadata=metadata.get(n, ASSERTS)) for n in names])
    scores = {name: result.score for name, result in zip(names, results)}
    assert scores == dict.fromkeys(names, 0.0)
    assert all(result.info["error"] for result in results)


def test_forging_fails_on_the_kernel_layers_alone() -> None:
    """With the in-process guard off, the program still cannot reach the harness's report pipe: it runs under
    another uid than the harness, which is also non-dumpable."""
    bare = CodeReward(CodeRewardConfig(sandbox=SandboxConfig(wall_timeout_s=5.0, audit_hook=False)))
    names = ["forging a report on every descriptor", "opening the harness's descriptors through /proc"]
    results = bare.score([RewardRequest(HACKS[n], metadata=ASSERTS) for n in names])
    assert [r.score for r in results] == [0.0, 0.0]


def test_honest_programs_still_score(reward: CodeReward) -> None:
    partial = "def add(a, b):\n    return a + b + (a == 10)\n"  # right on the first two, 16 for (10, 5)
    plain_data = (
        "def shapes(x):\n"
        "    return [None, True, 3, 2.5, 1j, 'é', b'\\x00', (1, [2]), {'k': {1, 2}}, frozenset({3})]\n"
        "def checked(x):\n"
        "    if x < 0:\n        raise ValueError('negative')\n"
        "    return x\n"
        "class Stack:\n"
        "    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n"
        "    def pop(self):\n        return self.items.pop()\n"
    )
    big_globals = "TABLE = list(range(3 * 10**6))\nMOD = 7\nLOOP = []\nLOOP.append(LOOP)\ndef f(x):\n    return TABLE[x] % MOD\n"
    plain_tests = {
        "asserts": [
            "assert shapes(0) == [None, True, 3, 2.5, 1j, 'é', b'\\x00', (1, [2]), {'k': {1, 2}}, frozenset({3})]",
            "assert type(shapes(0)[7]) is tuple and type(shapes(0)[2]) is int",
            "try:\n    checked(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    raise AssertionError",
            "s = Stack()\ns.push(4)\ns.push(5)\nassert s.pop() == 5 and s.items == [4]",
        ]
    }
    results = reward.score(
        [
            RewardRequest("def add(a, b):\n    return a + b\n", metadata=ASSERTS),
            RewardRequest(partial, metadata=ASSERTS),
            RewardRequest(plain_data, metadata=plain_tests),
            RewardRequest(
                big_globals, metadata={"asserts": ["assert f(10) == 3 and MOD == 7", "assert TABLE[9] == 9"]}
            ),
        ]
    )
    assert [r.score for r in results] == [1.0, pytest.approx(2 / 3), 1.0, 1.0], [r.info for r in results]
    assert results[1].info["error"] == "AssertionError"


def test_forged_report_lines_are_ignored_even_when_the_pipe_is_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every layer that keeps the program off the report pipe turned off (guard, uid drop, non-dumpable
    harness): the program reaches the harness's pipes and writes passing verdicts into them, before and during
    the tests, yet they lack the per-run nonce that only the harness read, so they count for nothing. The forger
    aims at write ends only: the tests pipe's read end, open in the harness until it has read its tests, would
    take junk too, but that only stalls the harness to its deadline (no verdicts: a failed run) and made the
    number of pipes reached depend on the machine's speed."""
    weakened = sandbox_module._BOOT_SOURCE.replace(
        "return int(ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)) == 0", "return True"
    )
    assert weakened != sandbox_module._BOOT_SOURCE
    monkeypatch.setattr(sandbox_module, "_BOOT_SOURCE", weakened)
    config = SandboxConfig(wall_timeout_s=5.0, audit_hook=False, drop_privileges=False)
    forger = WRONG + (
        "import json, os, threading, time\n"
        "lines = b''.join((json.dumps({'i': i, 'ok': True, 'error': None}) + '\\n').encode() for i in range(3))\n"
        "mine = set()\n"
        "for fd in range(64):\n"
        "    try:\n"
        "        mine.add(os.fstat(fd).st_ino)\n"
        "    except OSError:\n"
        "        pass\n"
        "pipes = []\n"  # the harness's write ends that are not shared with us: the report pipe
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        path = f'/proc/{os.getppid()}/fd/{fd}'\n"
        "        flags = open(f'/proc/{os.getppid()}/fdinfo/{fd}').read().split('flags:')[1].split()[0]\n"
        "        if os.stat(path).st_ino not in mine and int(flags, 8) & 3 == os.O_WRONLY:\n"
        "            pipes.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))\n"
        "    except OSError:\n"
        "        pass\n"
        "def forge():\n"
        "    for _ in range(50):\n"
        "        for w in pipes:\n"
        "            os.write(w, lines)\n"
        "        time.sleep(0.005)\n"
        "print('reached', len(pipes), 'pipes of the harness', flush=True)\n"
        "forge()\n"
        "threading.Thread(target=forge, daemon=True).start()\n"
    )
    run = Sandbox(config).run_tests(forger, ASSERTS["asserts"])
    assert "reached 1 pipes of the harness" in run.result.stdout  # the report pipe, written to 50+ times
    assert run.errors == ["AssertionError"] * 3  # the harness itself ran every test
    assert run.verdicts == [False, False, False]


def test_the_harness_runs_unprivileged_and_guarded(tmp_path: Path) -> None:
    """A test that evals the program's output runs the program's code in the harness: that code is as confined
    as the program (another unprivileged uid, the guard), so it cannot write outside or start processes."""
    target = tmp_path / "from-the-harness"
    tmp_path.chmod(0o777)  # writable by anyone: only the guard stands in the way
    writes = f"open({str(target)!r}, 'w').write('x')"
    spawns = "__import__('os').system('true')"
    program = f"def write():\n    return {writes!r}\ndef spawn():\n    return {spawns!r}\n"
    tests = ["import os\nprint('harness uid', os.getuid())", "eval(write())", "eval(spawn())"]
    run = Sandbox(SandboxConfig(wall_timeout_s=5.0)).run_tests(program, tests)
    assert run.verdicts == [True, False, False]
    assert "GuardError: sandbox: access to" in str(run.errors[1])
    assert "GuardError: sandbox: os.system is not allowed" in str(run.errors[2])
    assert "harness uid 65533" in run.result.stdout
    assert not target.exists()
