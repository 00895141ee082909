"""The optional trackers (``roll-core[mlflow|swanlab|trackio]``) in their local or offline modes: the run config
logged, metrics per step, and an image, each read back with the library's own reader.

In ``tests/extras``, not ``tests/core``: the per-package CI installs roll-core without its extras, while the
workspace's dev group installs them. About 5 s in all (the three imports dominate).
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from roll.core import plugins
from roll.core.config.sections import TrackingConfig
from roll.core.tracking import MultiTracker

# Trackio reads TRACKIO_DIR when imported: point it at a private folder before anything imports it.
if "trackio" not in sys.modules:
    os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="roll-trackio-")

RUN_CONFIG = {"pipeline": "rlvr", "seed": 3, "train": {"optimizer": {"lr": 0.0005}}}
STEPS = {1: {"reward/mean": 0.25, "actor/loss": 1.5}, 2: {"reward/mean": 0.5, "actor/loss": 1.0}}
SAMPLES = [
    {"step": 2, "kind": "train", "prompt": "What is 2+3?", "response": "5", "reward": 1.0},
    {"step": 2, "kind": "train", "prompt": "What is 1+1?", "response": "3", "reward": 0.0},
]


def run_tracker(name: str, tmp_path: Path) -> tuple[Path, str]:
    """Build the plugin ``name`` as a pipeline does, log two steps and one image, close."""
    out = tmp_path / f"run-{name}"
    out.mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(out / "plot.png")
    project = f"roll-test-{tmp_path.name}"
    spec = plugins.load("roll.tracker", name)
    assert plugins.available("roll.tracker")[name].dist == "roll-core"
    tracker = MultiTracker([spec.build(out, TrackingConfig(project=project), RUN_CONFIG)])
    for step, metrics in STEPS.items():
        tracker.log(metrics, step)
    tracker.log_images({"plot": out / "plot.png"}, 2)
    tracker.log_samples(SAMPLES, 2, "train")
    tracker.close()
    return out, project


def test_mlflow_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out, project = run_tracker("mlflow", tmp_path)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert run.data.params["train.optimizer.lr"] == "0.0005" and run.data.params["seed"] == "3"
    assert run.info.run_name == "run-mlflow" and run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run.info.run_id, "images")} == {"images/plot.png"}
    table = Path(client.download_artifacts(run.info.run_id, "samples/train/step_000002.md", str(tmp_path)))
    assert table.read_text().splitlines()[2:] == [
        "| 2 | train | What is 2+3? | 5 | 1 |",
        "| 2 | train | What is 1+1? | 3 | 0 |",
    ]


def _swanlab_records(out: Path) -> list[Any]:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(str(out / "swanlog" / "run-*" / "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    records = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        records.append(record)
    reader.close()
    return records


def test_swanlab_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    out, project = run_tracker("swanlab", tmp_path)
    records = _swanlab_records(out)
    scalars = {(r.scalar.key, r.scalar.step): r.scalar.value.number for r in records if r.HasField("scalar")}
    assert scalars[("reward/mean", 1)] == 0.25 and scalars[("actor/loss", 2)] == 1.0
    assert [r.media.key for r in records if r.HasField("media")] == ["plot", "samples/train"]
    (start,) = [r.start for r in records if r.HasField("start")]
    assert start.project == project and start.name == "run-swanlab"
    (config,) = glob.glob(str(out / "swanlog" / "run-*" / "files" / "config.yaml"))
    assert "0.0005" in Path(config).read_text()


def test_trackio_local(tmp_path: Path) -> None:
    _, project = run_tracker("trackio", tmp_path)
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs(project, "run-trackio")
    scalars = {
        (row["step"], k): v for row in logs for k, v in row.items() if k in ("reward/mean", "actor/loss")
    }
    assert scalars == {
        (1, "reward/mean"): 0.25,
        (1, "actor/loss"): 1.5,
        (2, "reward/mean"): 0.5,
        (2, "actor/loss"): 1.0,
    }
    assert [row["plot"]["_type"] for row in logs if "plot" in row] == ["trackio.image"]
    (table,) = [row["samples/train"] for row in logs if "samples/train" in row]
    assert table["_type"] == "trackio.table" and "What is 1+1?" in str(table)
    config = SQLiteStorage.get_run_config(project, "run-trackio")
    assert config is not None and config["seed"] == 3 and config["train"]["optimizer"]["lr"] == 0.0005


def test_trackio_local_says_nothing_about_uploading(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Local trackio uploads nothing, yet its ``finish`` prints "Uploading logs to Trackio", and its atexit hook
    finishes the current run again (printing again at interpreter exit). roll's tracker drops that line and leaves
    no current run behind for the hook."""
    run_tracker("trackio", tmp_path)
    import trackio

    out, err = capfd.readouterr()
    assert "Uploading" not in out + err
    assert trackio.context_vars.current_run.get() is None
