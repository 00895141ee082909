"""Optional experiment trackers: MLflow, SwanLab and Trackio (extras ``roll-core[mlflow|swanlab|trackio]``).

Each is a :class:`~roll.core.types.Tracker` with two more methods, which :class:`~roll.core.tracking.MultiTracker`
forwards to the trackers that have them: ``log_images({name: png_path}, step)`` (a run's plots, logged at the end)
and ``log_samples(rows, step, kind)`` (:mod:`roll.core.samples`: an MLflow markdown artifact, a SwanLab text, a
Trackio table). Every tracker logs the resolved run config once at start, then the metrics of each logged step. They work
without a network by default, in each library's local mode:

- ``mlflow``: ``MLFLOW_TRACKING_URI`` when set (a server, ``sqlite:///...``), else a file store in
  ``<output_dir>/mlruns`` (MLflow 3 keeps the file store behind ``MLFLOW_ALLOW_FILE_STORE``; roll opts in for
  that default only). Experiment ``tracking.project``, run named after the output folder; the config as params
  (flattened, ``a.b.c``) and as the artifact ``config.json``; images as artifacts under ``images/``.
- ``swanlab``: mode ``SWANLAB_MODE`` when set (``cloud`` after ``swanlab login``), else ``offline``: a run folder
  in ``<output_dir>/swanlog`` that ``swanlab sync`` can upload later.
- ``trackio``: local by default, in ``TRACKIO_DIR`` (trackio's own default: ``$HF_HOME/trackio``); ``trackio show``
  opens the dashboard.

The libraries are imported in ``build`` only, so ``roll list`` stays fast and says which extra is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from roll.core.config.sections import TrackingConfig
from roll.core.errors import PluginError
from roll.core.samples import markdown_table, table_columns
from roll.core.types import Tracker, TrackerSpec

MLFLOW_PARAM_MAX = 500  # characters MLflow stores of one param value
_MLFLOW_BATCH = 100  # params per log_batch call (MLflow's limit; metrics allow 1000)


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise PluginError(
            f"tracker {extra!r} needs the {module.split('.')[0]} package, which is not installed: run "
            f"`pip install 'roll-core[{extra}]'`, or remove {extra!r} from tracking.backends",
            tracker=extra,
        ) from err


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``("a.b", 1), ("c", [1, 2])``: nested mappings joined by dots."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten(value, f"{name}.")
        else:
            yield name, value


def mlflow_key(name: str) -> str:
    """A metric or param name MLflow accepts: characters outside ``[\\w\\-. :/]`` become ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", name)


class MLflowTracker:
    """One MLflow run through ``MlflowClient`` (no global active run, so two trackers never interfere)."""

    def __init__(self, output_dir: Path, project: str, run_config: Mapping[str, Any] | None) -> None:
        tracking = _require("mlflow.tracking", "mlflow")
        entities = _require("mlflow.entities", "mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (output_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: opt in to the file store
        self._metric, self._param = entities.Metric, entities.Param
        self.client = tracking.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id if experiment is not None else self.client.create_experiment(project)
        )
        self.run_id: str = self.client.create_run(experiment_id, run_name=output_dir.name).info.run_id
        if run_config:
            self._log_config(run_config)

    def _log_config(self, run_config: Mapping[str, Any]) -> None:
        params = [self._param(mlflow_key(k), str(v)[:MLFLOW_PARAM_MAX]) for k, v in flatten(run_config) if k]
        for start in range(0, len(params), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _MLFLOW_BATCH])
        self.client.log_dict(self.run_id, dict(run_config), "config.json")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_images(self, images: Mapping[str, Path], step: int) -> None:
        for path in images.values():
            self.client.log_artifact(self.run_id, str(path), "images")

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """A markdown table per call, as the artifact ``samples/<kind>/step_000010.md`` (MLflow's table form
        needs pandas, which mlflow-skinny does not bring)."""
        self.client.log_text(self.run_id, markdown_table(rows), f"samples/{kind}/step_{step:06d}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class SwanLabTracker:
    """A SwanLab run, offline unless ``SWANLAB_MODE`` says otherwise."""

    def __init__(self, output_dir: Path, project: str, run_config: Mapping[str, Any] | None) -> None:
        self._swanlab = _require("swanlab", "swanlab")
        output_dir.mkdir(parents=True, exist_ok=True)
        self.run = self._swanlab.init(
            project=project,
            name=output_dir.name,
            config=dict(run_config or {}),
            log_dir=str(output_dir / "swanlog"),
            mode=os.environ.get("SWANLAB_MODE") or "offline",
            reinit=True,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_images(self, images: Mapping[str, Path], step: int) -> None:
        self.run.log({name: self._swanlab.Image(str(path)) for name, path in images.items()}, step=step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """The rows as one markdown text under ``samples/<kind>``."""
        self.run.log({f"samples/{kind}": self._swanlab.Text(markdown_table(rows))}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """A Trackio run in its local store (``TRACKIO_DIR``); system metrics are off, roll logs its own."""

    def __init__(self, output_dir: Path, project: str, run_config: Mapping[str, Any] | None) -> None:
        self._trackio = _require("trackio", "trackio")
        self.run = self._trackio.init(
            project=project,
            name=output_dir.name,
            config=dict(run_config or {}),
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_images(self, images: Mapping[str, Path], step: int) -> None:
        self.run.log({name: self._trackio.Image(str(path)) for name, path in images.items()}, step=step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str) -> None:
        """The rows as a ``trackio.Table`` under ``samples/<kind>``."""
        columns = table_columns(rows)
        table = self._trackio.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self.run.log({f"samples/{kind}": table}, step=step)

    def close(self) -> None:
        # trackio's finish() prints "Uploading logs to Trackio (please wait...)" even in local mode, where it only
        # joins the thread that writes the local SQLite store: nothing is uploaded, so that line would mislead.
        # Any other output of finish() passes through.
        # trackio's atexit hook finishes its current run again (printing again): this run is finished, so it is no
        # longer current.
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            self.run.finish()
        current = self._trackio.context_vars.current_run
        if current.get() is self.run:
            current.set(None)
        kept = [line for line in buffer.getvalue().splitlines() if "Uploading logs to Trackio" not in line]
        if kept:
            print("\n".join(kept))


def _build_mlflow(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    return MLflowTracker(output_dir, config.project, run_config)


def _build_swanlab(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    return SwanLabTracker(output_dir, config.project, run_config)


def _build_trackio(output_dir: Path, config: TrackingConfig, run_config: Mapping[str, Any] | None) -> Tracker:
    return TrackioTracker(output_dir, config.project, run_config)


MLFLOW = TrackerSpec(
    name="mlflow", build=_build_mlflow, description="MLflow (MLFLOW_TRACKING_URI, else <output_dir>/mlruns)"
)
SWANLAB = TrackerSpec(
    name="swanlab", build=_build_swanlab, description="SwanLab (offline in <output_dir>/swanlog by default)"
)
TRACKIO = TrackerSpec(name="trackio", build=_build_trackio, description="Trackio, local (TRACKIO_DIR)")
