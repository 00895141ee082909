"""roll.core.samples and roll.core.summary: which rows are shown, what samples.jsonl and TensorBoard hold (read
back with TensorBoard's own reader), and the closing lines of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.samples import (
    SAMPLES_FILE,
    SampleLog,
    batch_samples,
    clip_text,
    markdown_table,
    read_samples,
    spread,
)
from roll.core.summary import LINE_LIMIT, RunSummary, format_duration, pick_metrics
from roll.core.tracking import JsonlTracker, MultiTracker, TensorboardTracker


def test_spread_picks_different_groups() -> None:
    """256 rows in groups of 8, 4 picked: rows 0, 64, 128, 192 -> groups 0, 8, 16, 24; never more than there is."""
    assert spread(256, 4) == [0, 64, 128, 192]
    assert {i // 8 for i in spread(256, 4)} == {0, 8, 16, 24}
    assert spread(3, 4) == [0, 1, 2] and spread(0, 4) == []
    assert spread(10, 3) == [0, 3, 6]


def test_clip_text_keeps_head_and_tail() -> None:
    assert clip_text("abc", 10) == "abc"
    assert clip_text("0123456789abcdef", 10) == "01234[... 6 chars ...]bcdef"


def _scored_batch() -> Batch:
    return Batch(
        {
            C.REWARDS: torch.tensor([1.0, 0.0, 0.5, 0.25]),
            C.SCORES: torch.tensor([1.0, 0.0, 0.5, float("nan")]),
            C.CORRECT: torch.tensor([1.0, 0.0, 0.0, 0.0]),
            C.INPUT_IDS: torch.zeros(4, 3, dtype=torch.long),
        },
        {
            C.PROMPT: ["p0", "p1", "p2", "p3"],
            C.TEXT: ["r0", "r1 | x\nnext", "r2", "r3"],
            C.GROUND_TRUTH: ["g0", "g1", "g2", "g3"],
        },
    )


def test_batch_samples_fields_and_values() -> None:
    """Rows 0 and 2 of 4 (spread(4, 2)); tensors become numbers, NaN becomes null, token ids are left out."""
    rows = batch_samples(_scored_batch(), 2)
    assert rows == [
        {"prompt": "p0", "response": "r0", "ground_truth": "g0", "reward": 1.0, "score": 1.0, "correct": 1.0},
        {"prompt": "p2", "response": "r2", "ground_truth": "g2", "reward": 0.5, "score": 0.5, "correct": 0.0},
    ]
    assert batch_samples(_scored_batch(), 1, rows=[3])[0]["score"] is None


def test_markdown_table_escapes_pipes_and_newlines() -> None:
    table = markdown_table([{"prompt": "a", "reward": 0.123456}, {"prompt": "b|c\nd", "extra": None}])
    assert table.splitlines() == [
        "| prompt | reward | extra |",
        "|---|---|---|",
        "| a | 0.1235 |  |",
        "| b\\|c<br>d |  |  |",
    ]


class _Recorder:
    """A tracker with a samples hook, and one without (it must be skipped, not fail)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, int]] = []

    def log(self, metrics: Any, step: int) -> None:
        pass

    def log_samples(self, rows: list[dict[str, Any]], step: int, kind: str) -> None:
        self.calls.append((step, kind, len(rows)))

    def close(self) -> None:
        pass


def test_sample_log_cadence_file_trackers_and_rewind(tmp_path: Path) -> None:
    """every=10: steps 1, 10, 20 are due, 2 and 11 not. Each call appends its rows with step and kind, and
    reaches the tracker that has the hook; rewinding to step 10 drops step 20's rows."""
    recorder = _Recorder()
    jsonl = JsonlTracker(tmp_path / "metrics.jsonl")
    log = SampleLog(tmp_path, MultiTracker([jsonl, recorder]), every=10, count=2)
    assert [s for s in (1, 2, 10, 11, 20) if log.due(s)] == [1, 10, 20]
    assert not log.path.exists()  # nothing logged yet: no file
    for step in (1, 10, 20):
        log.log(log.pick(_scored_batch()), step)
    log.log([{"prompt": "e", "response": "ans", "correct": 1.0}], 20, "eval")
    rows = read_samples(tmp_path / SAMPLES_FILE)
    assert [(r["step"], r["kind"], r["prompt"]) for r in rows] == [
        (1, "train", "p0"), (1, "train", "p2"), (10, "train", "p0"), (10, "train", "p2"),
        (20, "train", "p0"), (20, "train", "p2"), (20, "eval", "e"),
    ]  # fmt: skip
    assert recorder.calls == [(1, "train", 2), (10, "train", 2), (20, "train", 2), (20, "eval", 1)]
    log.rewind(10)
    assert [r["step"] for r in read_samples(tmp_path / SAMPLES_FILE)] == [1, 1, 10, 10]
    log.close()
    jsonl.close()


