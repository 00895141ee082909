"""Metrics sinks (trackers), their entry-point specs, and reduction of metrics across workers.

Each tracker implements :class:`roll.core.types.Tracker` and is exposed as a :class:`~roll.core.types.TrackerSpec`
constant (:data:`STDOUT`, :data:`JSONL`, :data:`TENSORBOARD`, :data:`WANDB`; MLflow, SwanLab and Trackio in
:mod:`roll.core.tracking_extras`) that entry points of the ``roll.tracker`` group name. A spec's ``build(output_dir, config, run_config)`` makes the tracker; this module
imports neither torch nor wandb at import time, so listing plugins stays fast: TensorBoard and wandb load in
``build``.

:func:`reduce_metrics` turns per-worker metric dicts into one dict (see its docstring for the rule), and
:class:`Progress` draws a progress bar over the training loop when a person is watching.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TextIO

from roll.core.config.sections import TrackingConfig
from roll.core.errors import DataError, PluginError
from roll.core.jsonl import rewind_jsonl
from roll.core.samples import markdown_table, table_columns
from roll.core.types import Tracker, TrackerSpec

if TYPE_CHECKING:
    from tqdm import tqdm

ReduceMode = Literal["mean", "sum", "max", "min"]

SUFFIX_MODES: tuple[tuple[str, ReduceMode], ...] = (
    ("/max", "max"),
    ("_max", "max"),
    ("/min", "min"),
    ("_min", "min"),
    ("/sum", "sum"),
    ("_sum", "sum"),
    ("/count", "sum"),
    ("_count", "sum"),
)
"""Name suffixes that pick a reduction; any other name is averaged."""

_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda values: math.fsum(values) / len(values),
    "sum": math.fsum,
    "max": max,
    "min": min,
}

JSONL_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


# ------------------------------------------------------------------------------------------- reduction


@contextmanager
def timed(timings: MutableMapping[str, float], phase: str) -> Iterator[None]:
    """Record the wall time of the ``with`` body as ``timings[phase]`` (seconds), also when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = time.perf_counter() - start


def reduction_for(name: str, how: Mapping[str, str] | None = None) -> str:
    """The reduction of metric ``name``: ``how[name]`` when given, else by suffix (:data:`SUFFIX_MODES`), else
    ``"mean"``."""
    if how and name in how:
        return how[name]
    for suffix, mode in SUFFIX_MODES:
        if name.endswith(suffix):
            return mode
    return "mean"


def reduce_metrics(
    per_worker: Sequence[Mapping[str, float | Sequence[float]]], how: Mapping[str, str] | None = None
) -> dict[str, float]:
    """Reduce metrics reported by several workers into one value per name.

    Rule: every value of a name is pooled across workers, a list counting as its separate values (so a worker
    that reports per-micro-batch losses weighs by its number of micro-batches), then reduced with
    :func:`reduction_for`: an explicit ``how[name]`` in ``{"mean", "sum", "max", "min"}``, else the suffix
    (``/max`` ``_max`` -> max; ``/min`` ``_min`` -> min; ``/sum`` ``_sum`` ``/count`` ``_count`` -> sum), else
    mean. A name missing from some workers is reduced over the workers that have it; a name with no values at
    all (only empty lists) is left out. Output keys are sorted.
    """
    unknown = sorted({mode for mode in (how or {}).values() if mode not in _REDUCERS})
    if unknown:
        raise DataError(f"unknown metric reduction {unknown}; known: {sorted(_REDUCERS)}")
    pooled: dict[str, list[float]] = {}
    for metrics in per_worker:
        for name, value in metrics.items():
            values = value if isinstance(value, Sequence) else [value]
            pooled.setdefault(name, []).extend(float(v) for v in values)
    return {
        name: _REDUCERS[reduction_for(name, how)](values) for name, values in sorted(pooled.items()) if values
    }


# ---------------------------------------------------------------------------------------------- trackers


def format_metrics_line(metrics: Mapping[str, float], step: int, max_steps: int | None = None) -> str:
    """``step 3/10 | loss 0.1235 | reward/mean 0.5``: names sorted, values with 4 significant digits."""
    head = f"step {step}/{max_steps}" if max_steps else f"step {step}"
    parts = [f"{name} {float(value):.4g}" for name, value in sorted(metrics.items())]
    return " | ".join([head, *parts])


