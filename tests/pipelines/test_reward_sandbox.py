"""The code sandbox against hostile programs: each must score 0, fast, with the test process unharmed.

Most hostile programs are first stopped by the in-process audit hook; ``test_kernel_layers_hold_without_the_hook``
turns the hook off to check that the namespaces, the unprivileged uid and the rlimits hold on their own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.rewards.code import CodeReward, extract_code
from roll.pipelines.rewards.config import CodeRewardConfig, SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox, SandboxIsolationError, _launcher
from roll.pipelines.rewards.types import RewardRequest

FAST = SandboxConfig(wall_timeout_s=2.0, cpu_time_s=2, memory_mb=512)
ECHO_SUM = {"test_cases": [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12\n"}]}


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(CodeRewardConfig(sandbox=FAST, max_concurrency=2))


def _score(
    reward: CodeReward, program: str, metadata: Mapping[str, Any] = ECHO_SUM
) -> tuple[float, dict[str, object]]:
    (result,) = reward.score([RewardRequest(program, metadata=metadata)])
    return result.score, result.info


def test_correct_programs_score_one(reward: CodeReward) -> None:
    stdio = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    asserts = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    results = reward.score(
        [
            RewardRequest(stdio, metadata=ECHO_SUM),
            RewardRequest("def add(a, b):\n    return a + b\n", metadata=asserts),
        ]
    )
    assert [r.score for r in results] == [1.0, 1.0]
    assert results[0].info == {"passed": 2, "total": 2, "correct": True}


def test_partial_program_scores_half_or_zero_when_all_or_nothing(reward: CodeReward) -> None:
    program = "a, b = map(int, input().split())\nprint(3)\n"
    score, info = _score(reward, program)
    assert score == 0.5 and info["error"] == "wrong answer"
    strict = CodeReward(CodeRewardConfig(sandbox=FAST, all_or_nothing=True))
    assert _score(strict, program)[0] == 0.0


def test_test_cases_from_json_ground_truth(reward: CodeReward) -> None:
    (result,) = reward.score(
        [RewardRequest("print(input())", ground_truth='{"test_cases": [{"input": "x", "output": "x"}]}')]
    )
    assert result.score == 1.0
    (missing,) = reward.score([RewardRequest("print(1)")])
    assert missing.score == 0.0 and "no test cases" in missing.info["error"]


def test_extract_code_takes_the_last_block() -> None:
    assert extract_code("a\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```") == "print(2)\n"
    assert extract_code("print(3)") == "print(3)"


def test_infinite_loop_is_killed_at_the_wall_clock(reward: CodeReward) -> None:
    started = time.monotonic()
    score, info = _score(reward, "while True:\n    pass\n", {"asserts": ["assert True"]})
    assert score == 0.0 and info["error"] == "timeout"
    assert time.monotonic() - started < 20  # generous under load: unkilled, the loop never ends


def test_fork_bomb_scores_zero(reward: CodeReward) -> None:
    score, _ = _score(reward, "import os\nwhile True:\n    os.fork()\n", {"asserts": ["assert True"]})
    assert score == 0.0


def test_memory_hog_scores_zero(reward: CodeReward) -> None:
    score, info = _score(reward, "x = bytearray(4 * 1024**3)\nprint(len(x))\n", {"asserts": ["assert True"]})
    assert score == 0.0 and "MemoryError" in str(info["error"])


def test_writes_outside_the_sandbox_are_refused(reward: CodeReward, tmp_path: Path) -> None:
    targets = [tmp_path / "escaped.txt", Path("/tmp/evil")]
    assert not targets[1].exists(), "/tmp/evil left over from elsewhere"
    for target in targets:
        program = f"open({str(target)!r}, 'w').write('pwned')\n"
        score, _ = _score(reward, program, {"asserts": ["assert True"]})
        assert score == 0.0
        assert not target.exists()
    inside = "open('ok.txt', 'w').write('fine')\nassert open('ok.txt').read() == 'fine'\n"
    assert _score(reward, inside, {"asserts": ["assert True"]})[0] == 1.0


@pytest.fixture()
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    yield server.getsockname()[1]
    server.close()


def test_network_access_fails(reward: CodeReward, listener: int) -> None:
    program = (
        f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=1)\nprint('connected')\n"
    )
    assert _score(reward, program, {"test_cases": [{"input": "", "output": "connected"}]})[0] == 0.0


def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_TEST_SECRET", "s3cr3t-value-xyz")
    result = Sandbox(FAST).run("import os\nprint(dict(os.environ))\nprint(open('/proc/1/environ').read())\n")
    assert "s3cr3t-value-xyz" not in result.stdout + result.stderr
    assert "ROLL_TEST_SECRET" not in result.stdout + result.stderr
    assert "'HOME'" in result.stdout  # the program did run and print its (fresh) environment


def test_output_flood_is_capped(reward: CodeReward) -> None:
    score, info = _score(reward, "while True:\n    print('x' * 1000)\n", {"asserts": ["assert True"]})
    assert score == 0.0 and info["error"] == "output limit exceeded"


def test_kernel_layers_hold_without_the_hook(tmp_path: Path, listener: int) -> None:
    sandbox = Sandbox(SandboxConfig(wall_timeout_s=2.0, cpu_time_s=2, memory_mb=512, audit_hook=False))
    if not (sandbox.isolation["namespaces"] and sandbox.isolation["unprivileged_uid"]):
        pytest.skip(f"this host gives no namespaces or unprivileged uid: {sandbox.isolation}")
    connect = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=1)\n")
    assert connect.exit_code != 0 and "unreachable" in connect.stderr.lower()
    tmp_path.chmod(0o755)  # the sandbox user may look, but not write
    write = sandbox.run(f"open({str(tmp_path / 'x')!r}, 'w')\n")
    assert write.exit_code != 0 and not (tmp_path / "x").exists()
    bomb = sandbox.run("import os\nfor _ in range(10_000):\n    os.fork()\n")
    assert not bomb.ok
    assert os.getpid() > 0  # and we are still here, with the whole group killed


@pytest.fixture()
def planted_answers(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """A world-readable answers file in the host's /tmp, under the checkout and in pytest's tmp dir."""
    secret = f"ANSWER-{os.getpid()}-{time.monotonic_ns()}"
    checkout = Path(__file__).resolve().parents[2]
    paths = [
        Path(f"/tmp/roll-answers-{os.getpid()}.txt"),
        checkout / f"answers-{os.getpid()}.txt",
        tmp_path / "a",
    ]
    for path in paths:
        path.write_text(secret + "\n")
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    yield secret, paths
    for path in paths:
        path.unlink(missing_ok=True)


def test_host_files_are_invisible_in_the_jail(
    reward: CodeReward, planted_answers: tuple[str, list[Path]]
) -> None:
    """A policy that reads the answers file instead of computing scores 0: the host's files do not exist inside."""
    secret, paths = planted_answers
    if not reward.sandbox.isolation["filesystem"]:
        pytest.skip(f"this host cannot make a mount namespace: {reward.sandbox.isolation}")
    assert all(path.read_text().strip() == secret for path in paths)  # readable by anyone on the host
    cheat = (
        "import glob, os\n"
        f"for p in {[str(p) for p in paths]!r} + glob.glob('/tmp/*') + glob.glob('/work/**/answers-*', recursive=True):\n"
        "    if os.path.isfile(p):\n"
        "        print(open(p).read().strip())\n"
    )
    score, info = _score(reward, cheat, {"test_cases": [{"input": "", "output": secret}]})
    assert score == 0.0 and info["error"] == "wrong answer"
    seen = reward.sandbox.run(
        "import json, os\nprint(json.dumps([sorted(os.listdir('/')), [p for p in os.listdir('/proc') if p.isdigit()]]))"
    )
    top, pids = json.loads(seen.stdout)
    interpreter_top = Path(reward.sandbox._launcher.python).parts[1]  # e.g. "root" for a pyenv prefix
    allowed = {"bin", "dev", "etc", "lib", "lib64", "proc", "sandbox", "sbin", "tmp", "usr", interpreter_top}
    assert set(top) <= allowed and "work" not in top, top
    assert pids == ["1"]  # its own pid namespace: the program is the only process in its /proc


