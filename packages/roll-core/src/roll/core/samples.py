"""A few samples of a step, for a person to read: ``<output_dir>/samples.jsonl`` and each tracker's text form.

Every ``tracking.log_samples_every`` steps (and at step 1, so a run shows what its model does before it learned
anything), a mode hands :class:`SampleLog` a few rows of the step; evaluation hands it a few of its greedy answers
(``kind: "eval"``) each time it runs. A row is a flat JSON object; the fields a mode can fill:

- ``step`` (the step the metrics of the same number belong to), ``kind`` (``"train"`` or ``"eval"``);
- ``prompt``, ``response``, ``ground_truth``, ``tag`` (the reward domain or env), ``finish_reason``;
- ``reward`` (what the advantages saw, after shaping), ``score`` (the reward function's own value), ``correct``,
  ``answer`` (the final answer the reward extracted), ``reward_error``; agentic rows ``episode_return`` and
  ``success``.

Texts longer than :data:`TEXT_LIMIT` characters keep their head and tail around a ``[... N chars ...]`` marker, so
one runaway response cannot fill a disk or a dashboard. The rows are picked by :func:`spread`: evenly over the
batch, so with ``G`` samples per prompt they show different prompts instead of one prompt's group.

The file is appended to and rewound with ``metrics.jsonl`` (a resumed run keeps each step once); trackers receive
``log_samples(rows, step, kind)`` when they have that method (:class:`roll.core.tracking.MultiTracker`), which
TensorBoard writes as a markdown table and wandb, MLflow, SwanLab and Trackio as their table or text form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from roll.core import columns as C
from roll.core.errors import DataError
from roll.core.jsonl import rewind_jsonl

if TYPE_CHECKING:
    from roll.core.batch import Batch
    from roll.core.types import Tracker

SAMPLES_FILE = "samples.jsonl"
TEXT_LIMIT = 2000
"""Characters of one text field kept in a sample row (head and tail)."""

SampleRow = dict[str, Any]

BATCH_FIELDS: tuple[tuple[str, str], ...] = (
    ("prompt", C.PROMPT),
    ("response", C.TEXT),
    ("ground_truth", C.GROUND_TRUTH),
    ("tag", C.TAG),
    ("finish_reason", C.FINISH_REASON),
    ("reward", C.REWARDS),
    ("score", C.SCORES),
    ("correct", C.CORRECT),
    ("answer", C.REWARD_ANSWER),
    ("reward_error", C.REWARD_ERROR),
    ("episode_return", C.EPISODE_RETURN),
    ("success", C.SUCCESS),
)
"""Sample field <- batch column, for the columns a batch has (:func:`batch_samples`)."""


def spread(n: int, count: int) -> list[int]:
    """``count`` row indices spread evenly over ``range(n)``: ``i * n // count`` (all rows when ``count >= n``).

    ``spread(256, 4) == [0, 64, 128, 192]``: with groups of 8 samples per prompt, four different prompts."""
    if count >= n:
        return list(range(n))
    return [i * n // count for i in range(count)]


def clip_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its head and tail around a marker."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}[... {len(text) - 2 * keep} chars ...]{text[-keep:]}"


def plain(value: Any) -> Any:
    """A JSON-able form of one cell: tensors and numpy scalars as Python numbers, texts clipped, NaN as None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        return clip_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return clip_text(str(value))


def batch_samples(batch: Batch, count: int, rows: Sequence[int] | None = None) -> list[SampleRow]:
    """Sample rows of ``batch`` (the columns of :data:`BATCH_FIELDS` it has), at ``rows`` or
    :func:`spread` rows; the response's ``text`` column is the decoded response."""
    picked = list(rows) if rows is not None else spread(len(batch), count)
    present = [(field, column) for field, column in BATCH_FIELDS if column in batch]
    return [{field: plain(batch[column][i]) for field, column in present} for i in picked]


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The union of the rows' fields, in first-seen order: the columns of a samples table."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    return columns


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as one markdown table (:func:`table_columns`); pipes and newlines in cells are escaped so each
    row stays one table row."""
    fields = table_columns(rows)
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(_cell(row.get(key)) for key in fields) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


class SampleLog:
    """Writes sample rows to ``<output_dir>/samples.jsonl`` and to every tracker's ``log_samples``.

    ``every`` 0 turns sample logging off (:meth:`due` is then always False and :meth:`log` does nothing);
    ``count`` is how many rows a mode hands over per call (:meth:`pick`). The file opens on the first write, so
    a run that logs no samples leaves none.
    """

    def __init__(self, output_dir: Path, tracker: Tracker, *, every: int, count: int) -> None:
        self.path = output_dir / SAMPLES_FILE
        self.tracker = tracker
        self.every = every
        self.count = count
        self._file: TextIO | None = None

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def due(self, step: int) -> bool:
        """Whether training step ``step`` (1-based, as metrics count it) logs samples: step 1 and every
        ``every``-th."""
        return self.enabled and (step == 1 or step % self.every == 0)

    def pick(self, batch: Batch) -> list[SampleRow]:
        """:func:`batch_samples` of ``batch``, ``count`` of them."""
        return batch_samples(batch, self.count)

    def log(self, rows: Sequence[Mapping[str, Any]], step: int, kind: str = "train") -> None:
        """One JSON line per row (``{"step", "kind", **row}``, flushed), then the trackers' ``log_samples``."""
        if not self.enabled or not rows:
            return
        records = [{"step": step, "kind": kind, **{k: plain(v) for k, v in row.items()}} for row in rows]
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write("".join(json.dumps(record) + "\n" for record in records))
        self._file.flush()
        log_samples = getattr(self.tracker, "log_samples", None)
        if log_samples is not None:
            log_samples(records, step, kind)

    def rewind(self, last_step: int) -> None:
        """Drop the rows past ``last_step`` (a restart continues from that checkpoint)."""
        self.close()
        rewind_jsonl(self.path, last_step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_samples(path: Path) -> list[SampleRow]:
    """The rows of a ``samples.jsonl`` file (tests and notebooks)."""
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    except ValueError as err:
        raise DataError(f"{path} is not a samples file: {err}") from err


__all__ = [
    "SAMPLES_FILE",
    "TEXT_LIMIT",
    "SampleLog",
    "SampleRow",
    "batch_samples",
    "clip_text",
    "markdown_table",
    "read_samples",
    "spread",
    "table_columns",
]
