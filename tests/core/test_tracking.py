"""Tests for roll.core.tracking: exact jsonl and stdout output, TensorBoard files read back, reduction goldens."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.sections import TrackingConfig
from roll.core.errors import DataError, PluginError
from roll.core.jsonl import rewind_jsonl
from roll.core.tracking import (
    JSONL,
    STDOUT,
    TENSORBOARD,
    WANDB,
    JsonlTracker,
    MultiTracker,
    Progress,
    StdoutTracker,
    format_metrics_line,
    reduce_metrics,
    reduction_for,
)
from roll.core.types import Tracker, TrackerSpec

# ------------------------------------------------------------------------------------------------ reduction


def test_reduce_metrics_golden_values() -> None:
    """Two workers. loss pools [1, 2, 3] (worker 0 reports two micro-batches) -> mean 2.0;
    len/max: max(5, 9) = 9; len/min: min(5, 2) = 2; tokens_count: 10 + 30 = 40; reward/sum: 1.5 + 2.5 = 4;
    acc is only on worker 1 -> 0.75; empty is only an empty list -> left out."""
    per_worker: list[dict[str, float | list[float]]] = [
        {"loss": [1.0, 2.0], "len/max": 5, "len/min": 5, "tokens_count": 10, "reward/sum": 1.5, "empty": []},
        {"loss": 3.0, "len/max": 9, "len/min": 2, "tokens_count": 30, "reward/sum": 2.5, "acc": 0.75},
    ]
    assert reduce_metrics(per_worker) == {
        "acc": 0.75,
        "len/max": 9.0,
        "len/min": 2.0,
        "loss": 2.0,
        "reward/sum": 4.0,
        "tokens_count": 40.0,
    }


def test_reduce_metrics_explicit_modes_override_suffix() -> None:
    per_worker = [{"loss": 1.0, "len/max": 5.0}, {"loss": 3.0, "len/max": 9.0}]
    assert reduce_metrics(per_worker, how={"loss": "sum", "len/max": "mean"}) == {"len/max": 7.0, "loss": 4.0}
    assert reduce_metrics([]) == {}


def test_reduction_rule_table() -> None:
    expected = {
        "a/max": "max",
        "a_max": "max",
        "a/min": "min",
        "a_min": "min",
        "a/sum": "sum",
        "a_sum": "sum",
        "a/count": "sum",
        "a_count": "sum",
        "a/mean": "mean",
        "maximum": "mean",
    }
    assert {name: reduction_for(name) for name in expected} == expected


def test_reduce_metrics_unknown_mode() -> None:
    with pytest.raises(DataError) as info:
        reduce_metrics([{"x": 1.0}], how={"x": "median"})
    assert str(info.value) == "unknown metric reduction ['median']; known: ['max', 'mean', 'min', 'sum']"


# -------------------------------------------------------------------------------------------------- stdout


def test_stdout_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    tracker = STDOUT.build(Path("unused"), TrackingConfig(stdout_metrics=["*"]), {"max_steps": 10})
    tracker.log({"reward/mean": 0.5, "loss": 0.123456, "lr": 1e-6, "tokens_count": 4096}, step=3)
    tracker.close()
    assert (
        capsys.readouterr().out
        == "step 3/10 | loss 0.1235 | lr 1e-06 | reward/mean 0.5 | tokens_count 4096\n"
    )
    StdoutTracker().log({}, step=7)
    assert capsys.readouterr().out == "step 7\n"
    assert format_metrics_line({"x": 2.0}, 1, None) == "step 1 | x 2"


def test_stdout_thins_warm_up_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """A 25-step warm-up logs steps -25..-1: stdout shows -20, -10 and the last (-1); steps >= 0 all show."""
    tracker = StdoutTracker(patterns=["*"])
    for step in [*range(-25, 0), 0, 1, 2]:
        tracker.log({"warmup/loss": 1.0}, step=step)
    shown = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()]
    assert shown == ["step -20", "step -10", "step -1", "step 0", "step 1", "step 2"]


def test_default_stdout_line_is_short(capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``stdout_metrics`` the line keeps the default few names: of an RLVR step's metrics (a real step's
    names, 50 of them) only reward mean and accuracy, the loss, the eval accuracy and the step time remain."""
    names = [
        "actor/approx_kl", "actor/clip_frac", "actor/entropy", "actor/grad_norm", "actor/loss", "actor/lr",
        "reward/mean", "reward/std", "reward/accuracy", "reward/arithmetic/mean", "reward/errors",
        "response/length_mean", "rollout/samples", "time/generate_s", "time/train_s", "time/step_s",
        "throughput/generate_tokens_per_s", "policy_version", "eval/accuracy", "eval/reward", "eval/domain/x",
        *[f"extra/m{i}" for i in range(29)],
    ]  # fmt: skip
    tracker = STDOUT.build(Path("unused"), TrackingConfig(), {"max_steps": 120})
    tracker.log(dict.fromkeys(names, 0.5), step=10)
    assert capsys.readouterr().out == (
        "step 10/120 | actor/loss 0.5 | eval/accuracy 0.5 | reward/accuracy 0.5 | reward/mean 0.5 | time/step_s 0.5\n"
    )


