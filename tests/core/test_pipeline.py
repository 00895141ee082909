"""The run loop (roll.core.run.Run) through the smoke recipe: real Ray actors, real gloo, real checkpoints and trackers."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.config.loader import load_config
from roll.core.errors import CheckpointError, ResourceError
from roll.core.smoke import SmokeConfig
from roll.core.testing import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SMOKE_YAML = ROOT / "examples" / "smoke.yaml"


def _config(out: Path, *overrides: str) -> SmokeConfig:
    base = [f"output_dir={out}", "tracking.progress=false", "ray.num_cpus=null"]
    return load_config(SMOKE_YAML, [*base, *overrides], model=SmokeConfig)


def _run(cfg: SmokeConfig) -> dict[str, Any]:
    from roll.core.smoke import SPEC

    pipeline = SPEC.build(cfg)
    try:
        summary = pipeline.run()
        weights = pipeline.recipe.workers.state_dict()
    finally:
        pipeline.shutdown()
    return {"summary": summary, "weights": weights}


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"]["loss"] for row in rows}


STEPS = 30
CLEAN = [f"max_steps={STEPS}", "eval_every=6", "checkpoint.every_n_steps=6"]
"""The module's one uninterrupted run (examples/smoke.yaml: two data-parallel workers). A smoke step's batch is a
pure function of (seed, step) and plain SGD has no schedule, so its metrics at step k do not depend on
``max_steps``, evaluation or checkpointing: the resume, data-parallel and SIGKILL checks all compare with it."""


@pytest.fixture(scope="module")
def clean(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("smoke") / "clean"
    return {"out": out, **_run(_config(out, *CLEAN))}


@pytest.mark.slow
def test_loss_falls_and_outputs_are_written(clean: dict[str, Any]) -> None:
    out = clean["out"]
    losses = _losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[12] < 0.1 * losses[1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000024", "step_000030"]
    assert (out / "config.yaml").read_text().startswith("pipeline: smoke")
    assert any((out / "tensorboard").iterdir())


@pytest.mark.slow
def test_two_data_parallel_workers_equal_one(clean: dict[str, Any], tmp_path: Path) -> None:
    """One worker on the whole batch ends where two data-parallel workers (the shared run) end, after 30 steps
    (measured: weight equal, bias 4e-9 apart; the bar is 1e-6)."""
    one = _run(_config(tmp_path / "one", *CLEAN, "workers.num_workers=1"))
    for name in one["weights"]:
        torch.testing.assert_close(one["weights"][name], clean["weights"][name], rtol=0, atol=1e-6)
    one_losses, two_losses = _losses(tmp_path / "one"), _losses(clean["out"])
    for step in (4, STEPS):
        assert one_losses[step] == pytest.approx(two_losses[step], rel=1e-5)


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(clean: dict[str, Any], tmp_path: Path) -> None:
    _run(_config(tmp_path / "split", *CLEAN, "max_steps=3"))  # its final checkpoint is step 3
    resumed = _run(_config(tmp_path / "split", *CLEAN, "resume=auto"))
    assert _losses(tmp_path / "split") == _losses(clean["out"])  # bitwise, step for step
    for name in clean["weights"]:
        assert torch.equal(clean["weights"][name], resumed["weights"][name])


@pytest.mark.slow
def test_resume_auto_skips_damaged_checkpoints_and_matches_the_uninterrupted_run(
    clean: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real 18-step run checkpoints at 6, 12 and 18; then step 18's weights get one byte flipped (same size)
    and step 12's are cut to half. ``resume=auto`` warns about both, naming the file and why, says it continues
    from step 6, and ends in the uninterrupted run's metrics (every step once: the 12 steps after the checkpoint
    that the first run logged are dropped, then logged again) and its weights, bitwise."""
    out = tmp_path / "damaged"
    keep = "checkpoint.keep_last=3"
    _run(_config(out, *CLEAN, "max_steps=18", keep))
    ckpts = out / "checkpoints"
    flipped, cut = ckpts / "step_000018" / "linear.pt", ckpts / "step_000012" / "linear.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with cut.open("r+b") as file:
        file.truncate(cut.stat().st_size // 2)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="roll.core.checkpoint"):
        resumed = _run(_config(out, *CLEAN, keep, "resume=auto"))
    assert (
        f"skipping damaged checkpoint {ckpts / 'step_000018'}: linear.pt does not match its xxh3_128"
        in caplog.text
    )
    assert f"skipping damaged checkpoint {ckpts / 'step_000012'}: linear.pt has " in caplog.text
    assert f"roll: smoke: resuming from {ckpts / 'step_000006'} (step 6 of 30)" in capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    assert _losses(out) == _losses(clean["out"])
    for name in clean["weights"]:
        assert torch.equal(clean["weights"][name], resumed["weights"][name])


def test_unwritable_output_dir_fails_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    from roll.core.smoke import SPEC

    with pytest.raises(CheckpointError, match="is not writable"):
        SPEC.build(_config(blocker / "run"))


def test_roles_larger_than_the_cluster_fail_before_waiting(ray_local: Any, tmp_path: Path) -> None:
    from roll.core.smoke import SPEC

    pipeline = SPEC.build(_config(tmp_path / "big", "workers.cpus_per_worker=3"))
    start = time.monotonic()
    try:
        with pytest.raises(ResourceError) as info:
            pipeline.run()
    finally:
        pipeline.shutdown()
    assert time.monotonic() - start < 30
    assert "workers.cpus_per_worker" in str(info.value)
    assert not pipeline.clusters


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(
    clean: dict[str, Any], tmp_path: Path, kill_and_resume: Any
) -> None:
    """SIGKILL a real `roll train` after its first checkpoint; `resume=auto` then logs every metric of every later
    step as the shared uninterrupted run did (``kill_and_resume``: both subprocesses attach to the session's Ray,
    and a dead driver's actors die with it). Checkpoints every 2 steps, so at least six real steps follow the
    resume wherever the kill lands before step 24."""
    args = ["tracking.progress=false", *CLEAN, "checkpoint.every_n_steps=2"]
    resumed_at = kill_and_resume(SMOKE_YAML, args, read_metrics(clean["out"]), tmp_path)
    assert resumed_at <= STEPS - 6, f"the kill landed at step {resumed_at}: fewer than 6 steps were resumed"
