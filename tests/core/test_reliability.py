"""What a run survives, through the smoke pipeline: a preemption signal to a real ``roll train``, then, resuming it,
a worker process SIGKILLed in the middle of the run. It must end in the same per-step metrics as an uninterrupted
run. The preempted run is a module fixture, so each test asserts one thing and neither needs the other to run.

The uninterrupted run (``clean``, :data:`STEPS` steps) is computed once per module on the session's Ray and shared.
Smoke steps are deterministic in (seed, step) and checkpoints hold the weights, so after any resume every logged
loss must equal the clean run's bitwise.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from roll.core.checkpoint import CheckpointManager
from roll.core.config.loader import load_config
from roll.core.recovery import EXIT_PREEMPTED, StopSignals
from roll.core.smoke import SmokeConfig

ROOT = Path(__file__).resolve().parents[2]
SMOKE_YAML = ROOT / "examples" / "smoke.yaml"
STEPS = 60
COMMON = [f"max_steps={STEPS}", "tracking.progress=false", "tracking.backends=[jsonl]"]
Metrics = dict[int, dict[str, float]]


def _config(out: Path, *overrides: str) -> SmokeConfig:
    return load_config(
        SMOKE_YAML, [f"output_dir={out}", "ray.num_cpus=null", *COMMON, *overrides], model=SmokeConfig
    )


def _run(cfg: SmokeConfig, during: Any = None) -> dict[str, float]:
    from roll.core.smoke import SPEC

    pipeline = SPEC.build(cfg)
    if during is not None:
        threading.Thread(target=during, args=(pipeline,), daemon=True).start()
    try:
        return pipeline.run()
    finally:
        pipeline.shutdown()


def _metrics(out: Path) -> Metrics:
    """``{step: metrics}`` without time/* (wall clock) and ``restarts``; a step logged twice keeps its last line."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: v for k, v in row["metrics"].items() if _compared(k)} for row in rows}


def _compared(name: str) -> bool:
    return not name.startswith("time/") and name != "restarts"


@pytest.fixture(scope="module")
def clean(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Metrics:
    out = tmp_path_factory.mktemp("clean")
    _run(_config(out))
    metrics = _metrics(out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    return metrics


def test_a_second_signal_abandons_the_step_and_a_first_one_only_asks() -> None:
    """In-process, with the real handler: SIGINT (Ctrl-C) while armed sets the request, a second one raises."""
    stop, before = StopSignals(), signal.getsignal(signal.SIGTERM)
    with stop.installed():
        with pytest.raises(KeyboardInterrupt):  # before the step loop: nothing to finish
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        stop.armed = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.requested and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt, match="SIGTERM during step 1: a second signal abandoned it"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_step_that_outlives_the_grace_is_abandoned_with_the_reason() -> None:
    """grace 0.5 s: the first SIGTERM during step 3 (2 done) only asks; the main thread stays blocked (here in a
    30 s sleep, as in a stuck ray.wait) and is interrupted after the grace, with the reason kept on the
    StopSignals (Ray would drop the exception's message). A step that ends inside the grace is not cut."""
    stop = StopSignals(grace_s=0.5)
    with stop.installed():
        stop.armed, stop.step = True, 2
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        assert 0.5 <= time.monotonic() - started < 10
    assert stop.reason == (
        "SIGTERM during step 3: it did not finish within stop_grace_s=0.5s of the signal (a call may be stuck), "
        "so it was abandoned"
    )
    quick = StopSignals(grace_s=0.3)
    with quick.installed():
        quick.armed = True
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        quick.step = 1  # the step finished; the loop would checkpoint now
        quick.step_finished()
        time.sleep(0.6)  # no interrupt arrives
    assert quick.requested and quick.reason is None


def _wait_for_steps(out: Path, proc: subprocess.Popen[str], log: Path, steps: int) -> None:
    deadline = time.monotonic() + 300
    jsonl = out / "metrics.jsonl"
    while not (jsonl.exists() and len(jsonl.read_text().splitlines()) >= steps):
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step after 300 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)


@dataclass(frozen=True)
class Preemption:
    out: Path
    returncode: int
    log: str


@pytest.fixture(scope="module")
def preempted(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Preemption:
    """A real `roll train` with no step limit and no periodic checkpoints, SIGTERMed once it logged 3 steps.

    It attaches to the session's Ray (saving a Ray start); without a step limit the signal surely lands mid-run.
    """
    out = tmp_path_factory.mktemp("preempted")
    log = out / "train.log"
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(SMOKE_YAML), f"output_dir={out}", *COMMON]
    cmd += [f"ray.address={ray_local.address}", "max_steps=100000", "checkpoint.every_n_steps=0"]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=sink, stderr=sink)
        _wait_for_steps(out, proc, log, 3)
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=120)
    return Preemption(out, returncode, log.read_text())


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_it_and_exits_75(preempted: Preemption, clean: Metrics) -> None:
    """The signal's step finished and was logged, its checkpoint is the only one, the exit code is 75, and the
    message says how to continue; every step logged equals the clean run's."""
    assert preempted.returncode == EXIT_PREEMPTED, preempted.log[-3000:]
    checkpoints = CheckpointManager(preempted.out / "checkpoints", keep_last=3).checkpoints()
    assert len(checkpoints) == 1
    stopped_at = checkpoints[0].step
    logged = _metrics(preempted.out)
    assert 3 <= stopped_at < STEPS and sorted(logged) == list(range(1, stopped_at + 1))
    assert logged == {step: clean[step] for step in logged}
    assert f"SIGTERM: stopped after step {stopped_at}" in preempted.log and "resume=auto" in preempted.log


@pytest.mark.slow
def test_resume_auto_continues_exactly_through_a_sigkilled_worker(
    preempted: Preemption, clean: Metrics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``resume=auto`` continues the preempted run; 3 steps later rank 1's process is SIGKILLed. The pipeline
    names it, rebuilds, resumes from its latest checkpoint (the preempted one or a later one, every 5 steps) and
    finishes on its own: one restart logged, and every step's metrics equal the clean run's."""
    out = tmp_path / "run"
    shutil.copytree(preempted.out, out)
    resumed_at = CheckpointManager(out / "checkpoints", keep_last=3).checkpoints()[-1].step
    killed: list[int] = []

    def kill_rank_1(pipeline: Any) -> None:
        deadline = time.monotonic() + 300
        while pipeline.step < resumed_at + 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        pid = pipeline.clusters[0].infos[1].pid
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)

    overrides = ["resume=auto", "checkpoint.every_n_steps=5", "max_restarts=1"]
    with caplog.at_level(logging.ERROR, logger="roll.core.run"):
        summary = _run(_config(out, *overrides), during=kill_rank_1)
    assert killed, "the worker was never killed"
    assert "smoke: workers rank 1 died: " in caplog.text and "Restart 1 of 1" in caplog.text
    assert summary["restarts"] == 1.0
    assert _metrics(out) == clean
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))  # resume and restart rewound the file
    assert rows[-1]["metrics"]["restarts"] == 1.0 and rows[0]["metrics"].get("restarts") is None