class StdoutTracker:
    """One compact line per logged step on stdout (see :func:`format_metrics_line`).

    Lines go through ``tqdm.write`` so that an active :class:`Progress` bar is redrawn below them instead of
    being torn. Warm-up steps (negative, counting up to -1) are shown every ``warmup_every``-th and the last: a
    150-step warm-up is 15 lines, not 150; metrics.jsonl and the other trackers keep every step.
    """

    def __init__(
        self, max_steps: int | None = None, patterns: Sequence[str] = ("*",), warmup_every: int = 10
    ) -> None:
        self.max_steps = max_steps
        self.patterns = tuple(patterns)
        self.warmup_every = warmup_every

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step < -1 and -step % self.warmup_every:
            return
        shown = {k: v for k, v in metrics.items() if any(fnmatch.fnmatchcase(k, p) for p in self.patterns)}
        _write_line(format_metrics_line(shown, step, self.max_steps))

    def close(self) -> None:
        pass


class JsonlTracker:
    """Appends ``{"step": int, "time": unix seconds, "metrics": {...}}`` per call to ``<output_dir>/metrics.jsonl``.

    Each line is flushed when written, so a crashed run keeps every step it logged. The file is opened for
    appending: a resumed run continues its own file, which the pipeline first rewinds to the resumed step
    (:func:`roll.core.jsonl.rewind_jsonl`), and a restart after a lost worker rewinds it the same way
    (:meth:`rewind`), so each step appears once. A new run never opens another run's file: :mod:`roll.core.rundir` refuses an output dir
    that holds one. Non-finite values are written as ``NaN`` / ``Infinity``, which Python's json and pandas read.
    """

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._file: TextIO | None = path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._file is None:
            raise DataError(f"jsonl tracker for {self.path} is closed")
        record = {"step": step, "time": self._clock(), "metrics": {k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def rewind(self, last_step: int) -> None:
        """Drop the lines past ``last_step`` (a restart continues from that checkpoint) and keep appending."""
        if self._file is None:
            raise DataError(f"jsonl tracker for {self.path} is closed")
        self._file.close()
        rewind_jsonl(self.path, last_step)
        self._file = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorboardTracker:
    """Scalars in TensorBoard event files under ``log_dir``, flushed after every step.

    Written with the ``tensorboard`` package's own event writer and protos, the ones
    ``torch.utils.tensorboard.SummaryWriter`` wraps: that wrapper imports torch (~550 MB resident), which a driver
    that holds no model must not carry. Scalars are ``simple_value`` summaries and text goes to
    ``<tag>/text_summary`` under the text plugin, as the wrapper writes them.
    """

    def __init__(self, log_dir: Path, run_config: Mapping[str, Any] | None = None) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.log_dir = log_dir
        self._writer = EventFileWriter(str(log_dir))
        if run_config is not None:
            text = json.dumps(run_config, indent=2, sort_keys=True, default=str)
            self._add_text("config", f"```\n{text}\n```", 0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()]
        self._add(Summary(value=values), step)
        self._writer.flush()

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """The rows as one markdown table under the text tag ``samples/<kind>`` (TensorBoard's Text tab)."""
        self._add_text(f"samples/{kind}", markdown_table(rows), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def _add(self, summary: Any, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.add_event(Event(summary=summary, step=int(step), wall_time=time.time()))

    def _add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        plugin = SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString()
        )
        tensor = TensorProto(
            dtype="DT_STRING", string_val=[text.encode("utf-8")],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )  # fmt: skip
        value = Summary.Value(
            tag=f"{tag}/text_summary", metadata=SummaryMetadata(plugin_data=plugin), tensor=tensor
        )
        self._add(Summary(value=[value]), step)


class WandbTracker:
    """Logs to Weights & Biases. Needs the ``wandb`` package, which roll does not depend on."""

    def __init__(self, output_dir: Path, project: str, run_config: Mapping[str, Any] | None = None) -> None:
        wandb = self._wandb = _import_wandb()
        output_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project, dir=str(output_dir), name=output_dir.name, config=dict(run_config or {})
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """The rows as a ``wandb.Table`` under ``samples/<kind>``."""
        columns = table_columns(rows)
        table = self._wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self._run.log({f"samples/{kind}": table}, step=step)

    def close(self) -> None:
        self._run.finish()


class MultiTracker:
    """Fans every call out to several trackers.

    ``close`` closes all of them even when one fails, then raises the first failure, so no event file or
    wandb run is left open because of another backend.
    """

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self.trackers: list[Tracker] = list(trackers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_images(self, images: Mapping[str, Path], step: int) -> None:
        """``{name: png path}`` to every tracker that logs images (those with a ``log_images`` method)."""
        for tracker in self.trackers:
            log_images = getattr(tracker, "log_images", None)
            if log_images is not None:
                log_images(images, step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """Sample rows (:mod:`roll.core.samples`) to every tracker that shows them (those with a ``log_samples``
        method; the others do nothing with them)."""
        for tracker in self.trackers:
            log_samples = getattr(tracker, "log_samples", None)
            if log_samples is not None:
                log_samples(rows, step, kind)

    def rewind(self, last_step: int) -> None:
        """Tell every tracker that keeps a file of steps (those with a ``rewind`` method) that the run continues
        after ``last_step`` again: a restart from a checkpoint."""
        for tracker in self.trackers:
            rewind = getattr(tracker, "rewind", None)
            if rewind is not None:
                rewind(last_step)

    def close(self) -> None:
        errors: list[BaseException] = []
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as err:
                errors.append(err)
        if errors:
            raise errors[0]


# ---------------------------------------------------------------------------------------------- progress


PROGRESS_FORMAT = (
    "{desc} {n_fmt}/{total_fmt} |{bar:16}| elapsed {elapsed}, eta {remaining}, {rate_fmt}{postfix}"
)
"""One line: ``rlvr 30/120 |####      | elapsed 01:05, eta 03:15, 2.17s/step, reward/mean=0.41``. tqdm writes
durations as ``MM:SS`` or ``H:MM:SS`` (``?`` until a step has finished)."""


PROGRESS_COLUMNS, PROGRESS_ROWS = 120, 24
"""The progress line's width, and the screen's height, on a terminal that reports no size."""


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return 0


class Progress:
    """A tqdm line over the training loop, redrawn in place: ``step/max_steps``, elapsed, ETA, rate, and a few
    metrics (:data:`PROGRESS_FORMAT`).

    It draws only when ``enabled`` and either stderr is a terminal or ``force`` is set. Without a terminal (CI,
    a log file) it prints nothing: a redrawn line is noise there, and the stdout tracker's line per step already
    says ``step n/max_steps`` and ``time/step_s``. When not drawing every method is a no-op, so loops call it
    unconditionally. ``initial`` is the step a resumed run starts from; the ETA then counts only the remaining
    steps.
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        desc: str = "train",
        enabled: bool = True,
        force: bool = False,
        file: TextIO | None = None,
    ) -> None:
        stream = file if file is not None else sys.stderr
        self._bar: tqdm[Any] | None = None
        if enabled and (force or stream.isatty()):
            from tqdm import tqdm

            # A terminal that reports no size (0 x 0: `script`, some CI ptys) gets a fixed width, and a height:
            # tqdm reads 0 rows as "no room" and draws nothing at all.
            width = _columns(stream)
            self._bar = tqdm(
                total=total, initial=initial, desc=desc, unit="step", file=stream, dynamic_ncols=width > 0,
                ncols=None if width > 0 else PROGRESS_COLUMNS, nrows=None if width > 0 else PROGRESS_ROWS,
                bar_format=PROGRESS_FORMAT,
            )  # fmt: skip

    @property
    def active(self) -> bool:
        return self._bar is not None

    def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        """Move the bar to ``step`` (absolute) and show a few ``metrics`` after it."""
        if self._bar is None:
            return
        if metrics:
            self._bar.set_postfix({k: f"{float(v):.4g}" for k, v in list(metrics.items())[:4]}, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# -------------------------------------------------------------------------------------------------- specs


def _build_stdout(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    max_steps = (run_config or {}).get("max_steps")
    return StdoutTracker(max_steps=int(max_steps) if max_steps else None, patterns=config.stdout_metrics)


def _build_jsonl(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    return JsonlTracker(output_dir / JSONL_FILE)


def _build_tensorboard(
    output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None
) -> Tracker:
    return TensorboardTracker(output_dir / TENSORBOARD_DIR, run_config)


def _build_wandb(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    return WandbTracker(output_dir, config.project, run_config)


STDOUT = TrackerSpec(name="stdout", build=_build_stdout, description="one line of metrics per step on stdout")
JSONL = TrackerSpec(name="jsonl", build=_build_jsonl, description=f"one JSON object per step in {JSONL_FILE}")
TENSORBOARD = TrackerSpec(
    name="tensorboard", build=_build_tensorboard, description=f"TensorBoard event files in {TENSORBOARD_DIR}/"
)
WANDB = TrackerSpec(
    name="wandb", build=_build_wandb, description="Weights & Biases (needs: pip install wandb)"
)


# ------------------------------------------------------------------------------------------------ helpers


def _write_line(line: str) -> None:
    from tqdm import tqdm

    # Looked up at call time so that redirected or captured stdout receives the line.
    tqdm.write(line, file=sys.stdout)


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as err:
        raise PluginError(
            "tracker 'wandb' needs the wandb package, which is not installed: run `pip install wandb`, "
            "or remove 'wandb' from tracking.backends",
            tracker="wandb",
        ) from err
    return wandb


__all__ = [
    "JSONL",
    "STDOUT",
    "SUFFIX_MODES",
    "TENSORBOARD",
    "WANDB",
    "JsonlTracker",
    "MultiTracker",
    "Progress",
    "StdoutTracker",
    "TensorboardTracker",
    "WandbTracker",
    "format_metrics_line",
    "reduce_metrics",
    "reduction_for",
]
