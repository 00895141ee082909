"""The `roll` CLI as a user meets it: real subprocesses, real exit codes, messages without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _roll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "roll.core.cli", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_validate_accepts_the_smoke_example(tmp_path: Path) -> None:
    out = _roll("validate", str(ROOT / "examples" / "smoke.yaml"), "max_steps=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "ok (pipeline 'smoke', SmokeConfig)" in out.stdout


def test_validate_reports_every_error_with_path_line_and_hint(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "pipeline: smoke\n"
        "max_step: 3\n"  # misspelled
        "workers:\n"
        "  num_workers: two\n"  # wrong type
        "batch:\n"
        "  prompts_per_step: 64\n"
        "  micro_batch_samples: 8\n"
        "  micro_batch_tokens: 128\n"  # both given
    )
    out = _roll("validate", str(cfg), "lr=-1", cwd=tmp_path)
    assert out.returncode == 2
    err = out.stderr
    assert "Traceback" not in err
    assert "max_step (bad.yaml:2" in err and "did you mean 'max_steps' or 'max_restarts'?" in err
    assert "workers.num_workers (bad.yaml:4" in err
    assert "lr (<override 1: lr=-1>)" in err
    assert "micro_batch" in err
    assert err.count("\n  - ") >= 4  # all of them in one report


def test_train_with_unwritable_output_dir_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = _roll("train", str(ROOT / "examples" / "smoke.yaml"), f"output_dir={blocker}/run", cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "is not writable" in out.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    out = _roll("validate", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert out.returncode == 2
    assert "nope.yaml" in out.stderr and "Traceback" not in out.stderr


def test_validate_explain_lists_every_key_left_at_its_default(tmp_path: Path) -> None:
    """`--explain` prints the keys the config does not set, with their default values, and only those: the smoke
    example sets `seed`, `ray.num_cpus` and `checkpoint.keep_last`, and leaves `max_restarts`, `ray.address`,
    `ray.call_timeout_s` and `checkpoint.export_hf` to RunConfig's defaults (3, null, 600.0, false)."""
    out = _roll("validate", "--explain", str(ROOT / "examples" / "smoke.yaml"), "lr=0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "pipeline 'smoke' has no presets: every key is the config's or its default" in lines
    (header,) = [line for line in lines if line.startswith("defaults: ")]
    left = {
        line.strip().split(": ", 1)[0]: line.strip().split(": ", 1)[1]
        for line in lines
        if line.startswith("  ")
    }
    assert header == f"defaults: {len(left)} keys the config leaves unset"
    assert left["max_restarts"] == "3" and left["ray.address"] == "null"
    assert left["ray.call_timeout_s"] == "600.0" and left["checkpoint.export_hf"] == "false"
    assert not {"seed", "ray.num_cpus", "checkpoint.keep_last", "workers.num_workers", "lr"} & left.keys()


# ------------------------------------------------------------------------------------------- run dirs
# ray.address points at a closed port: a command that reached Ray would fail with a connection error instead.
NO_RAY = "ray.address=127.0.0.1:1"


def _smoke_checkpoints(out: Path, *steps: int) -> Path:
    from roll.core.checkpoint import CheckpointManager, PipelineState

    manager = CheckpointManager(out / "checkpoints", keep_last=5, pipeline_name="smoke")
    for step in steps:
        manager.save(step, lambda d: (d / "linear.pt").write_bytes(bytes(range(64))), PipelineState(step))
    return out / "checkpoints"


def test_a_second_train_on_the_same_dir_stops_before_ray(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _smoke_checkpoints(out, 2)
    (out / "metrics.jsonl").write_text('{"step": 1, "time": 1.0, "metrics": {"loss": 1.0}}\n')
    smoke = str(ROOT / "examples" / "smoke.yaml")
    run = _roll("train", smoke, f"output_dir={out}", NO_RAY, cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.startswith(f"roll: error: {out} already holds a run (")
    assert "Continue it with resume=auto, or start afresh with overwrite=true" in run.stderr
    assert (out / "metrics.jsonl").read_text().count("\n") == 1


def test_resume_auto_on_a_finished_run_and_a_damaged_resume_path_stop_before_ray(tmp_path: Path) -> None:
    out = tmp_path / "run"
    root = _smoke_checkpoints(out, 2, 4)
    smoke = str(ROOT / "examples" / "smoke.yaml")
    finished = _roll("train", smoke, f"output_dir={out}", "max_steps=4", "resume=auto", NO_RAY, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert f"the run in {out} is finished: checkpoint {root / 'step_000004'} is at step 4" in finished.stderr
    with (root / "step_000002" / "linear.pt").open("r+b") as file:
        file.truncate(10)
    damaged = _roll(
        "train", smoke, f"output_dir={out}", f"resume={root / 'step_000002'}", NO_RAY, cwd=tmp_path
    )
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr
    assert damaged.stderr.startswith(
        f"roll: error: resume path {root / 'step_000002'} is damaged: linear.pt has 10 bytes, the manifest says 64"
    )


def test_validate_and_train_reject_a_pin_and_a_tracker_before_ray(tmp_path: Path) -> None:
    """The core start-up checks (roll.core.startup): a node label the local Ray's one node does not offer and a
    tracker that is not installed. ``roll validate`` and ``roll train`` report the same lines with their key paths,
    train before building the pipeline (no output dir) and without starting Ray."""
    overrides = ("workers.node=trainer", "tracking.backends=[stdout,nope]", "output_dir=run")
    config = str(ROOT / "examples" / "smoke.yaml")
    checked = _roll("validate", config, *overrides, cwd=tmp_path)
    trained = _roll("train", config, *overrides, cwd=tmp_path)
    assert checked.returncode == trained.returncode == 2, checked.stderr + trained.stderr
    assert checked.stderr == trained.stderr
    assert "roll: 2 problems in config:" in checked.stderr
    assert "workers.node (<override 1: workers.node=trainer>): no machine offers 'trainer'" in checked.stderr
    assert "tracking.backends.1 (<override 2: " in checked.stderr and "named 'nope'" in checked.stderr
    assert "Started a local Ray instance" not in trained.stdout + trained.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ export


def test_export_refuses_a_damaged_checkpoint_a_busy_out_and_a_mode_without_export(tmp_path: Path) -> None:
    """``roll export`` checks before it writes: OUT non-empty (exit 1, OUT untouched), the named checkpoint's
    checksums (exit 1, one line naming the file), a run with no intact checkpoint, and a pipeline with no export
    hook (smoke trains no model). The real exports are tests/pipelines/test_export.py's."""
    root = _smoke_checkpoints(tmp_path / "run", 2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    busy = _roll("export", str(tmp_path / "run"), str(out), cwd=tmp_path)
    assert busy.returncode == 1 and "Traceback" not in busy.stderr
    assert (
        busy.stderr
        == f"roll: error: {out} exists and is not empty; choose another folder or pass --overwrite to replace it\n"
    )
    assert (out / "keep.txt").read_text() == "mine"

    no_hook = _roll("export", str(root / "step_000002"), str(tmp_path / "new"), cwd=tmp_path)
    assert (
        no_hook.returncode == 1 and "pipeline 'smoke'" in no_hook.stderr and "has no export" in no_hook.stderr
    )
    assert not (tmp_path / "new").exists()

    with (root / "step_000002" / "linear.pt").open("r+b") as file:
        file.seek(3)
        file.write(b"\xff")  # same size, other bytes: only the checksum can tell
    damaged = _roll("export", str(root / "step_000002"), str(tmp_path / "new"), cwd=tmp_path)
    assert damaged.returncode == 1 and damaged.stderr.count("\n") == 1, damaged.stderr
    assert damaged.stderr.startswith(
        f"roll: error: checkpoint {root / 'step_000002'} is damaged: linear.pt does not"
    )
    run = _roll("export", str(tmp_path / "run"), str(tmp_path / "new"), cwd=tmp_path)
    assert (
        run.returncode == 1
        and "no intact checkpoint under" in run.stderr
        and "step_000002: linear.pt" in run.stderr
    )
    missing = _roll("export", str(tmp_path / "nowhere"), str(tmp_path / "new"), cwd=tmp_path)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert not (tmp_path / "new").exists()
