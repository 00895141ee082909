"""The few closing lines of a finished run, and the duration format the progress line and they share.

``roll train`` ends with (each line under :data:`LINE_LIMIT` characters unless a path alone is longer)::

    roll: done: rlvr, 120 of 120 steps in 6m12s (2.1 s/step)
    roll: last step: reward/mean 0.73 | reward/accuracy 0.73 | actor/loss 0.0012
    roll: eval/accuracy 0.58 at step 120, best 0.67 at step 100
    roll: run dir /abs/outputs/quickstart
    roll:   metrics.jsonl  samples.jsonl  config.yaml  tensorboard/  checkpoints/step_000120/  plot.png

The wall time counts from the start of ``run`` (start-up included); the rate is the mean ``time/step_s`` (the
steps alone). The metrics shown are the first of ``tracking.stdout_metrics`` (in the order given) that the run reported; the
headline evaluation metric is the first ``eval/...`` one of them, its best the highest (the lowest for a loss).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LINE_LIMIT = 120
LAST_METRICS = 3
"""Metrics of the last step the closing lines show."""
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "config.yaml", "tensorboard", "mlruns", "swanlog", "hf")


def format_duration(seconds: float) -> str:
    """``45s``, ``6m12s``, ``2h03m``: whole seconds under an hour, minutes above (``"?"`` when unknown)."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def pick_metrics(metrics: Mapping[str, float], patterns: Sequence[str], limit: int) -> list[str]:
    """Up to ``limit`` names of ``metrics`` matching ``patterns``, in pattern order (then name order)."""
    picked: list[str] = []
    for pattern in patterns:
        picked += [k for k in sorted(metrics) if fnmatch.fnmatchcase(k, pattern) and k not in picked]
    return picked[:limit]


class RunSummary:
    """Collects what the closing lines need while a run goes: its start, its evaluations."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self.first_step = 0
        self.evals: list[tuple[int, dict[str, float]]] = []
        self.step_times: list[float] = []
        self._started = time.monotonic()

    def start(self, step: int) -> None:
        """The run (this process's part of it) starts at completed step ``step``."""
        self.first_step = step
        self._started = time.monotonic()

    def observe_step(self, seconds: float) -> None:
        self.step_times.append(seconds)

    def observe_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self.evals.append((step, dict(metrics)))

    def lines(
        self,
        *,
        name: str,
        step: int,
        max_steps: int,
        last: Mapping[str, float],
        output_dir: Path,
        checkpoint: Path | None,
    ) -> list[str]:
        """The closing lines (see the module docstring)."""
        wall = time.monotonic() - self._started
        trained = step - self.first_step
        times = self.step_times
        rate = f" ({sum(times) / len(times):.3g} s/step)" if times else ""
        resumed = f" ({trained} in this run, from step {self.first_step})" if self.first_step else ""
        out = [f"roll: done: {name}, {step} of {max_steps} steps{resumed} in {format_duration(wall)}{rate}"]
        shown = [k for k in pick_metrics(last, self.patterns, LAST_METRICS + 2) if not k.startswith("eval/")]
        if shown:
            out.append("roll: last step: " + " | ".join(f"{k} {last[k]:.4g}" for k in shown[:LAST_METRICS]))
        out += self._eval_line()
        out.append(f"roll: run dir {output_dir.resolve()}")
        out += _files_lines(output_dir, checkpoint)
        return out

    def _eval_line(self) -> list[str]:
        if not self.evals:
            return []
        names = {k for _, metrics in self.evals for k in metrics}
        head = (pick_metrics(dict.fromkeys(names, 0.0), self.patterns, 1) or sorted(names))[0]
        seen = [(step, metrics[head]) for step, metrics in self.evals if head in metrics]
        last_step, last_value = seen[-1]
        lower = "loss" in head
        best_step, best_value = (min if lower else max)(seen, key=lambda sv: sv[1])
        line = f"roll: {head} {last_value:.4g} at step {last_step}"
        if len(seen) > 1 and best_step == last_step:
            return [f"{line}, the best of {len(seen)} evaluations"]
        return [line + (f", best {best_value:.4g} at step {best_step}" if len(seen) > 1 else "")]


def _files_lines(output_dir: Path, checkpoint: Path | None) -> list[str]:
    """What the run dir holds, relative to it; a checkpoint outside it on its own line, absolute."""
    names = [f"{n}/" if (output_dir / n).is_dir() else n for n in RUN_FILES if (output_dir / n).exists()]
    outside = None
    if checkpoint is not None:
        try:
            names.append(f"{checkpoint.resolve().relative_to(output_dir.resolve())}/")
        except ValueError:
            outside = f"roll: checkpoint {checkpoint.resolve()}"
    names += [p.name for p in sorted(output_dir.glob("*.png"))]
    lines: list[str] = []
    line = "roll: "
    for name in names:
        if len(line) + 2 + len(name) >= LINE_LIMIT and line.strip() != "roll:":
            lines.append(line.rstrip())
            line = "roll: "
        line += f"  {name}"
    if line.strip() != "roll:":
        lines.append(line.rstrip())
    return lines + ([outside] if outside else [])


__all__ = ["LINE_LIMIT", "RunSummary", "format_duration", "pick_metrics"]
