"""Pre-flight peeks at data sources: open the first rows of each source and check the fields a run maps.

Used by pipelines' ``preflight`` hooks (``roll validate``, and ``roll train`` before Ray starts), so a missing
column or an unreadable file is reported in a second, with the config key path of the source, instead of after
actor start-up. A peek loads each source as the run will (streaming only when ``data.streaming``), so what it
converts or downloads is the cache the run then reuses; it keeps ``rows`` rows. In-memory loading also keeps
``roll validate`` from importing torch, which ``datasets``' streaming mode does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roll.core.errors import ConfigIssue, DataError
from roll.data.config import DataConfig, DatasetSourceConfig
from roll.data.loading import load_source
from roll.data.tokenize import REQUIRED, Kind

PEEK_ROWS = 8


@dataclass
class Peek:
    """What the first rows of one source showed: where it is in the config, its columns, its rows."""

    where: str
    source: DatasetSourceConfig
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


def peek_source(
    src: DatasetSourceConfig, *, rows: int = PEEK_ROWS, seed: int = 42, streaming: bool = False
) -> list[dict[str, Any]]:
    """The first ``rows`` rows of ``src`` with canonical column names (raises :class:`DataError`)."""
    n = min(rows, src.max_samples) if src.max_samples is not None else rows
    head = load_source(src.model_copy(update={"max_samples": n}), streaming=streaming, seed=seed)
    return [dict(row) for row in head.take(n)]


def peek_data(
    data: DataConfig, *, kind: Kind, where: str, rows: int = PEEK_ROWS
) -> tuple[list[Peek], list[ConfigIssue]]:
    """Peek at every source of ``data`` (training and eval); issues for unreadable sources and missing fields.

    ``where`` is the config key of ``data`` (``data``, ``warmup.data``); issues name ``<where>.sources.<i>``.
    """
    peeks: list[Peek] = []
    issues: list[ConfigIssue] = []
    listed = [("sources", s) for s in data.sources] + [("eval_sources", s) for s in data.eval_sources]
    counters = {"sources": 0, "eval_sources": 0}
    for group, src in listed:
        key = f"{where}.{group}.{counters[group]}"
        counters[group] += 1
        try:
            head = peek_source(src, rows=rows, seed=data.seed, streaming=data.streaming)
        except DataError as exc:
            issues.append(ConfigIssue(f"{key}.path", str(exc), _hint(exc)))
            continue
        columns = list(dict.fromkeys(c for row in head for c in row))
        peeks.append(Peek(key, src, columns, head))
        issues += field_issues(columns, REQUIRED[kind], where=key, kind=kind)
    return peeks, issues


def field_issues(
    columns: Sequence[str], alternatives: Sequence[Sequence[str]], *, where: str, kind: str
) -> list[ConfigIssue]:
    """One issue when no alternative's fields are all present (e.g. ``prompt`` or ``messages`` for RL)."""
    if any(all(c in columns for c in option) for option in alternatives):
        return []
    needs = " or ".join("+".join(option) for option in alternatives)
    missing = [c for c in alternatives[0] if c not in columns]
    hint = ", ".join(f"fields.{c}: <your column>" for c in missing)
    message = f"{kind} rows need fields {needs}; the first rows have {list(columns)}"
    return [ConfigIssue(f"{where}.fields", message, f"map your columns: {hint}")]


def _hint(exc: DataError) -> str | None:
    text = str(exc)
    if "names a column that does not exist" in text:
        return "fix the column name in `fields:` (the columns found are listed above)"
    return None
