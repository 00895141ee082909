"""Step-keyed JSON-lines files (``metrics.jsonl``, ``samples.jsonl``): one record per line, each with an integer
``step``. A restart from a checkpoint rewinds them to its step (:func:`rewind_jsonl`), so the steps that run again
are not written twice. Imported by the trackers and the sample writer alike; imports nothing of roll.
"""

from __future__ import annotations

import json
from pathlib import Path


def rewind_jsonl(path: Path, last_step: int) -> int:
    """Drop the records of ``path`` (a :class:`JsonlTracker` file) past ``last_step``, and a torn last line that
    a killed run left; returns how many lines were dropped. Rewritten through a temp file and a rename, so a
    crash leaves the old file or the new one. A missing file is nothing to rewind (0)."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if (step := _step_of(line)) is not None and step <= last_step]
    if len(kept) == len(lines):
        return 0
    temp = path.with_name(f".{path.name}.rewind")
    temp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    temp.replace(path)
    return len(lines) - len(kept)


def _step_of(line: str) -> int | None:
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None
