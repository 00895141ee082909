"""One-step-ahead generation: the next step's rollout is made while this step trains.

The rollout of step ``t + 1`` starts right after step ``t``'s rollout is taken, on the weights step ``t`` started
with, and the weight sync at the end of step ``t`` waits for it, so every rollout comes from one policy version and
is exactly one update stale when trained on (verl's "one step off-policy", ROLL's async ratio 1). Generation and
training overlap on separate workers, and, unlike a free-running generator, the run stays reproducible: what is
generated does not depend on timing. A checkpoint holds the pending rollout, so a resumed run trains on what the
uninterrupted one would have.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

R = TypeVar("R")
PENDING_FILE = "next_rollout.pkl"


class StepAhead(Generic[R]):
    """``take(step)`` the rollout of ``step`` (prefetched, restored, or made now by ``make``); ``start(step)``
    the next one in a background thread; ``wait()`` before the weights change."""

    def __init__(self, make: Callable[[int], R], *, enabled: bool) -> None:
        self.make, self.enabled = make, enabled
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="roll-step-ahead")
        self._pending: Future[R] | None = None
        self._restored: R | None = None

    def take(self, step: int) -> R:
        pending, self._pending = self._pending, None
        if pending is not None:
            return pending.result()
        restored, self._restored = self._restored, None
        return restored if restored is not None else self.make(step)

    def start(self, step: int) -> None:
        """Begin the rollout of ``step`` (when enabled) on the weights the workers serve now."""
        if self.enabled:
            self._pending = self._executor.submit(self.make, step)

    def wait(self) -> None:
        """Block until the pending rollout is complete (call before a weight sync)."""
        if self._pending is not None:
            self._pending.result()

    def save(self, directory: Path) -> None:
        if self._pending is not None:
            directory.mkdir(parents=True, exist_ok=True)
            with (directory / PENDING_FILE).open("wb") as f:
                pickle.dump(self._pending.result(), f)

    def load(self, directory: Path) -> None:
        if (directory / PENDING_FILE).exists():
            with (directory / PENDING_FILE).open("rb") as f:
                self._restored = pickle.load(f)  # written by save() of the same pipeline

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
