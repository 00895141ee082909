"""roll.core.rundir through the smoke pipeline's constructor: a run dir that holds a run is refused or moved aside,
and a resume is verified and its metrics rewound, all before Ray starts (a pipeline starts Ray only in ``run``).
No Ray here: the runs are laid down by hand with the real CheckpointManager."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from roll.core.checkpoint import CheckpointManager, PipelineState
from roll.core.config.loader import load_config
from roll.core.errors import ConfigError, RunDirError
from roll.core.smoke import SPEC, SmokeConfig
from roll.core.smoke.pipeline import WEIGHTS_FILE

ROOT = Path(__file__).resolve().parents[2]
SMOKE_YAML = ROOT / "examples" / "smoke.yaml"


def _config(out: Path, *overrides: str) -> SmokeConfig:
    base = [f"output_dir={out}", "tracking.progress=false", "max_steps=6"]
    return load_config(SMOKE_YAML, [*base, *overrides], model=SmokeConfig)


def _lay_down_run(out: Path, steps: int, checkpoints: tuple[int, ...], root: Path | None = None) -> str:
    """A run as a killed ``roll train`` leaves it: ``steps`` metrics lines and smoke checkpoints at
    ``checkpoints``; returns the metrics file's text."""
    manager = CheckpointManager(root or out / "checkpoints", keep_last=5, pipeline_name="smoke")
    for step in checkpoints:
        manager.save(step, lambda d: (d / WEIGHTS_FILE).write_bytes(b"w" * 8), PipelineState.capture(step))
    lines = [json.dumps({"step": s, "time": 1.0, "metrics": {"loss": 1.0 / s}}) for s in range(1, steps + 1)]
    text = "".join(line + "\n" for line in lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text(text)
    return text


def test_a_new_run_on_a_dir_holding_a_run_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    text = _lay_down_run(out, steps=5, checkpoints=(2, 4))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(RunDirError) as info:
        SPEC.build(_config(out))
    assert str(info.value) == (
        f"{out} already holds a run ({out / 'metrics.jsonl'}, checkpoints "
        f"{out / 'checkpoints' / 'step_000002..step_000004'}), and a new run would append to its metrics and "
        "overwrite its checkpoints. Continue it with resume=auto, or start afresh with overwrite=true (which "
        f"first moves it aside to {out}.old-<timestamp>)"
    )
    assert (out / "metrics.jsonl").read_text() == text
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # no tensorboard dir, no probe left


def test_checkpoints_alone_are_a_run_but_an_empty_metrics_file_is_not(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _lay_down_run(out, steps=0, checkpoints=(3,))
    with pytest.raises(RunDirError, match=r"already holds a run \(checkpoints .*step_000003\)"):
        SPEC.build(_config(out))
    crashed = tmp_path / "crashed-in-setup"  # its trackers opened metrics.jsonl, then setup failed
    crashed.mkdir()
    (crashed / "metrics.jsonl").write_text("")
    assert SPEC.build(_config(crashed)).run_start.checkpoint is None


def test_overwrite_moves_the_old_run_aside_and_starts_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With checkpoint.dir outside the output dir, both move aside, each to its own sibling."""
    out, root = tmp_path / "run", tmp_path / "ckpts"
    text = _lay_down_run(out, steps=5, checkpoints=(2, 4), root=root)
    with caplog.at_level(logging.WARNING, logger="roll.core.rundir"):
        pipeline = SPEC.build(_config(out, "overwrite=true", f"checkpoint.dir={root}"))
    pipeline.tracker.close()
    (old_out,) = tmp_path.glob("run.old-*")
    (old_root,) = tmp_path.glob("ckpts.old-*")
    assert (old_out / "metrics.jsonl").read_text() == text
    assert [p.name for p in sorted(old_root.iterdir())] == ["step_000002", "step_000004"]
    assert pipeline.run_start.checkpoint is None and not list(root.iterdir())
    assert (out / "metrics.jsonl").read_text() == ""  # the new run's own, empty until its first step
    assert f"overwrite=true: moved the run that was in {out} aside to {old_out}" in caplog.text
    assert f"overwrite=true: moved the run that was in {root} aside to {old_root}" in caplog.text


def test_overwrite_and_resume_auto_contradict() -> None:
    with pytest.raises(ConfigError, match="overwrite=true moves the run in output_dir aside, resume=auto"):
        _config(Path("/nonexistent"), "overwrite=true", "resume=auto")


def test_resume_auto_continues_its_own_metrics_from_the_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    text = _lay_down_run(out, steps=5, checkpoints=(2, 4))
    pipeline = SPEC.build(_config(out, "resume=auto"))
    pipeline.tracker.close()
    assert pipeline.run_start.step == 4 and not pipeline.run_start.finished
    assert (out / "metrics.jsonl").read_text() == "".join(text.splitlines(keepends=True)[:4])
    assert pipeline.run_start.describe("smoke") == (
        f"smoke: resuming from {out / 'checkpoints' / 'step_000004'} (step 4 of 6); dropped 1 metrics lines "
        "past step 4"
    )


def test_resume_auto_on_a_finished_run_says_so_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint is at max_steps: run() returns at once (no Ray, no resources) and the dir is untouched."""
    out = tmp_path / "run"
    text = _lay_down_run(out, steps=6, checkpoints=(3, 6))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    pipeline = SPEC.build(_config(out, "resume=auto"))
    try:
        assert pipeline.run() == {}
    finally:
        pipeline.shutdown()
    assert pipeline.ray is None and pipeline.resources is None and not pipeline.clusters
    assert capsys.readouterr().err == (
        f"roll: smoke: the run in {out} is finished: checkpoint {out / 'checkpoints' / 'step_000006'} is at step "
        "6, max_steps is 6; nothing to train (raise max_steps to train it further)\n"
    )
    assert (out / "metrics.jsonl").read_text() == text
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_resuming_another_runs_checkpoint_into_a_dir_holding_a_run_is_refused(tmp_path: Path) -> None:
    other, out = tmp_path / "other", tmp_path / "run"
    _lay_down_run(other, steps=2, checkpoints=(2,))
    _lay_down_run(out, steps=3, checkpoints=(3,))
    foreign = other / "checkpoints" / "step_000002"
    with pytest.raises(RunDirError, match=rf"resume={foreign} is a checkpoint of another run"):
        SPEC.build(_config(out, f"resume={foreign}"))
    own = SPEC.build(_config(out, "resume=step_000003"))  # its own checkpoint, relative to its root
    own.tracker.close()
    assert own.run_start.step == 3
    with pytest.raises(RunDirError, match="overwrite=true would move it aside, and with it resume="):
        SPEC.build(_config(out, "resume=step_000003", "overwrite=true"))
    assert (out / "checkpoints" / "step_000003").is_dir()  # refused before anything moved


def test_resume_auto_before_any_checkpoint_starts_over_and_drops_the_attempts_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _lay_down_run(out, steps=3, checkpoints=())
    pipeline = SPEC.build(_config(out, "resume=auto"))
    pipeline.tracker.close()
    assert pipeline.run_start.checkpoint is None and (out / "metrics.jsonl").read_text() == ""
    assert pipeline.run_start.describe("smoke") == (
        f"smoke: no checkpoint to resume in {out}: starting at step 0 of 6 (dropped the 3 metrics lines of the "
        "earlier attempt)"
    )