def test_interpreter_and_stdlib_work_in_the_jail(reward: CodeReward) -> None:
    program = (
        "import json, decimal, fractions, sqlite3, hashlib, re, collections, datetime, os\n"
        "db = sqlite3.connect(':memory:')\n"
        "print(json.dumps([str(decimal.Decimal(1) / 8), str(fractions.Fraction(3, 6)),\n"
        "    db.execute('select 6*7').fetchone()[0], hashlib.sha256(b'').hexdigest()[:8]]))\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "print(open(os.path.join(os.environ['HOME'], 'scratch.txt')).read())\n"
    )
    expected = '["0.125", "1/2", 42, "e3b0c442"]\nok'
    assert _score(reward, program, {"test_cases": [{"input": "", "output": expected}]}) == (
        1.0,
        {"passed": 1, "total": 1, "correct": True},
    )


def test_without_the_jail_it_refuses_unless_allowed_and_then_says_what_is_not_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _launcher.cache_clear()  # the launch plan is probed once per process: probe again, so the warning is seen
    with pytest.raises(SandboxIsolationError, match=r"no jail here .* set sandbox.allow_unisolated: true"):
        Sandbox(SandboxConfig(filesystem_jail=False))
    with caplog.at_level(logging.WARNING, logger="roll.pipelines.rewards.sandbox"):
        partial = Sandbox(SandboxConfig(filesystem_jail=False, allow_unisolated=True))
    assert partial.isolation["filesystem"] is False
    assert "running without filesystem isolation" in caplog.text
    assert (
        "NOT isolated: no filesystem jail: the program can read every host file its uid can read"
        in caplog.text
    )
    assert "root" not in caplog.text.lower()  # never advises running as root
    with pytest.raises(SandboxIsolationError, match=r"full isolation is required .* no filesystem isolation"):
        Sandbox(SandboxConfig(filesystem_jail=False, allow_unisolated=True, require_isolation=True))
