"""``csv``: every metric of every step as a row ``step,name,value`` of ``<output_dir>/metrics.csv``.

Long format, because the set of metrics changes from step to step (eval metrics every ``eval_every`` steps): a
spreadsheet or ``pandas.read_csv(...).pivot(index="step", columns="name", values="value")`` makes it wide.
Each row is flushed when written, so a crashed run keeps what it logged; ``rewind`` drops the rows past a step, so a
run restarted from a checkpoint logs each step once.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from roll.core.config.sections import TrackingConfig
from roll.core.types import TrackerSpec

FILE = "metrics.csv"
HEADER = ["step", "name", "value"]


class CsvTracker:
    """roll.core.types.Tracker: ``log(metrics, step)`` and ``close()``, plus the optional ``rewind``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        new = not path.exists()
        self._file: TextIO = path.open("a", encoding="utf-8", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(HEADER)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._writer.writerows([step, name, repr(float(value))] for name, value in sorted(metrics.items()))
        self._file.flush()

    def rewind(self, last_step: int) -> None:
        self._file.close()
        with self.path.open(encoding="utf-8", newline="") as f:
            rows = [r for i, r in enumerate(csv.reader(f)) if i == 0 or int(r[0]) <= last_step]
        with self.path.open("w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows(rows)
        self._file = self.path.open("a", encoding="utf-8", newline="")
        self._writer = csv.writer(self._file)

    def close(self) -> None:
        self._file.close()


def build(output_dir: Path, tracking: TrackingConfig, run_config: Mapping[str, Any] | None) -> CsvTracker:
    """roll.core.types.TrackerBuild: called in the driver when the run starts."""
    output_dir.mkdir(parents=True, exist_ok=True)
    return CsvTracker(output_dir / FILE)


SPEC = TrackerSpec(name="csv", build=build, description=f"step,name,value rows in <output_dir>/{FILE}")
