"""Which rows each training step reads, with a position that a checkpoint saves and a resume restores.

The order is a pure function of ``(seed, epoch)``: epoch ``e`` visits every row once in the order of
``random.Random(f"{seed}:{e}").shuffle``. A step takes the next ``batch_rows`` indices, running into the next
epoch when the current one ends (no row is dropped, no short batch). The position ``(epoch, cursor)`` is the
whole state, so a resumed run reads exactly the rows an uninterrupted one would have read.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from roll.core.errors import CheckpointError, DataError


class RowFeeder:
    """Epoch-shuffled batches of ``batch_rows`` indices into ``num_rows`` rows; resumable."""

    def __init__(self, num_rows: int, batch_rows: int, *, seed: int, shuffle: bool = True) -> None:
        if num_rows < 1:
            raise DataError("the training split has no rows left to feed")
        self.num_rows = num_rows
        self.batch_rows = batch_rows
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_indices(self) -> list[int]:
        """The row indices of the next step, advancing the position."""
        out: list[int] = []
        while len(out) < self.batch_rows:
            take = min(self.batch_rows - len(out), self.num_rows - self.cursor)
            out += self._order[self.cursor : self.cursor + take]
            self.cursor += take
            if self.cursor == self.num_rows:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
        return out

    def state(self) -> dict[str, int]:
        """The position, JSON-able; ``num_rows`` lets a resume detect changed data."""
        return {"epoch": self.epoch, "cursor": self.cursor, "num_rows": self.num_rows}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position; refuses one taken over a different number of rows."""
        if int(state["num_rows"]) != self.num_rows:
            raise CheckpointError(
                f"the checkpoint's data position was taken over {state['num_rows']} training rows, but the data "
                f"now has {self.num_rows}; resume with the same data config or start a new output_dir"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)