def test_progress_is_silent_without_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(10, file=stream) as bar:
        bar.update(3, {"loss": 1.0})
        assert not bar.active
    assert stream.getvalue() == ""
    assert not Progress(10, enabled=False, force=True, file=stream).active


def test_progress_forced_shows_step_of_max_steps() -> None:
    stream = io.StringIO()
    with Progress(10, initial=2, force=True, file=stream) as bar:
        assert bar.active
        bar.update(5, {"loss": 0.25})
    text = stream.getvalue()
    assert "5/10" in text and "loss=0.25" in text
    last = text.replace("\n", "\r").split("\r")[-2]  # the line as redrawn last
    match = re.search(r"elapsed (\d+:\d\d(?::\d\d)?), eta (\d+:\d\d(?::\d\d)?)", last)
    assert match is not None, last  # tqdm's MM:SS / H:MM:SS durations


def _read_to_hangup(master: int) -> bytes:
    """All a closed pty's slave wrote: one read returns only what the kernel has moved to the master side so far
    (it does so asynchronously: CI once read the first draw without the last), so read to the hang-up."""
    import select

    chunks = []
    try:
        while select.select([master], [], [], 30)[0]:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:  # EIO: the slave side is closed and everything it wrote has been read
        pass
    finally:
        os.close(master)
    return b"".join(chunks)


def test_progress_draws_on_a_terminal_that_reports_no_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """stderr a pty of 0 x 0 (what `script` and some CI runners give): tqdm, which asks sys.stderr's terminal for
    its size, took 0 rows as "no room" and drew nothing."""
    import pty

    master, slave = pty.openpty()  # a fresh pty reports 0 columns and 0 rows
    with os.fdopen(slave, "w", encoding="utf-8") as stream:
        assert os.get_terminal_size(stream.fileno()) == (0, 0)
        monkeypatch.setattr(sys, "stderr", stream)
        with Progress(4, desc="rlvr") as bar:
            assert bar.active
            bar.update(2, {"loss": 0.5})
    text = _read_to_hangup(master).decode()
    assert "rlvr 2/4" in text and "eta" in text and "loss=0.5" in text, repr(text)


# --------------------------------------------------------------------------------------------------- jsonl


def test_jsonl_contents_exact_and_appends_on_resume(tmp_path: Path) -> None:
    times = iter([100.0, 101.5, 200.0])
    tracker = JsonlTracker(tmp_path / "metrics.jsonl", clock=lambda: next(times))
    tracker.log({"loss": 0.5, "n_count": 3}, step=1)
    tracker.log({"loss": 0.25}, step=2)
    # Flushed per write: readable before close.
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    tracker.close()
    resumed = JsonlTracker(tmp_path / "metrics.jsonl", clock=lambda: next(times))
    resumed.log({"loss": float("nan")}, step=3)
    resumed.close()
    assert (tmp_path / "metrics.jsonl").read_text() == (
        '{"step": 1, "time": 100.0, "metrics": {"loss": 0.5, "n_count": 3.0}}\n'
        '{"step": 2, "time": 101.5, "metrics": {"loss": 0.25}}\n'
        '{"step": 3, "time": 200.0, "metrics": {"loss": NaN}}\n'
    )
    with pytest.raises(DataError, match=r"is closed$"):
        resumed.log({"loss": 1.0}, step=4)


