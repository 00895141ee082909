"""A PNG of reward and accuracy per step, from a run's ``metrics.jsonl`` (matplotlib, headless).

``python -m roll.pipelines.rlvr.plot outputs/quickstart`` redraws it for any finished or running run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SERIES = (
    ("reward/mean", "reward (train)"),
    ("reward/accuracy", "accuracy (train)"),
    ("eval/accuracy", "accuracy (eval)"),
)


def read_metrics(path: Path) -> list[dict[str, object]]:
    """Rows of a jsonl tracker file (``step`` plus metrics); blank or broken lines are skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _flat(row: dict[str, object]) -> dict[str, Any]:
    inner = row.get("metrics")
    return {**row, **inner} if isinstance(inner, dict) else row


def plot_run(output_dir: Path, out: Path | None = None) -> Path:
    """Draw reward and accuracy per step from ``output_dir/metrics.jsonl`` into ``plot.png``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [_flat(r) for r in read_metrics(output_dir / "metrics.jsonl")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in SERIES:
        points = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"rlvr: {output_dir.name}")
    target = out or output_dir / "plot.png"
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


if __name__ == "__main__":
    print(plot_run(Path(sys.argv[1])))
