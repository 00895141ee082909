"""Build-once folders under the user's cache dir, safe for parallel processes.

A cached artefact (a tokenizer, a tiny model) lives in ``<cache>/<kind>/<name>-<hash of its recipe>``, so a new
recipe never reads an old folder. :func:`build_once` builds into a temporary sibling and renames it into place:
readers never see half-written folders, and a file lock makes concurrent pytest workers wait for one builder
instead of all building.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

CACHE_ENV = "ROLL_CACHE_DIR"


def cache_root() -> Path:
    """``$ROLL_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/roll``, else ``~/.cache/roll``."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "roll"


def recipe_hash(recipe: Any) -> str:
    """A short stable hash of a JSON-able recipe (key order does not matter)."""
    blob = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, first calling ``build(tmp_dir)`` and renaming ``tmp_dir`` to it if it does not exist.

    ``build`` writes into an empty directory on the same filesystem; a failure leaves no trace at ``target``.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_dir():  # another process built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