def test_rewind_jsonl_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path: Path) -> None:
    """Steps 1..4 logged, then a SIGKILL mid-write left half a line: rewinding to step 2 keeps exactly the first
    two lines, byte for byte; rewinding again, or a missing file, drops nothing."""
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": step, "time": 1.0, "metrics": {"loss": 1.0 / step}}) for step in (1, 2, 3, 4)
    ]
    path.write_text("".join(line + "\n" for line in lines) + '{"step": 5, "ti')
    assert rewind_jsonl(path, 2) == 3
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    assert rewind_jsonl(path, 2) == 0 and rewind_jsonl(tmp_path / "none.jsonl", 2) == 0
    assert rewind_jsonl(path, 0) == 2 and path.read_text() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left


def test_a_restart_rewinds_the_open_jsonl_file_through_multi_tracker(tmp_path: Path) -> None:
    """Steps 1..4 logged, a restart from the step-2 checkpoint: step 3 is logged once more, each step once."""
    path = tmp_path / "metrics.jsonl"
    tracker = MultiTracker([JsonlTracker(path, clock=lambda: 0.0), StdoutTracker(patterns=["none"])])
    for step in (1, 2, 3, 4):
        tracker.log({"loss": float(step)}, step)
    tracker.rewind(2)
    tracker.log({"loss": 30.0}, 3)
    tracker.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(row["step"], row["metrics"]["loss"]) for row in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_jsonl_spec_writes_under_output_dir(tmp_path: Path) -> None:
    tracker = JSONL.build(tmp_path / "run", TrackingConfig(), None)
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert (line["step"], line["metrics"]) == (1, {"x": 1.0})
    assert isinstance(line["time"], float)


# --------------------------------------------------------------------------------------------- tensorboard


def test_tensorboard_event_file_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TENSORBOARD.build(tmp_path, TrackingConfig(), {"pipeline": "sft", "seed": 1})
    tracker.log({"loss": 0.5, "reward/mean": 1.25}, step=1)
    tracker.log({"loss": 0.25, "reward/mean": 2.5}, step=2)
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "reward/mean"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 1.25), (2, 2.5)]


# --------------------------------------------------------------------------------------------------- wandb


def test_wandb_missing_names_pip_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(PluginError) as info:
        WANDB.build(tmp_path, TrackingConfig(), None)
    assert str(info.value) == (
        "tracker 'wandb' needs the wandb package, which is not installed: run `pip install wandb`, "
        "or remove 'wandb' from tracking.backends"
    )


