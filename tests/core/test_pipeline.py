"""BasePipeline through the smoke pipeline: real Ray actors, real gloo, real checkpoints and trackers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.config.loader import load_config
from roll.core.errors import CheckpointError, ResourceError
from roll.core.smoke import SmokeConfig

ROOT = Path(__file__).resolve().parents[2]
SMOKE_YAML = ROOT / "examples" / "smoke.yaml"


def _config(out: Path, *overrides: str) -> SmokeConfig:
    base = [f"output_dir={out}", "tracking.progress=false", "ray.num_cpus=null"]
    return load_config(SMOKE_YAML, [*base, *overrides], model=SmokeConfig)


def _run(cfg: SmokeConfig) -> dict[str, Any]:
    from roll.core.smoke.pipeline import SmokePipeline

    pipeline = SmokePipeline(cfg)
    try:
        summary = pipeline.run()
        weights = pipeline.workers.state_dict()
    finally:
        pipeline.shutdown()
    return {"summary": summary, "weights": weights}


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"]["loss"] for row in rows}


@pytest.mark.slow
def test_loss_falls_and_outputs_are_written(ray_local: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(_config(out, "max_steps=12", "eval_every=6", "checkpoint.every_n_steps=6"))
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 13))
    assert losses[12] < 0.1 * losses[1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000006", "step_000012"]
    assert (out / "config.yaml").read_text().startswith("pipeline: smoke")
    assert any((out / "tensorboard").iterdir())


@pytest.mark.slow
def test_two_data_parallel_workers_equal_one(ray_local: Any, tmp_path: Path) -> None:
    one = _run(_config(tmp_path / "one", "max_steps=4", "workers.num_workers=1"))
    two = _run(_config(tmp_path / "two", "max_steps=4", "workers.num_workers=2"))
    for name in one["weights"]:
        torch.testing.assert_close(one["weights"][name], two["weights"][name], rtol=0, atol=1e-6)
    assert _losses(tmp_path / "one")[4] == pytest.approx(_losses(tmp_path / "two")[4], rel=1e-5)


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(ray_local: Any, tmp_path: Path) -> None:
    full = _run(_config(tmp_path / "full", "max_steps=6"))
    _run(_config(tmp_path / "split", "max_steps=3"))
    resumed = _run(_config(tmp_path / "split", "max_steps=6", "resume=auto"))
    assert _losses(tmp_path / "split") == _losses(tmp_path / "full")  # bitwise, step for step
    for name in full["weights"]:
        assert torch.equal(full["weights"][name], resumed["weights"][name])


def test_unwritable_output_dir_fails_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    from roll.core.smoke.pipeline import SmokePipeline

    with pytest.raises(CheckpointError, match="is not writable"):
        SmokePipeline(_config(blocker / "run"))


def test_roles_larger_than_the_cluster_fail_before_waiting(ray_local: Any, tmp_path: Path) -> None:
    from roll.core.smoke.pipeline import SmokePipeline

    pipeline = SmokePipeline(_config(tmp_path / "big", "workers.cpus_per_worker=3"))
    start = time.monotonic()
    try:
        with pytest.raises(ResourceError) as info:
            pipeline.run()
    finally:
        pipeline.shutdown()
    assert time.monotonic() - start < 30
    assert "workers.cpus_per_worker" in str(info.value)
    assert not pipeline.clusters


def _cli(*args: str, cwd: Path, log: str = "cli.log") -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "roll.core.cli", *args]
    out = (cwd / log).open(
        "w"
    )  # a file, not a pipe: nobody reads a pipe while we wait, and a full one blocks
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(ray_local: Any, tmp_path: Path) -> None:
    """SIGKILL a real `roll train` after its first checkpoint; `resume=auto` then matches a clean run. The three
    subprocesses attach to the session's Ray (a dead driver's actors die with it) rather than start their own."""
    common = ["tracking.progress=false", "checkpoint.every_n_steps=2", f"ray.address={ray_local.address}"]
    killed_out = tmp_path / "killed"
    proc = _cli(
        "train", str(SMOKE_YAML), f"output_dir={killed_out}", *common, "max_steps=100000", cwd=tmp_path
    )
    deadline = time.monotonic() + 420
    while not list((killed_out / "checkpoints").glob("step_*")):  # any complete one (older ones get pruned)
        running = proc.poll() is None
        assert running and time.monotonic() < deadline, (tmp_path / "cli.log").read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # no clean exit: no final checkpoint, actors die with their driver
    proc.wait(timeout=60)
    from roll.core.checkpoint import CheckpointManager

    latest = CheckpointManager(killed_out / "checkpoints", keep_last=2).latest()
    assert latest is not None
    resumed_at = int(latest.name.split("_")[1])
    end = resumed_at + 6  # six real steps after the resume, whatever step the kill landed on
    args = ["train", str(SMOKE_YAML), *common, f"max_steps={end}"]
    resumed = _cli(*args, f"output_dir={killed_out}", "resume=auto", cwd=tmp_path, log="resumed.log")
    assert resumed.wait(timeout=420) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    clean = _cli(*args, f"output_dir={tmp_path / 'clean'}", cwd=tmp_path, log="clean.log")
    assert clean.wait(timeout=420) == 0, (tmp_path / "clean.log").read_text()[-3000:]
    killed_losses, clean_losses = _losses(killed_out), _losses(tmp_path / "clean")
    assert sorted(clean_losses) == list(range(1, end + 1))
    for step in range(resumed_at + 1, end + 1):
        assert killed_losses[step] == clean_losses[step]