def test_sample_log_off(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, MultiTracker([]), every=0, count=4)
    assert not log.due(1) and not log.due(10)
    log.log([{"prompt": "x"}], 1)
    assert not (tmp_path / SAMPLES_FILE).exists()


def test_tensorboard_text_reads_back(tmp_path: Path) -> None:
    """The rows land under the text tag ``samples/train`` at their step, as the markdown table (the step, the
    kind and the row's fields as columns)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorboardTracker(tmp_path / "tb")
    log = SampleLog(tmp_path, MultiTracker([tb]), every=1, count=2)
    log.log(log.pick(_scored_batch()), 3)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    assert acc.Tags()["tensors"] == ["samples/train/text_summary"]  # add_text's tag suffix
    (event,) = acc.Tensors("samples/train/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 3
    assert text.splitlines() == [
        "| step | kind | prompt | response | ground_truth | reward | score | correct |",
        "|---|---|---|---|---|---|---|---|",
        "| 3 | train | p0 | r0 | g0 | 1 | 1 | 1 |",
        "| 3 | train | p2 | r2 | g2 | 0.5 | 0.5 | 0 |",
    ]


def test_summary_lines_are_short_and_name_the_run(tmp_path: Path) -> None:
    """Eval accuracy 0.25 at 10, 0.75 at 20, 0.5 at 30: last 0.5, best 0.75 at step 20. Every line < 120."""
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    for name in ("metrics.jsonl", "samples.jsonl", "plot.png"):
        (out / name).write_text("x")
    (out / "checkpoints" / "step_000030").mkdir(parents=True)
    summary = RunSummary(["reward/mean", "eval/accuracy", "time/step_s"])
    summary.start(0)
    for step, acc in ((10, 0.25), (20, 0.75), (30, 0.5)):
        summary.observe_eval(step, {"eval/reward": 9.0, "eval/accuracy": acc})
    summary.observe_step(2.0)
    summary.observe_step(4.0)
    last = {
        "reward/mean": 0.5,
        "time/step_s": 4.0,
        "eval/accuracy": 0.5,
        **{f"x/{i}": 1.0 for i in range(60)},
    }
    lines = summary.lines(
        name="rlvr",
        step=30,
        max_steps=30,
        last=last,
        output_dir=out,
        checkpoint=out / "checkpoints/step_000030",
    )
    assert lines[0].startswith("roll: done: rlvr, 30 of 30 steps in ") and lines[0].endswith("(3 s/step)")
    assert lines[1] == "roll: last step: reward/mean 0.5 | time/step_s 4"
    assert lines[2] == "roll: eval/accuracy 0.5 at step 30, best 0.75 at step 20"
    assert lines[3] == f"roll: run dir {out.resolve()}"
    assert (
        lines[4] == "roll:   metrics.jsonl  samples.jsonl  tensorboard/  checkpoints/step_000030/  plot.png"
    )
    assert all(len(line) < LINE_LIMIT for line in lines if "run dir" not in line)


def test_summary_of_a_resumed_run_and_a_loss() -> None:
    summary = RunSummary(["eval/loss"])
    summary.start(20)
    summary.observe_eval(25, {"eval/loss": 0.5})
    assert summary._eval_line() == ["roll: eval/loss 0.5 at step 25"]
    summary.observe_eval(30, {"eval/loss": 0.25})
    assert summary._eval_line() == ["roll: eval/loss 0.25 at step 30, the best of 2 evaluations"]
    summary.observe_eval(35, {"eval/loss": 0.75})
    lines = summary.lines(
        name="sft", step=35, max_steps=35, last={}, output_dir=Path("/nowhere"), checkpoint=None
    )
    assert "35 of 35 steps (15 in this run, from step 20)" in lines[0]
    assert lines[1] == "roll: eval/loss 0.75 at step 35, best 0.25 at step 30"  # lower is better for a loss


def test_format_duration_and_pick_metrics() -> None:
    assert [format_duration(s) for s in (0.4, 59.4, 372, 7380, float("nan"))] == [
        "0s",
        "59s",
        "6m12s",
        "2h03m",
        "?",
    ]
    assert pick_metrics({"b": 1.0, "a/x": 1.0, "a/y": 1.0}, ["b", "a/*"], 2) == ["b", "a/x"]