def test_wandb_with_a_stand_in_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeRun:
        def log(self, metrics: dict[str, float], step: int) -> None:
            calls.append(("log", (metrics, step)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: Any) -> FakeRun:
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    tracker = WANDB.build(tmp_path / "run7", TrackingConfig(project="demo"), {"seed": 1})
    tracker.log({"loss": 1}, step=4)
    tracker.close()
    assert calls == [
        ("init", {"project": "demo", "dir": str(tmp_path / "run7"), "name": "run7", "config": {"seed": 1}}),
        ("log", ({"loss": 1.0}, 4)),
        ("finish", None),
    ]


# ------------------------------------------------------------------------------------------- multi / specs


class Recorder:
    def __init__(self, fail_close: bool = False) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.closed = False
        self.fail_close = fail_close

    def log(self, metrics: Any, step: int) -> None:
        self.logged.append((dict(metrics), step))

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError("disk full")


def test_multi_tracker_fans_out_and_closes_all() -> None:
    first, second = Recorder(fail_close=True), Recorder()
    multi = MultiTracker([first, second])
    multi.log({"a": 1.0}, step=2)
    assert first.logged == second.logged == [({"a": 1.0}, 2)]
    with pytest.raises(OSError, match="disk full"):
        multi.close()
    assert first.closed and second.closed


def test_specs_are_tracker_specs() -> None:
    assert [spec.name for spec in (STDOUT, JSONL, TENSORBOARD, WANDB)] == [
        "stdout",
        "jsonl",
        "tensorboard",
        "wandb",
    ]
    assert all(isinstance(spec, TrackerSpec) for spec in (STDOUT, JSONL, TENSORBOARD, WANDB))
    assert isinstance(StdoutTracker(), Tracker)
    assert isinstance(MultiTracker([]), Tracker)


class _ImageSink:
    """A tracker that keeps what it receives, with the optional ``log_images`` method."""

    def __init__(self) -> None:
        self.images: list[tuple[dict[str, Path], int]] = []
        self.closed = False

    def log(self, metrics: Any, step: int) -> None:
        pass

    def log_images(self, images: Any, step: int) -> None:
        self.images.append((dict(images), step))

    def close(self) -> None:
        self.closed = True


def test_shutdown_sends_the_runs_plots_to_image_trackers_only(tmp_path: Path) -> None:
    """A pipeline's PNGs reach trackers that have ``log_images`` (at the last step), before they close; a tracker
    without the method (jsonl) is skipped."""
    from roll.core.config.sections import RunConfig
    from roll.core.run import Run, RunHost
    from roll.core.tracking import MultiTracker
    from roll.core.types import Phases

    class Plotting:
        def __init__(self, host: RunHost) -> None:
            self.host = host

        def roles(self) -> dict[str, Any]:
            return {}

        def setup(self) -> None:
            pass

        def train_step(self, step: int) -> dict[str, float]:
            return {}

        def save_files(self, directory: Path) -> None:
            pass

        def load_files(self, directory: Path) -> None:
            pass

        def state(self) -> dict[str, Any]:
            return {}

        def load_state(self, state: Any) -> None:
            pass

        def phases(self) -> Phases:
            return Phases()

    config = RunConfig(pipeline="x", output_dir=tmp_path, tracking=TrackingConfig(backends=["jsonl"]))
    run = Run(config, name="x", recipe=Plotting)
    sink = _ImageSink()
    run.tracker = MultiTracker([*run.tracker.trackers, sink])  # type: ignore[attr-defined]
    (tmp_path / "plot.png").write_bytes(b"\x89PNG")
    run.step = 7
    run.shutdown()
    assert sink.images == [({"plot": tmp_path / "plot.png"}, 7)] and sink.closed


def test_a_failing_report_is_logged_with_its_traceback_and_the_run_still_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The report phase (rlvr's and agentic's plots) runs when the run ends; its error is logged once, with the
    traceback, and never turns a finished run into a failed one. The smoke recipe, with a report that fails."""
    from roll.core.config import load_config
    from roll.core.run import Run, RunHost
    from roll.core.smoke import SmokeConfig
    from roll.core.smoke.pipeline import SmokeRecipe
    from roll.core.types import Phases

    class Reporting:
        def __init__(self, config: Any, host: RunHost) -> None:
            self.inner = SmokeRecipe(config, host)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def report(self) -> None:
            raise RuntimeError("no font for the plot")

        def phases(self) -> Phases:
            return Phases(report=self.report)

    smoke_yaml = Path(__file__).resolve().parents[2] / "examples" / "smoke.yaml"
    overrides = [f"output_dir={tmp_path}", "ray.num_cpus=null", "max_steps=2", "tracking.backends=[jsonl]"]
    config = load_config(smoke_yaml, overrides, model=SmokeConfig)
    run = Run(config, name="smoke", recipe=lambda host: Reporting(config, host))
    try:
        with caplog.at_level("WARNING", logger="roll.core.run"):
            metrics = run.run()
    finally:
        run.shutdown()
    assert metrics and all(v == v for v in metrics.values())  # finished, with finite (non-NaN) metrics
    failed = [r for r in caplog.records if "writing the run's report" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert "no font for the plot" in str(failed[0].exc_info[1])
