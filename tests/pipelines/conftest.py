"""Fixtures the offline-mode pipeline tests (sft, dpo, reward_model) share.

``kill_and_resume`` is the exact-resume check of those modes: a real ``roll train`` subprocess is SIGKILLed (no
clean exit) once its first checkpoint is on disk, ``resume=auto`` finishes the run in a second subprocess, and
every logged metric of every step after the checkpoint must equal, bitwise, the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

Metrics = dict[int, dict[str, float]]
KillAndResume = Callable[[Path, Sequence[str], Metrics, Path], int]

START_TIMEOUT_S = 300


def read_metrics(out: Path) -> Metrics:
    """``{step: metrics}`` of a run's ``metrics.jsonl``; a step logged twice keeps its last line (a resumed
    run logs again the steps after its checkpoint that the killed run had already logged)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


def _cli(yaml: Path, args: Sequence[str], cwd: Path, log: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)  # its own Ray, started and owned by the subprocess
    out = (cwd / log).open("w")  # a file, not a pipe: nobody drains a pipe while we wait
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(yaml), *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]


def _kill_after_first_checkpoint(proc: subprocess.Popen[str], out: Path, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not list((out / "checkpoints").glob("step_*")):
        assert proc.poll() is None, f"the run ended before its first checkpoint:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"no checkpoint after {START_TIMEOUT_S} s:\n{_tail(log)}"
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _check(yaml: Path, args: Sequence[str], expected: Metrics, workdir: Path) -> int:
    from roll.core.checkpoint import CheckpointManager

    out = workdir / "killed"
    run_args = [f"output_dir={out}", "ray.num_cpus=2", *args]
    _kill_after_first_checkpoint(_cli(yaml, run_args, workdir, "killed.log"), out, workdir / "killed.log")
    latest = CheckpointManager(out / "checkpoints", keep_last=2).latest()
    assert latest is not None
    resumed_at = int(latest.name.split("_")[1])
    last = max(expected)
    assert resumed_at < last, "the checkpoint is the last step: nothing left to resume"
    resumed = _cli(yaml, [*run_args, "resume=auto"], workdir, "resumed.log")
    assert resumed.wait(timeout=START_TIMEOUT_S) == 0, _tail(workdir / "resumed.log")
    got = read_metrics(out)
    for step in range(resumed_at + 1, last + 1):
        for name, value in expected[step].items():
            if not name.startswith(("time/", "throughput/")):
                assert got[step][name] == value, (step, name, got[step][name], value)
    return resumed_at


@pytest.fixture
def kill_and_resume() -> KillAndResume:
    """``check(yaml, args, expected_metrics, workdir) -> resumed_at``: SIGKILL ``roll train yaml *args`` after
    its first checkpoint, resume it, and assert every step after the checkpoint logs ``expected_metrics``
    (time/* and throughput/* aside) bitwise. ``args`` must describe the same run as the one that produced ``expected_metrics``."""
    return _check
