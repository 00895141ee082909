"""Deadlines of reward calls in real rlvr runs (the quickstart made tiny: no warm-up, 4 prompts x 4 samples).

- A ``type: python`` reward that spins forever on its first row (``while True: pass``, once per run: a marker
  file) fails that row at its ``timeout_s`` and the run trains all its steps; ``reward/errors`` counts the row.
- ``roll train`` SIGTERMed while a reward is stuck (``timeout_s: null``, so nothing but the reward role's 600 s
  call deadline would end the step) leaves within ``stop_grace_s`` plus the shutdown, exit 130, with a message
  that names the signal, the step and why, and keeps the last finished step's checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.core.testing import read_metrics
from roll.pipelines.rlvr import SPEC, RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
TINY = [
    "warmup=null",
    "batch.prompts_per_step=4",
    "batch.samples_per_prompt=4",
    "batch.micro_batch_samples=16",
    "rollout.request_prompts=4",
    "rollout.max_new_tokens=8",
    "eval_every=0",
    "plot=false",
    "tracking.backends=[jsonl]",
    "tracking.progress=false",
    "rewards.arithmetic.type=python",
]
HANG_ONCE = """
import time
from pathlib import Path

ARM = Path(__file__).with_name("arm")
MARK = Path(__file__).with_name("hung_at")

def once(response, ground_truth, **kwargs):
    if ARM.exists() and not MARK.exists():  # the first row once armed spins forever; the others score at once
        MARK.write_text(repr(time.time()))
        while True:
            pass
    return float(response.strip().endswith(ground_truth.strip()))
"""


def _reward(tmp_path: Path, timeout_s: float | None) -> str:
    file = tmp_path / "hang.py"
    file.write_text(HANG_ONCE)
    timeout = "null" if timeout_s is None else f"{timeout_s:g}"
    return f"rewards.arithmetic.options={{function: {file}:once, timeout_s: {timeout}}}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("timeout_s", "role_timeout", "error_rate", "timed_out_rows", "restarts", "reason"),
    [
        (3.0, None, 1 / 16, 0.0, 0.0, "once did not return within timeout_s=3s; its process was killed"),
        (None, 3.0, 1.0, 16.0, 1.0, "reward_arithmetic rank 0: score of 16 rows did not answer within 3s"),
    ],
    ids=["row-deadline", "share-deadline"],
)
def test_a_python_reward_that_never_returns_fails_its_rows_and_the_run_trains_on(
    ray_local: Any,
    tmp_path: Path,
    timeout_s: float | None,
    role_timeout: float | None,
    error_rate: float,
    timed_out_rows: float,
    restarts: float,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Step 1's first row spins forever; the run does all 3 steps and only step 1 has failed rows.

    - ``timeout_s: 3`` (the function runs in a child process): that row alone fails, after 3 s.
    - ``timeout_s: null`` (in the worker's process) and ``workers.call_timeout_s: 3``: the reward worker's whole
      share (the step's one request: 4 prompts x 4 samples = 16 rows) is abandoned at 3 s, the worker restarted.

    Before: the scheduler waited on the reward forever (400 s and counting, nothing printed)."""
    out = tmp_path / "run"
    overrides = [*TINY, _reward(tmp_path, timeout_s), f"output_dir={out}", "max_steps=3"]
    if role_timeout is not None:
        overrides.append(f"rewards.arithmetic.workers.call_timeout_s={role_timeout:g}")
    (tmp_path / "arm").touch()
    tree = load_tree(QUICKSTART, [*overrides, "ray.address=auto", "ray.num_cpus=null"], model=RLVRConfig)
    pipeline = SPEC.build(validate(tree, RLVRConfig))
    try:
        with caplog.at_level(logging.ERROR, logger="roll.failures"):
            pipeline.run()
    finally:
        pipeline.shutdown()
    shown = [r.getMessage() for r in caplog.records if "failed (timeout)" in r.getMessage()]
    assert len(shown) == 1 and reason in shown[0], caplog.text[-3000:]  # shown once, with the reason
    metrics = read_metrics(out)
    assert sorted(metrics) == [1, 2, 3]
    assert [metrics[s]["reward/errors"] for s in (1, 2, 3)] == [error_rate, 0.0, 0.0]  # of 16 rows a step
    assert metrics[3]["reward/timed_out_rows_total"] == timed_out_rows
    assert metrics[3]["reward/worker_restarts_total"] == restarts
    assert metrics[1]["time/step_s"] >= 3.0
    print(f"step times {[round(metrics[s]['time/step_s'], 1) for s in (1, 2, 3)]}")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    [
        [],
        ["placement=separate", "rollout.async_generation_ratio=1"],
        ["placement=separate", "rollout.async_mode=step_ahead", "rollout.async_generation_ratio=1"],
    ],
    ids=["sync", "async", "step-ahead"],
)
def test_sigterm_during_a_stuck_reward_exits_promptly_with_the_reason(
    ray_local: Any, tmp_path: Path, mode: list[str]
) -> None:
    """The reward hangs in the worker's own process once the test creates `arm` after step 1's checkpoint (so in
    step 2, or 3 if step 2 was already scored). SIGTERM then: the step cannot finish, so after stop_grace_s=3 it
    is abandoned; exit 130 within 60 s of the signal, the message names SIGTERM, the step and the grace, and the
    checkpoint of the step before it is there. Before: the first SIGTERM waited on the stuck step, the second
    printed `interrupted ()`, and shutting down took another 60 s."""
    out = tmp_path / "run"
    args = [*TINY, _reward(tmp_path, None), f"output_dir={out}", "max_steps=6", "checkpoint.every_n_steps=1"]
    args += ["stop_grace_s=3", "checkpoint.keep_last=6", *mode]
    args += [f"ray.address={ray_local.address}", "ray.num_cpus=null"]
    log = tmp_path / "train.log"
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(QUICKSTART), *args]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=sink, stderr=sink)
        _wait_for(out / "checkpoints" / "step_000001", proc, log)
        (tmp_path / "arm").touch()
        _wait_for(tmp_path / "hung_at", proc, log)
        time.sleep(1.0)  # the reward spins: step 2 cannot finish
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=120)
    exit_s = time.monotonic() - signalled
    text = log.read_text()
    assert returncode == 130, text[-3000:]
    found = re.search(
        r"roll: interrupted \(SIGTERM during step (\d+): it did not finish within stop_grace_s=3s", text
    )
    assert found is not None, text[-3000:]
    stuck = int(found.group(1))
    last = out / "checkpoints" / f"step_{stuck - 1:06d}"
    assert f"last checkpoint: {last}" in text and last.is_dir()
    assert not (out / "checkpoints" / f"step_{stuck:06d}").exists()
    assert exit_s < 60, f"{exit_s:.1f}s from SIGTERM to exit"
    print(f"SIGTERM to exit: {exit_s:.1f}s")
